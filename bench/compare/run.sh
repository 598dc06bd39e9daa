#!/usr/bin/env bash
# One MoE layer at Qwen3-30B-A3B shapes (E 128, K 8, D 2048, F 768), T tokens,
# bf16, on THREADS threads, uniform routing, every system in the same run and
# interleaved mode by mode: TierMoE on its grouped kernels, TierMoE with one
# GEMM per expert on the same ISA (--per-expert), TierMoE on oneDNN's matmul
# (--isa onednn, the path before TierMoE's own GEMM), the Hugging Face-style
# PyTorch expert loop (also in f32 on a CPU without bf16 arithmetic, where
# that is PyTorch's fast dtype), and kt-kernel's BF16 MoE operator (forward;
# its BF16 backward exists on AMX only).
# Prints one table of tokens/s (fwd / lora = forward + dx / full = + dW).
#
# Makes its own venv (bench/compare/venv.sh: torch 2.x, from PyTorch's CPU
# index or else PyPI, and kt-kernel 0.7.x from PyPI) on first use; not part
# of make test. Needs build/tiermoe (or
# TIERMOE=path).
# Usage: bench/compare/run.sh [TOKENS] [THREADS] [ITERS]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
tokens=${1:-4096}
threads=${2:-2}
iters=${3:-2}
tiermoe="${TIERMOE:-$root/build/tiermoe}"
[ -x "$tiermoe" ] || { echo "error: $tiermoe not built (make build)" >&2; exit 1; }

source "$here/venv.sh"
compare_venv
# kt-kernel's wheel carries AMX, AVX-512 and AVX2 variants and loads the one
# this CPU runs. Installed without its pinned torch (kt_kernel_ext does not
# link torch, and the pin would pull in a second CUDA torch); what its import
# needs besides torch is numpy, safetensors and gguf.
if ! "$py" -c 'import kt_kernel' 2>/dev/null; then
  "$venv/bin/pip" install --quiet --no-deps 'kt-kernel>=0.7,<0.8' &&
    "$venv/bin/pip" install --quiet numpy safetensors gguf || echo "kt-kernel did not install" >&2
fi
# The PyTorch baseline: the venv's torch, else the system python's (Debian's
# python3-torch), named in the table.
torch_py="$py"
if ! "$py" -c 'import torch' 2>/dev/null && /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  torch_py=/usr/bin/python3
fi
export OMP_WAIT_POLICY=passive  # torch on 2 threads is slower than 1 without it (measured)

log="$(mktemp -d)"
trap 'rm -rf "$log"' EXIT
# Whether the CPU has bf16 arithmetic (AMX or AVX-512 BF16).
bf16_cpu=false
if grep -qwE 'amx_bf16|avx512_bf16' /proc/cpuinfo; then bf16_cpu=true; fi
run() { compare_run "$log" "$@"; }
echo "uptime: $(uptime)" >&2
for mode in fwd lora full; do
  common=(--preset qwen3-30b-a3b --tokens "$tokens" --dtype bf16 --mode "$mode" --threads "$threads"
          --zipf 0 --iters "$iters" --warmup 1 --json)
  torch_args=(--tokens "$tokens" --mode "$mode" --threads "$threads" --zipf 0 --iters "$iters"
              --warmup 1)
  run "tiermoe_$mode" "$tiermoe" bench moe-layer "${common[@]}"
  run "perexpert_$mode" "$tiermoe" bench moe-layer "${common[@]}" --per-expert
  run "onednn_$mode" "$tiermoe" bench moe-layer "${common[@]}" --isa onednn
  if [ "$mode" != fwd ] && [ "${TORCH_BF16:-}" != all ] && ! $bf16_cpu; then
    # Measured on a 2-core AVX2 machine: over 5 minutes per LoRA iteration.
    echo "{\"not_run\": \"PyTorch's bf16 backward on a CPU without bf16 arithmetic takes minutes an iteration (TORCH_BF16=all runs it)\"}" \
      >"$log/torch_$mode.json"
  else
    run "torch_$mode" "$torch_py" "$root/scripts/bench/torch_moe_layer.py" --dtype bf16 \
      "${torch_args[@]}"
  fi
  # PyTorch's own best dtype where the CPU has no bf16 arithmetic (AVX2):
  # its bf16 matmuls there run a slow fallback, f32 runs oneDNN/MKL.
  if ! $bf16_cpu; then
    run "torchf32_$mode" "$torch_py" "$root/scripts/bench/torch_moe_layer.py" --dtype f32 \
      "${torch_args[@]}"
  fi
  run "kt_$mode" "$py" "$here/kt_moe_layer.py" --tokens "$tokens" --mode "$mode" --threads "$threads"
done
"$py" "$here/table.py" "$log" "$tokens" "$threads"
