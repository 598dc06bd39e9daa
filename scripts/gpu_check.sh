#!/usr/bin/env bash
# The CUDA backend's whole check on a GPU machine, in one call (sized for about
# 10 minutes on a 16-core host with one H200):
#   1 deps      missing Debian packages: scripts/install_deps.sh, or, on a machine
#               that cannot reach a registry, the .deb files in .gpu-debs/
#               (scripts/gpu_debs.sh fetches them beforehand) unpacked into a
#               private prefix, the system left alone
#   2 build     configure with -DTIERMOE_CUDA=ON, build with all cores (timed)
#   3 tests     ctest -L cuda; on a GPU no GPU test may skip
#   4 measure   Qwen3-30B-A3B expert shapes (init --preset qwen3-30b-a3b --layers 4
#               --vocab-size 4096), T = 4096 tokens a step, LoRA and full: a run
#               with --device cuda --placement host (the baseline, which also
#               records the routing profile), then --placement auto at two
#               --device-memory budgets, each placed from that profile; and
#               tiermoe plan's prediction from the same profile and the rates
#               the run measured
#   5 summary   summary.md and summary.json (hot fraction, step time, time
#               split, bytes moved, prediction beside measurement)
# $OUT (when set; else build-gpu/gpu_check/) gets five files, as the device
# tool brings back at most eight: summary.md, summary.json, gpu_check.log,
# ctest_cuda.log and runs.tar.gz (every run's JSON, metrics and logs). It
# stops at the first broken stage and says which.
#
# On a GPU machine lent by the device tool (no registry there):
#   here:  scripts/gpu_debs.sh                      # .gpu-debs/, about 8 MB
#   there: scripts/gpu_check.sh                     # carry: [".gpu-debs"]
# Without a GPU, --rehearse runs every stage that needs none: the build with
# CUDA ON, the cuda tests (the GPU ones skip, saying why), a check that
# --device cuda is refused clearly, and stages 4-5 on --device cpu with the
# tiny preset.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

rehearse=0
case "${1:-}" in
  --rehearse) rehearse=1 ;;
  "") ;;
  *) echo "usage: scripts/gpu_check.sh [--rehearse]" >&2; exit 2 ;;
esac

out=${OUT:-$root/build-gpu/gpu_check}
build=${GPU_CHECK_BUILD:-$root/build-gpu}
work=${GPU_CHECK_WORK:-$build/gpu_check_work}
mkdir -p "$out" "$work"
log=$out/gpu_check.log
: >"$log"
stage=start
say() { echo "gpu_check: $*" | tee -a "$log" >&2; }
trap 'say "FAILED at stage: $stage (see $log)"' ERR
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# ---- 1 deps ----------------------------------------------------------------
stage=deps
for tool in g++ cmake ninja python3; do
  command -v "$tool" >/dev/null || { say "missing tool: $tool"; false; }
done
prefix_args=()
if [ -d .gpu-debs ] && compgen -G ".gpu-debs/*.deb" >/dev/null; then
  prefix=$work/deps
  rm -rf "$prefix"
  mkdir -p "$prefix"
  for deb in .gpu-debs/*.deb; do dpkg-deb -x "$deb" "$prefix"; done
  libdir=$prefix/usr/lib/$(gcc -print-multiarch)
  export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  prefix_args=(-DCMAKE_PREFIX_PATH="$prefix/usr")
  debs=(.gpu-debs/*.deb)
  say "deps: ${#debs[@]} packages from .gpu-debs unpacked into $prefix"
else
  scripts/install_deps.sh
  say "deps: scripts/install_deps.sh done"
fi
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$nvcc" ] || { say "no nvcc: the CUDA toolkit is needed to build the backend"; false; }
say "nvcc: $("$nvcc" --version | tail -1)"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$log"
fi

# ---- 2 build ---------------------------------------------------------------
stage=build
t0=$(now)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTIERMOE_CUDA=ON \
  -DCMAKE_CUDA_COMPILER="$nvcc" "${prefix_args[@]}" >>"$log" 2>&1
configure_s=$(since "$t0")
t0=$(now)
cmake --build "$build" -j "$(nproc)" >>"$log" 2>&1
build_s=$(since "$t0")
say "build: configure ${configure_s} s, build ${build_s} s on $(nproc) cores"
tiermoe=$build/tiermoe

# ---- 3 tests ---------------------------------------------------------------
stage=tests
t0=$(now)
(cd "$build" && ctest -L cuda --output-on-failure -j 4) >"$out/ctest_cuda.log" 2>&1 || {
  tail -40 "$out/ctest_cuda.log" >&2
  false
}
tests_s=$(since "$t0")
tests_line=$(grep -E "tests passed|tests failed" "$out/ctest_cuda.log" | tail -1)
# With a GPU only the two checks of the no-GPU error may skip.
skipped=$(grep -F '***Skipped' "$out/ctest_cuda.log" | grep -vE 'WithoutAGpu' || true)
if [ "$rehearse" = 0 ] && [ -n "$skipped" ]; then
  say "GPU tests skipped on a GPU machine:"
  echo "$skipped" | tee -a "$log" >&2
  false
fi
say "tests: $tests_line (${tests_s} s; $(grep -cF '***Skipped' "$out/ctest_cuda.log" || true) skipped)"

# ---- 4 measure -------------------------------------------------------------
stage=measure
if [ "$rehearse" = 1 ]; then
  # No GPU here: --device cuda must be a clear error naming the flag...
  if "$tiermoe" train --preset tiny --full --steps 1 --device cuda --device-memory 64MiB \
      >"$work/refused.out" 2>"$work/refused.err"; then
    say "--device cuda ran without a GPU"
    false
  fi
  grep -q -- "--device cuda" "$work/refused.err"
  say "rehearse: --device cuda refused: $(grep -m1 '^error' "$work/refused.err")"
  # ... and the measuring stages run on the CPU device at tiny shapes, in f32
  # (a CPU without AVX-512 has no oneDNN bf16 GEMM).
  device=cpu dtype=f32
  model_args=(--preset tiny)
  batch=4 seq=64 steps=3
  lora_budgets=(2MiB 8MiB) full_budgets=(4MiB 16MiB)
else
  device=cuda dtype=bf16
  model_args=(--preset qwen3-30b-a3b --layers 4 --vocab-size 4096)
  batch=4 seq=1024 steps=4
  # Every expert of 4 layers: 4.6 GiB of bf16 weights (LoRA), 13.9 GiB with
  # the f32 gradient sums (full); the smaller budgets hold about a third.
  lora_budgets=(1536MiB 6GiB) full_budgets=(5GiB 16GiB)
fi
model=$work/model
t0=$(now)
rm -rf "$model"
"$tiermoe" init "${model_args[@]}" --out "$model" >>"$log" 2>&1
say "measure: model $(du -sh "$model" | cut -f1) written in $(since "$t0") s"
runs=$work/runs
rm -rf "$runs"
mkdir -p "$runs"

# One training run: name, mode (lora|full), placement, budget. Its --json
# summary and per-step metrics go to runs/NAME.json and runs/NAME.jsonl.
train_run() {
  local name=$1 mode=$2 placement=$3 budget=$4
  local args=(train --model "$model" --steps "$steps" --batch "$batch" --seq-len "$seq" --dtype "$dtype"
    --lr 1e-5 --json --metrics "$runs/$name.jsonl" --device "$device" --device-memory "$budget"
    --placement "$placement")
  if [ "$mode" = full ]; then args+=(--full); else args+=(--lora-rank 8); fi
  if [ "$placement" = host ]; then
    args+=(--profile-out "$runs/$mode.profile.json")
  else
    args+=(--profile-in "$runs/$mode.profile.json")
  fi
  local t
  t=$(now)
  "$tiermoe" "${args[@]}" >"$runs/$name.out" 2>"$runs/$name.err" || {
    tail -20 "$runs/$name.err" >&2
    return 1
  }
  tail -1 "$runs/$name.out" >"$runs/$name.json"
  say "run $name: $(since "$t") s"
}

# tiermoe plan's prediction for a run's placement: the same profile, budget
# and the rates the run measured at start-up.
plan_run() {
  local name=$1 mode=$2 budget=$3
  local rates
  rates=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["tier"]["rates"]
print(r["host_flops_per_s"]/1e12, r["device_flops_per_s"]/1e12, r["link_bytes_per_s"]/1e9, r["launch_s"]*1e6)' "$runs/$name.json")
  read -r host_t dev_t link_g launch_u <<<"$rates"
  "$tiermoe" plan --model "$model" --profile "$runs/$mode.profile.json" --device-memory "$budget" \
    --mode "$mode" --dtype "$dtype" --placement auto --host-tflops "$host_t" --device-tflops "$dev_t" \
    --link-gbps "$link_g" --launch-us "$launch_u" --json >"$runs/$name.plan.out" 2>>"$log"
  tail -1 "$runs/$name.plan.out" >"$runs/$name.plan.json"
}

for mode in lora full; do
  if [ "$mode" = lora ]; then budgets=("${lora_budgets[@]}"); else budgets=("${full_budgets[@]}"); fi
  train_run "$mode-host" "$mode" host "${budgets[-1]}"
  for b in "${budgets[@]}"; do
    train_run "$mode-auto-$b" "$mode" auto "$b"
    plan_run "$mode-auto-$b" "$mode" "$b"
  done
done

# ---- 5 summary -------------------------------------------------------------
stage=summary
python3 scripts/gpu_check_summary.py --runs "$runs" --out "$out" --device "$device" \
  --build-s "$build_s" --configure-s "$configure_s" --tests "$tests_line" --tests-s "$tests_s" \
  --tokens $((batch * seq)) --steps "$steps" --rehearse "$rehearse"
tar -czf "$out/runs.tar.gz" -C "$work" runs
cat "$out/summary.md"
stage=finished
say "done: $out/summary.md, $out/summary.json"
