#!/usr/bin/env bash
# One family at its published shapes cut to a few layers: a LoRA step of
# TierMoE (bf16) against transformers + PEFT (bf16, grouped_mm experts) on
# the same checkpoint, tokens and LoRA config, in one run; each system's step
# seconds, tokens/s, peak RSS and first losses, and TierMoE's memory plan
# against its measured peak. The figures docs/families.md reports for the
# newer families come from it.
#
# Usage: bench/compare/family_step.sh PRESET [TARGETS]
#   PRESET   an `init --preset` name (qwen3.5-35b-a3b, deepseek-v2-lite, minimax-m2, ...)
#   TARGETS  LoRA targets (default: q_proj,k_proj,v_proj,o_proj)
#   LAYERS=2 VOCAB=4096 STEPS=3 (timed, after one untimed) THREADS=all
# Checkpoints and tokens go to build/compare-family/ and are reused. Needs
# build/tiermoe (or TIERMOE=path); makes bench/compare/.venv on first use.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
tiermoe="${TIERMOE:-$root/build/tiermoe}"
[ -x "$tiermoe" ] || { echo "error: $tiermoe not built (make build)" >&2; exit 1; }
[ $# -ge 1 ] || { echo "usage: $0 PRESET [TARGETS]" >&2; exit 2; }
preset=$1
targets=${2:-q_proj,k_proj,v_proj,o_proj}
layers=${LAYERS:-2} V=${VOCAB:-4096} steps=${STEPS:-3} threads=${THREADS:-$(nproc)}
B=2 L=1024

source "$here/venv.sh"
compare_venv_hf
export OMP_WAIT_POLICY=passive  # torch on 2 threads is slower than 1 without it (measured)
work="$root/build/compare-family"
log="$work/last-run"
rm -rf "$log" && mkdir -p "$log"
ckpt="$work/$preset-L$layers-V$V"
if [ ! -f "$ckpt/config.json" ]; then
  "$tiermoe" init --preset "$preset" --layers "$layers" --vocab-size "$V" --dtype bf16 \
    --out "$ckpt" >&2
fi
tokens="$work/tokens-V$V.npy"
if [ ! -f "$tokens" ]; then
  "$py" -c "import numpy as np; np.save('$tokens', np.random.default_rng(0).integers(0, $V, 65537, dtype=np.int32))"
fi

echo "uptime: $(uptime)" >&2
rm -rf "$log/out"
compare_run "$log" tiermoe /usr/bin/time -v "$tiermoe" train --model "$ckpt" --data "$tokens" \
  --seq-len $L --batch $B --steps $((steps + 1)) --no-shuffle --lr 1e-4 --lr-schedule constant \
  --warmup-steps 0 --max-grad-norm 0 --threads "$threads" --json --lora-rank 8 --lora-alpha 16 \
  --lora-targets "$targets" --dtype bf16 --out "$log/out"
compare_run "$log" torch /usr/bin/time -v "$py" "$here/torch_step.py" --model "$ckpt" \
  --data "$tokens" --mode lora --dtype bf16 --batch $B --seq-len $L --steps "$steps" --warmup 1 \
  --threads "$threads" --lora-targets "$targets"

"$py" - "$log" "$preset" "$layers" "$V" "$targets" <<'PY'
import json, re, sys
log, preset, layers, vocab, targets = sys.argv[1:]
def rss(name):  # /usr/bin/time -v's peak, bytes
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(f"{log}/{name}.err").read())
    return int(m.group(1)) * 1024 if m else None
tm, th = (json.load(open(f"{log}/{n}.json")) for n in ("tiermoe", "torch"))
for name, r in (("tiermoe", tm), ("torch", th)):
    if "error" in r:
        sys.exit(f"{name} failed: {r['error']}")
print(f"{preset}, {layers} layers, vocab {vocab}, LoRA rank 8 on {targets}, batch 2 x 1024, bf16")
# tokens/s of a timed step for both (TierMoE's own tokens_per_s counts its first step too)
print(f"{'system':32} {'step s':>7} {'tokens/s':>9} {'peak RSS':>9}  first losses")
for name, r in (("TierMoE bf16", tm), ("transformers + PEFT bf16", th)):
    key = "tiermoe" if r is tm else "torch"
    losses = " ".join(f"{x:.4f}" for x in r["losses"][:2])
    print(f"{name:32} {r['step_time_s']:7.2f} {2 * 1024 / r['step_time_s']:9.1f} "
          f"{rss(key) / 1e9:8.2f}G  {losses}")
print(f"TierMoE / transformers + PEFT: {th['step_time_s'] / tm['step_time_s']:.2f}x")
plan = tm.get("memory_plan") or {}
tags = {k: v for k, v in plan.items() if isinstance(v, dict) and v.get("measured")}
print("memory plan, predicted / measured: " + ", ".join(
    f"{k} {v['predicted'] / v['measured']:.3f}x" for k, v in sorted(tags.items())))
PY
