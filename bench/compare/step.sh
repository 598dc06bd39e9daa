#!/usr/bin/env bash
# Whole training steps, every system in the same run: TierMoE (bf16, and f32
# on the bf16 checkpoint as mapped) against transformers + PEFT (torch 2.x,
# sdpa attention, grouped_mm experts; f32, and bf16 where the CPU has bf16
# arithmetic) on the same Qwen3-30B-A3B-shaped checkpoint, with the same
# LoRA config (rank 8, alpha 16, q/k/v/o_proj), AdamW and the same tokens,
# batch 2 x 1024. Full fine-tuning beside LoRA. For each vocabulary given
# (default 4096 and the real 151,936) it prints step seconds, tokens/s, the
# step's FLOPs and TFLOP/s, and each part's share of the multiply-add peak
# measured in the same run (tiermoe bench peak, before and after; the
# higher kept).
#
# Layers: LoRA at vocab 4096 runs 2 decoder layers (the MoE and attention
# dominate), every other case 1 (at 151,936 the LM head is most of the step;
# full fine-tuning of 2 layers needs about 23 GB for TierMoE's fp32 masters
# and AdamW states alone, and more for PyTorch). Checkpoints and token files
# go to build/compare-step/ and are reused.
#
# Needs build/tiermoe (or TIERMOE=path); makes bench/compare/.venv on first
# use (venv.sh). Not part of make test: a run takes 20-40 minutes on 2 cores.
# Usage: bench/compare/step.sh [VOCAB ...]
#   STEPS=3 (timed steps, after one untimed)  MODES="lora full"  THREADS=all
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
tiermoe="${TIERMOE:-$root/build/tiermoe}"
[ -x "$tiermoe" ] || { echo "error: $tiermoe not built (make build)" >&2; exit 1; }
vocabs=("$@")
[ ${#vocabs[@]} -gt 0 ] || vocabs=(4096 151936)
steps=${STEPS:-3}
modes=${MODES:-lora full}
threads=${THREADS:-$(nproc)}
B=2 L=1024

source "$here/venv.sh"
compare_venv_hf
export OMP_WAIT_POLICY=passive  # torch on 2 threads is slower than 1 without it (measured)
work="$root/build/compare-step"
mkdir -p "$work"
log="$work/last-run"
rm -rf "$log" && mkdir -p "$log"
bf16_cpu=false
if grep -qwE 'amx_bf16|avx512_bf16' /proc/cpuinfo; then bf16_cpu=true; fi

run() { compare_run "$log" "$@"; }

echo "uptime: $(uptime)" >&2
for V in "${vocabs[@]}"; do
  for mode in $modes; do
    layers=1
    if [ "$mode" = lora ] && [ "$V" -le 4096 ]; then layers=2; fi
    ckpt="$work/qwen3-30b-a3b-L$layers-V$V"
    if [ ! -f "$ckpt/config.json" ]; then
      "$tiermoe" init --preset qwen3-30b-a3b --layers "$layers" --vocab-size "$V" --dtype bf16 \
        --out "$ckpt" >&2
    fi
    tokens="$work/tokens-V$V.npy"
    if [ ! -f "$tokens" ]; then
      "$py" -c "import numpy as np; np.save('$tokens', np.random.default_rng(0).integers(0, $V, 65537, dtype=np.int32))"
    fi
    case=$V-$mode
    echo "$ckpt" >"$log/$case.ckpt"
    run "peak-$case-before" "$tiermoe" bench peak --threads "$threads" --json
    if [ "$mode" = lora ]; then
      train_mode=(--lora-rank 8 --lora-alpha 16 --lora-targets q_proj,k_proj,v_proj,o_proj)
    else
      train_mode=(--full)
    fi
    tm=("$tiermoe" train --model "$ckpt" --data "$tokens" --seq-len $L --batch $B
        --steps $((steps + 1)) --no-shuffle --lr 1e-4 --lr-schedule constant --warmup-steps 0
        --max-grad-norm 0 --threads "$threads" --json "${train_mode[@]}")
    th=("$py" "$here/torch_step.py" --model "$ckpt" --data "$tokens" --mode "$mode"
        --batch $B --seq-len $L --steps "$steps" --warmup 1 --threads "$threads")
    run "tiermoe-bf16-$case" "${tm[@]}" --dtype bf16 --metrics "$log/tiermoe-bf16-$case.metrics"
    run "torch-f32-$case" "${th[@]}" --dtype f32
    run "tiermoe-f32-$case" "${tm[@]}" --dtype f32 --metrics "$log/tiermoe-f32-$case.metrics"
    if $bf16_cpu || [ "${TORCH_BF16:-}" = all ]; then
      run "torch-bf16-$case" "${th[@]}" --dtype bf16
    fi
    run "peak-$case-after" "$tiermoe" bench peak --threads "$threads" --json
  done
done
"$py" "$here/step_table.py" "$log" "$B" "$L" "${vocabs[@]}"
