#!/usr/bin/env bash
# TierMoE from Python against transformers, in one run on this machine:
#   1. one MoE block at Qwen3-30B-A3B shapes, T = 4096, forward and LoRA
#      backward, under grouped_mm, eager, experts_implementation="tiermoe"
#      and tiermoe.torch.patch, in bf16 and f32 (python_block.py);
#   2. the whole LoRA step (attention LoRA r 8, q/k/v/o, AdamW) of a 2-layer
#      Qwen3-30B-A3B-shape model at vocab 4096, batch 2 x 1024: stock
#      transformers + PEFT (grouped_mm), with "tiermoe", with patch
#      (torch_step.py), and TierMoE's CLI (tiermoe train), in bf16; then with
#      LoRA on the experts as well (PEFT's target_parameters), with peak RSS;
#   3. the same model and batch through TRL's SFTTrainer, LoRA on attention
#      and the experts: stock (the trainer's peft_config) against
#      experts_implementation="tiermoe" with tiermoe.torch.expert_lora, with
#      peak RSS, without and with gradient checkpointing (trl_step.py);
# with `tiermoe bench peak` before and after. Uses make test's venv and the
# package built in build/python (make test builds both). Not part of make
# test: about 25 minutes on 2 cores. Output: build/compare-python/.
#   STEPS=3  THREADS=all  VENV=~/.cache/tiermoe/venv  PARTS="block step trl"
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
py="${VENV:-$HOME/.cache/tiermoe/venv}/bin/python"
tiermoe="$root/build/tiermoe"
[ -x "$py" ] && [ -f "$root/build/python/tiermoe/__init__.py" ] && [ -x "$tiermoe" ] ||
  { echo "error: run make test first (the venv and build/python)" >&2; exit 1; }
export PYTHONPATH="$root/build/python"
export OMP_WAIT_POLICY=passive  # torch on 2 threads is slower than 1 without it (measured)
threads=${THREADS:-$(nproc)}
steps=${STEPS:-3}
work="$root/build/compare-python"
mkdir -p "$work"
B=2 L=1024 V=4096
parts=" ${PARTS:-block step trl} "

echo "uptime: $(uptime)" >&2
"$tiermoe" bench peak --threads "$threads" --json | tail -n 1 >"$work/peak-before.json"
[[ $parts == *" block "* ]] &&
  "$py" "$here/python_block.py" --threads "$threads" | tee "$work/block.jsonl"

ckpt="$work/qwen3-30b-a3b-L2-V$V"
[ -f "$ckpt/config.json" ] ||
  "$tiermoe" init --preset qwen3-30b-a3b --layers 2 --vocab-size $V --dtype bf16 --out "$ckpt" >&2
tokens="$work/tokens-V$V.npy"
[ -f "$tokens" ] || "$py" -c "import numpy as np; np.save('$tokens', np.random.default_rng(0).integers(0, $V, 65537, dtype=np.int32))"
if [[ $parts == *" step "* ]]; then
  : >"$work/step.jsonl"
  for experts in grouped_mm tiermoe patch; do
    "$py" "$here/torch_step.py" --model "$ckpt" --data "$tokens" --mode lora --dtype bf16 \
      --batch $B --seq-len $L --steps "$steps" --warmup 1 --threads "$threads" \
      --experts "$experts" | tail -n 1 | tee -a "$work/step.jsonl"
  done
  # The same step with LoRA on the experts too (PEFT's target_parameters), and its peak RSS.
  : >"$work/step-expert-lora.jsonl"
  for experts in grouped_mm tiermoe patch; do
    "$py" "$here/torch_step.py" --model "$ckpt" --data "$tokens" --mode lora --dtype bf16 \
      --batch $B --seq-len $L --steps "$steps" --warmup 1 --threads "$threads" \
      --experts "$experts" --expert-lora | tail -n 1 | tee -a "$work/step-expert-lora.jsonl"
  done
  "$tiermoe" train --model "$ckpt" --data "$tokens" --seq-len $L --batch $B --steps $((steps + 1)) \
    --no-shuffle --lr 1e-4 --lr-schedule constant --warmup-steps 0 --max-grad-norm 0 \
    --threads "$threads" --json --dtype bf16 --lora-rank 8 --lora-alpha 16 \
    --lora-targets q_proj,k_proj,v_proj,o_proj | tail -n 1 | tee "$work/cli.json"
fi
if [[ $parts == *" trl "* ]]; then
  : >"$work/trl-step.jsonl"
  # Three steps of warm-up: the first packs the frozen experts, the next two still warm the
  # allocators (measured: 3.5-5 s against 2.6-3 s after).
  for gc in "" --gradient-checkpointing; do  # TRL's default is with
    for impl in stock tiermoe; do
      "$py" "$here/trl_step.py" --model "$ckpt" --data "$tokens" --impl $impl --dtype bf16 \
        --batch $B --seq-len $L --steps "$steps" --warmup 3 --threads "$threads" $gc |
        tail -n 1 | tee -a "$work/trl-step.jsonl"
    done
  done
fi
"$tiermoe" bench peak --threads "$threads" --json | tail -n 1 >"$work/peak-after.json"
cat "$work"/peak-*.json
