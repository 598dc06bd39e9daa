#!/usr/bin/env bash
# One MoE layer at Qwen3-30B-A3B shapes with and without expert parallelism,
# in one run, interleaved: `tiermoe bench moe-layer` on one process with
# every core, then under `mpirun -np 2 ... --ep 2` (one core each, experts
# split in halves) with the same global batch (TOKENS/2 per rank) and with
# TOKENS per rank. Prints tokens/s (all ranks' tokens over the slowest
# rank's time), the ratio to one process, and rank 0's all-to-all bytes and
# seconds per iteration (forward and backward).
# Usage: scripts/bench/ep_moe_layer.sh [TOKENS] [DTYPE] [MODE] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
tokens=${1:-4096}
dtype=${2:-bf16}
mode=${3:-full}
rounds=${4:-2}
threads=$(nproc)
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader)
common=(bench moe-layer --preset qwen3-30b-a3b --dtype "$dtype" --mode "$mode" --iters 3 --warmup 1
        --json)

run() {  # label, command...
  local label=$1
  shift
  local out
  out=$("$@" 2>/dev/null | tail -n 1)
  /usr/bin/python3 - "$label" "$out" <<'PY'
import json, sys
label, out = sys.argv[1:]
j = json.loads(out)
print(f"{label:<34} {j['tokens'] * j['ranks']:>6} {j['tokens_per_s']:10.1f} {j['seconds']:8.2f}"
      f" {j['alltoall_bytes'] / 2**20:10.1f} {j['alltoall_s']:8.3f}", flush=True)
PY
}

printf '%-34s %6s %10s %8s %10s %8s\n' run tokens tokens/s iter_s a2a_MiB a2a_s
for ((r = 0; r < rounds; ++r)); do
  run "np 1, $threads threads" build/tiermoe "${common[@]}" --tokens "$tokens" --threads "$threads"
  run "np 2, $((tokens / 2)) tokens/rank, 1 thread" "${mpirun[@]}" -np 2 build/tiermoe \
    "${common[@]}" --tokens $((tokens / 2)) --threads 1 --ep 2
  run "np 2, $tokens tokens/rank, 1 thread" "${mpirun[@]}" -np 2 build/tiermoe \
    "${common[@]}" --tokens "$tokens" --threads 1 --ep 2
done
