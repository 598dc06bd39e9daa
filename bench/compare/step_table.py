"""Prints bench/compare/step.sh's table from the files it left in its log directory.

FLOPs of one step are counted from the checkpoint's config.json (multiply-adds
as 2 flops; causal attention over the T (T + 1) / 2 visible pairs):
  projections  q/k/v/o: forward and dx (frozen); full fine-tuning adds dW;
               LoRA's two thin products: forward, dx and both weight grads (3x)
  attention    scores and P.V forward (2 products), S, dP, dV, dK, dQ backward (5)
  router       logits forward and dx (full: and dW)
  experts      K routed experts' W13 and W2: forward and dx (full: and dW)
  lm_head      logits forward and dx (full: and dW; vocab 4096 checkpoints untied)
A part's share of the peak is its FLOPs over its seconds (TierMoE's
time_split_s, the median step) over the peak measured in the same run, of
the run's dtype (bf16 products on the bf16 peak where the CPU has one).
"vs torch best" sets each step against the faster of PyTorch's f32 and bf16.
"""
import json
import os
import statistics
import sys


def load(path):
    try:
        with open(path) as f:
            lines = [l for l in f.read().strip().splitlines() if l.strip()]
        return json.loads(lines[-1]) if lines else {"error": "no output"}
    except (OSError, ValueError) as e:
        return {"error": str(e)}


def part_flops(cfg, mode, B, T, lora_rank=8):
    D, H, Hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    P = cfg.get("head_dim") or D // H
    E, K, F = cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    V, layers = cfg["vocab_size"], cfg["num_hidden_layers"]
    N = B * T
    passes = 3 if mode == "full" else 2  # forward, dx (, dW)
    proj = 2 * N * (D * H * P + 2 * D * Hkv * P + H * P * D)
    lora = 0 if mode == "full" else 3 * 2 * N * lora_rank * (
        (D + H * P) + 2 * (D + Hkv * P) + (H * P + D))
    core = 4 * B * H * P * T * (T + 1) / 2
    return {
        "projections": layers * (passes * proj + lora),
        "attention": layers * 3.5 * core,
        "router": layers * passes * 2 * N * D * E,
        "experts": layers * passes * 6 * N * K * D * F,
        "lm_head": passes * 2 * N * D * V,
    }


def tiermoe_parts(metrics_path):
    """Median over the timed steps (the first is untimed) of the step and of each part."""
    steps = []
    with open(metrics_path) as f:
        for line in f:
            if line.strip():
                steps.append(json.loads(line))
    timed = steps[1:] or steps
    step = statistics.median(s["step_time_s"] for s in timed)
    parts = {k: statistics.median(s["time_split_s"][k] for s in timed)
             for k in timed[0]["time_split_s"]}
    return step, parts, [s["loss"] for s in steps]


def main():
    log, B, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    vocabs = sys.argv[4:]
    names = [("tiermoe-bf16", "TierMoE bf16"), ("tiermoe-f32", "TierMoE f32 (bf16 mapped)"),
             ("torch-f32", "transformers+PEFT f32"), ("torch-bf16", "transformers+PEFT bf16")]
    for V in vocabs:
        for mode in ("lora", "full"):
            case = f"{V}-{mode}"
            if not os.path.exists(os.path.join(log, f"{case}.ckpt")):
                continue
            with open(os.path.join(log, f"{case}.ckpt")) as f:
                ckpt = f.read().strip()
            with open(os.path.join(ckpt, "config.json")) as f:
                cfg = json.load(f)
            peaks = [load(os.path.join(log, f"peak-{case}-{w}.json")) for w in ("before", "after")]
            flops = part_flops(cfg, mode, B, T)
            total = sum(flops.values())
            print(f"\n{'LoRA r8 q/k/v/o' if mode == 'lora' else 'Full fine-tuning'}, "
                  f"Qwen3-30B-A3B shapes, {cfg['num_hidden_layers']} layer(s), vocab {V}, "
                  f"batch {B} x {T}: {total / 1e12:.3f} TFLOP a step")
            print(f"{'system':<28} {'step s':>8} {'tokens/s':>9} {'TFLOP/s':>8} "
                  f"{'of peak':>8} {'vs torch f32':>13} {'vs torch best':>14}  first losses")
            base = load(os.path.join(log, f"torch-f32-{case}.json")).get("step_time_s")
            # The faster of PyTorch's f32 and bf16 steps: what a user would run.
            torch_steps = [load(os.path.join(log, f"torch-{d}-{case}.json")).get("step_time_s")
                           for d in ("f32", "bf16")]
            best = min((t for t in torch_steps if t), default=None)
            details = []
            for key, name in names:
                if key == "tiermoe-f32" and mode == "full":
                    name = "TierMoE f32"  # full fine-tuning converts the weights to its masters
                path = os.path.join(log, f"{key}-{case}.json")
                if not os.path.exists(path):
                    continue
                j = load(path)
                if "error" in j or "step_time_s" not in j:
                    print(f"{name:<28} not run: {j.get('error', j.get('not_run', '?'))}")
                    continue
                dt = "bf16" if key.endswith("bf16") else "f32"
                peak = max(p.get(f"{dt}_flops", 0) for p in peaks)
                if key.startswith("tiermoe"):
                    step, parts, losses = tiermoe_parts(os.path.join(log, f"{key}-{case}.metrics"))
                    details.append((name, step, parts, peak))
                else:
                    step, losses = j["step_time_s"], j["losses"]
                ratio = f"{base / step:.2f}x" if base else "-"
                ratio_best = f"{best / step:.2f}x" if best else "-"
                print(f"{name:<28} {step:8.2f} {B * T / step:9.1f} {total / step / 1e12:8.3f} "
                      f"{total / step / peak:8.1%} {ratio:>13} {ratio_best:>14}  "
                      + " ".join(f"{x:.4f}" for x in losses[:2]))
            for name, step, parts, peak in details:
                experts_s = parts["experts"] + parts["expert_wait"]
                seconds = {"attention": parts["attention"], "projections": parts["projections"],
                           "experts": experts_s, "router": parts["router"],
                           "lm_head": parts["lm_head"]}
                shares = ", ".join(
                    f"{k} {seconds[k]:.2f} s ({flops[k] / seconds[k] / peak:.0%} of peak)"
                    for k in ("attention", "projections", "experts", "lm_head") if seconds[k] > 0)
                rest = step - sum(seconds.values())
                print(f"  {name}: {shares}; the rest {rest:.2f} s "
                      f"(norms {parts['norms']:.2f}, dispatch {parts['dispatch']:.2f}, "
                      f"router {parts['router']:.2f}, optimizer {parts['optimizer']:.2f}, "
                      f"other {parts['other']:.2f})")
            print(f"  peak {max(p.get('bf16_flops', 0) for p in peaks) / 1e9:.1f} GFLOP/s bf16, "
                  f"{max(p.get('f32_flops', 0) for p in peaks) / 1e9:.1f} f32 "
                  f"({peaks[0].get('isa', '?')}, {peaks[0].get('threads', '?')} threads)")


if __name__ == "__main__":
    main()
