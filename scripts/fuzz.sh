#!/usr/bin/env bash
# make fuzz: builds the libFuzzer targets (tests/fuzz/) with clang into
# build-fuzz/ and runs each for FUZZ_SECONDS (default 60), seeded from the
# checked-in corpus tests/fuzz/corpus/<target>/ (read-only: new inputs go to
# build-fuzz/corpus/<target>/, findings to build-fuzz/findings/<target>/).
# A hang (-timeout) or an allocation past -rss_limit_mb / -malloc_limit_mb
# counts as a finding. Prints executions per target at the end; exits 1 when
# any target found something.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-${FUZZ_SECONDS:-60}}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors shard_index config tokens peft profile sft metrics)

if ! command -v clang++ >/dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  echo "fuzz: installing clang and libFuzzer (apt-get)" >&2
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang libclang-rt-dev libomp-dev cmake ninja-build nlohmann-json3-dev
fi

cmake -S tests/fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j "${JOBS:-$(nproc)}"

scratch=$( [ -d /dev/shm ] && echo /dev/shm || echo /tmp )
status=0
summary=()
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/findings/$t"
  log="build-fuzz/fuzz_$t.log"
  : >"$log"
  echo "fuzz: $t for ${seconds}s" >&2
  # libFuzzer stops at a finding: save it and start again from the grown
  # corpus until the time is spent, so a known finding does not end the run.
  runs=0 restarts=0 start=$SECONDS
  while :; do
    left=$(( seconds - (SECONDS - start) ))
    [ "$left" -gt 0 ] || break
    set +e
    TMPDIR=$scratch "build-fuzz/fuzz_$t" -max_total_time="$left" -timeout=10 -rss_limit_mb=2048 \
      -malloc_limit_mb=1024 -max_len=65536 -print_final_stats=1 \
      -artifact_prefix="build-fuzz/findings/$t/" "build-fuzz/corpus/$t" "tests/fuzz/corpus/$t" \
      >"$log.run" 2>&1
    rc=$?
    set -e
    n=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log.run" | grep -o '[0-9]*$' || true)
    # A run that died on a finding prints no final stats: count its last status line.
    [ -n "$n" ] || n=$(grep -oE '^#[0-9]+' "$log.run" | tail -1 | tr -d '#' || true)
    runs=$(( runs + ${n:-0} ))
    { cat "$log.run"; echo "--- run ended rc $rc after ${n:-0} execs"; } >>"$log"
    rm -f "$log.run"
    [ "$rc" -ne 0 ] || break
    restarts=$(( restarts + 1 ))
  done
  rm -rf "$scratch"/tiermoe_fuzz_"$t"_*  # the targets' scratch files
  elapsed=$(( SECONDS - start ))
  rate=$(( elapsed > 0 ? runs / elapsed : 0 ))
  found=$(find "build-fuzz/findings/$t" -type f | wc -l)
  summary+=("$(printf '%-12s %10s execs in %4ss  %6s execs/s  %3s restart(s) on a finding, %s file(s) in build-fuzz/findings/%s' \
    "$t" "$runs" "$elapsed" "$rate" "$restarts" "$found" "$t")")
  if [ "$found" -ne 0 ]; then status=1; fi
done
printf '%s\n' "${summary[@]}"
exit $status
