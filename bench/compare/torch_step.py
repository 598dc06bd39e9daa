"""One whole training step of transformers + PEFT, timed as `tiermoe train` times its own.

The checkpoint is loaded as shipped (transformers 5, `sdpa` attention, or
`eager` for gpt-oss, whose sinks sdpa does not take; `grouped_mm` experts), in --dtype; LoRA (PEFT) on the attention projections
or every parameter trained (--mode full); --experts picks the MoE blocks
implementation: transformers' grouped_mm (default) or eager, TierMoE's
experts backend (tiermoe: experts_implementation="tiermoe") or its whole
block (patch: tiermoe.torch.patch after PEFT); AdamW (torch's, foreach); the
batches are the windows `tiermoe train --no-shuffle` draws from the same
token file: step s takes windows [s*B, s*B + B), window w being tokens
[w*L, w*L + L) with the next tokens as targets. Prints one JSON object: the
median step seconds after --warmup steps, tokens/s and the losses.
"""
import argparse
import json
import resource
import statistics
import sys
import time

import numpy as np
import torch

from step_args import add_step_args


def main():
    p = argparse.ArgumentParser(description=__doc__)
    add_step_args(p, dtype="f32")
    p.add_argument("--mode", choices=["lora", "full"], default="lora")
    p.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--experts", choices=["grouped_mm", "eager", "tiermoe", "patch"],
                   default="grouped_mm")
    p.add_argument("--expert-lora", action="store_true",
                   help="LoRA on the experts too (PEFT's target_parameters)")
    args = p.parse_args()

    import transformers
    torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.dtype == "f32" else torch.bfloat16
    config = transformers.AutoConfig.from_pretrained(args.model)
    attn = "eager" if config.model_type == "gpt_oss" else "sdpa"
    experts = {"tiermoe": "tiermoe", "patch": "grouped_mm"}.get(args.experts, args.experts)
    if experts == "tiermoe":
        import tiermoe.transformers  # noqa: F401  (registers the backend)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model, dtype=dtype, attn_implementation=attn, experts_implementation=experts)
    model.config.use_cache = False
    if args.mode == "lora":
        import peft
        experts = (["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
                   if args.expert_lora else None)
        cfg = peft.LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                              target_modules=args.lora_targets.split(","),
                              target_parameters=experts)
        model = peft.get_peft_model(model, cfg)
    if args.experts == "patch":
        import tiermoe.torch
        tiermoe.torch.patch(model, threads=args.threads)
    model.train()
    params = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)

    tokens = np.load(args.data).astype(np.int64)
    B, L = args.batch, args.seq_len
    total = args.warmup + args.steps
    need = total * B * L + 1
    if tokens.size < need:
        raise SystemExit(f"error: {args.data} holds {tokens.size} tokens; {total} steps of "
                         f"{B} x {L} need {need}")
    times, losses = [], []
    for s in range(total):
        w0 = s * B
        ids = torch.stack([torch.from_numpy(tokens[(w0 + b) * L:(w0 + b) * L + L]) for b in range(B)])
        tgt = torch.stack([torch.from_numpy(tokens[(w0 + b) * L + 1:(w0 + b) * L + L + 1])
                           for b in range(B)])
        start = time.perf_counter()
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]),
                                                 tgt.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        if s >= args.warmup:
            times.append(elapsed)
        losses.append(loss.item())
        print(f"torch step {s + 1}/{total}: {elapsed:.2f} s, loss {float(loss):.4f}", flush=True,
              file=sys.stderr)
    step = statistics.median(times)
    print(json.dumps({"impl": "transformers+peft" if args.mode == "lora" else "transformers",
                      "experts": args.experts, "expert_lora": args.expert_lora,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "torch": torch.__version__, "transformers": transformers.__version__,
                      "mode": args.mode, "dtype": args.dtype, "threads": args.threads,
                      "step_time_s": step, "tokens_per_s": B * L / step, "losses": losses}))


if __name__ == "__main__":
    main()
