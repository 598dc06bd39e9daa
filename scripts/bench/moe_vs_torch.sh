#!/usr/bin/env bash
# tiermoe bench moe-layer beside the PyTorch Hugging Face-style loop
# (scripts/bench/torch_moe_layer.py, Debian's python3-torch), same shapes,
# threads and routing skew, in one run; prints tokens/s and the ratio.
# Usage: scripts/bench/moe_vs_torch.sh [TOKENS] [DTYPE] [MODES...]
set -euo pipefail
cd "$(dirname "$0")/../.."
tokens=${1:-4096}
dtype=${2:-bf16}
shift 2 || true
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(fwd lora full)
# Debian's torch takes its f32 GEMM from the system BLAS: with the reference
# libblas it runs at ~3 GFLOP/s, so install OpenBLAS (libopenblas0-pthread)
# for a fair baseline. Its threads and torch's must not oversubscribe.
export OMP_WAIT_POLICY=passive  # torch on 2 threads is slower than 1 without it (measured)
threads=$(nproc)
export OPENBLAS_NUM_THREADS=$threads

printf '%-6s %-5s %6s %14s %14s %8s\n' mode dtype tokens tiermoe_tok/s torch_tok/s ratio
for mode in "${modes[@]}"; do
  ours=$(build/tiermoe bench moe-layer --preset qwen3-30b-a3b --tokens "$tokens" --dtype "$dtype" \
           --mode "$mode" --threads "$threads" --iters 2 --warmup 1 --json 2>/dev/null | tail -n 1)
  theirs=$(/usr/bin/python3 scripts/bench/torch_moe_layer.py --tokens "$tokens" --dtype "$dtype" \
             --mode "$mode" --threads "$threads" --iters 2 --warmup 1 | tail -n 1)
  /usr/bin/python3 - "$mode" "$dtype" "$tokens" "$ours" "$theirs" <<'PY'
import json, sys
mode, dtype, tokens, ours, theirs = sys.argv[1:]
a, b = json.loads(ours)["tokens_per_s"], json.loads(theirs)["tokens_per_s"]
print(f"{mode:<6} {dtype:<5} {tokens:>6} {a:14.1f} {b:14.1f} {a / b:7.2f}x")
PY
done
