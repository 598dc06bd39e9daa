#!/usr/bin/env bash
# make report-check: the run report of a short real training run, rendered
# in headless Chromium (Debian's `chromium`) to PNG, light and dark.
#
#   scripts/report_check.sh [BUILD_DIR]      (default: build)
#
# 1. trains the tiny preset for 40 steps with the CPU device tier, metrics,
#    checkpoints every 15 steps and train --report (refreshed at each one);
# 2. asks tiermoe plan --json for a placement of the same model, and builds
#    `tiermoe report RUN --plan PLAN` from both;
# 3. renders it with prefers-color-scheme light and dark to
#    BUILD_DIR/report-check/report-{light,dark}.png and dumps its DOM.
# It fails when train --report left no final page with the load map, on any
# console message (the page logs none, so each is an error; a page that logs
# one first proves this Chromium's log shows them), and on a chart missing
# from the DOM (each is a figure with data-chart; the page's script counts
# those with an SVG into <html data-charts>).
# Chromium is installed with apt-get when missing. Not part of make test.
set -euo pipefail

BUILD=${1:-build}
CLI="$BUILD/tiermoe"
OUT="$BUILD/report-check"
# The charts a tiered run with a plan must have (report/html_report.h).
CHARTS=(loss lr throughput time device tier load-run memory load-plan)

die() {
  echo "report-check: FAIL: $*" >&2
  exit 1
}

if ! command -v chromium >/dev/null 2>&1; then
  echo "report-check: installing chromium (Debian)" >&2
  apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
[[ -x "$CLI" ]] || die "$CLI is not built (make build)"

rm -rf "$OUT"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# A budget that holds the workspace and some of the 16 experts of a layer.
"$CLI" train --preset tiny --steps 40 --batch 8 --seq-len 32 --device cpu --device-memory 1500KB \
  --placement device --out "$OUT/run" --save-every 15 --report "$OUT/train-report.html" \
  --json >"$OUT/train.json" 2>"$OUT/train.log" || {
  cat "$OUT/train.log" >&2
  die "the training run failed"
}
[[ -s "$OUT/run/metrics.jsonl" ]] || die "train --report wrote no $OUT/run/metrics.jsonl"
[[ $(wc -l <"$OUT/run/metrics.jsonl") -eq 40 ]] || die "the metrics do not hold 40 steps"
grep -q 'data-chart="load-run"' "$OUT/train-report.html" || die "train --report has no load map"
grep -q 'http-equiv="refresh"' "$OUT/train-report.html" &&
  die "the final train report still reloads itself (it is marked live)"

"$CLI" plan --preset tiny --profile "$OUT/run/checkpoint-40/routing_profile.json" \
  --device-memory 1500KB --placement device --mode full --dtype f32 --json >"$OUT/plan.json" \
  2>"$OUT/plan.log" || die "tiermoe plan failed (see $OUT/plan.log)"
"$CLI" report "$OUT/run" --plan "$OUT/plan.json" --out "$OUT/report.html" 2>"$OUT/report.log" ||
  die "tiermoe report failed: $(cat "$OUT/report.log")"

# Headless Chromium: no network, console messages on stderr.
browse() {
  local scheme=$1 page=$2
  shift 2
  chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions \
    --hide-scrollbars --enable-logging=stderr --v=0 --proxy-server=127.0.0.1:9 \
    --blink-settings=preferredColorScheme=$([[ $scheme == dark ]] && echo 0 || echo 1) \
    "$@" "file://$page"
}
# Chromium logs every console message (errors and uncaught exceptions too) as
# an INFO:CONSOLE line without its level; the report logs nothing, so any
# console message is taken as an error.
console_errors() { grep -E ':CONSOLE[:(]' "$1" || true; }

# The detector must see an error where there is one.
cat >"$OUT/self-test.html" <<'EOF'
<!DOCTYPE html><html><body><script>console.error("report-check self-test");</script></body></html>
EOF
browse light "$OUT/self-test.html" --dump-dom >/dev/null 2>"$OUT/self-test.log" || true
[[ -n $(console_errors "$OUT/self-test.log") ]] ||
  die "this chromium's log does not show console errors (see $OUT/self-test.log); the check would see none"

for scheme in light dark; do
  png="$OUT/report-$scheme.png"
  browse "$scheme" "$OUT/report.html" --window-size=860,6400 --screenshot="$png" \
    >/dev/null 2>"$OUT/chromium-$scheme.log" || die "chromium failed ($scheme, $OUT/chromium-$scheme.log)"
  [[ -s "$png" ]] || die "no screenshot $png"
  errors=$(console_errors "$OUT/chromium-$scheme.log")
  [[ -z "$errors" ]] || die "console errors ($scheme): $errors"
done
browse light "$OUT/report.html" --dump-dom >"$OUT/report.dom.html" 2>"$OUT/chromium-dom.log" ||
  die "chromium --dump-dom failed"
errors=$(console_errors "$OUT/chromium-dom.log")
[[ -z "$errors" ]] || die "console errors: $errors"
count=$(grep -o 'data-charts="[0-9]*"' "$OUT/report.dom.html" | grep -o '[0-9]*' || true)
[[ "$count" == "${#CHARTS[@]}" ]] ||
  die "the page's script counted ${count:-no} charts with an SVG, expected ${#CHARTS[@]}"
for c in "${CHARTS[@]}"; do
  grep -q "data-chart=\"$c\"" "$OUT/report.dom.html" || die "chart '$c' is missing"
done
echo "report-check: OK: ${#CHARTS[@]} charts, no console errors; look at $OUT/report-light.png and $OUT/report-dark.png"
