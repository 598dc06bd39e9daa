#!/usr/bin/python3
"""The baseline a user would pick: one Hugging Face-style Qwen3-MoE sparse block
(router, softmax in fp32, top-k, renormalise, a Python loop over the experts
that received tokens, index_add_ combine) in plain PyTorch, timed like
`tiermoe bench moe-layer`. Routing is skewed the same way: hidden unit 0 of
every token is 1 and the router reads log(zipf prior) from it.

Run with Debian's torch (/usr/bin/python3). Prints one JSON object.
"""
import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.nn.functional as F


def build(args, dtype):
    g = torch.Generator().manual_seed(args.seed)
    E, D, Fi = args.experts, args.hidden, args.ffn
    x = torch.randn(args.tokens, D, generator=g)
    x[:, 0] = 1.0
    gate = torch.randn(E, D, generator=g) * 0.02
    ranks = torch.randperm(E, generator=g)
    gate[:, 0] = -args.zipf * torch.log((ranks + 1).double()).float()
    # One tensor per expert, as transformers v4's nn.ModuleList of expert
    # MLPs holds them: slicing one stacked tensor would make autograd build a
    # full-size zero gradient per expert slice.
    def experts(rows, cols):
        return [(torch.randn(rows, cols, generator=g) * 0.02).to(dtype) for _ in range(E)]
    w_gate, w_up, w_down = experts(Fi, D), experts(Fi, D), experts(D, Fi)
    return x.to(dtype), gate.to(dtype), w_gate, w_up, w_down


def moe_block(x, gate, w_gate, w_up, w_down, k):
    """transformers' Qwen3MoeSparseMoeBlock.forward, written out."""
    logits = x @ gate.t()
    probs = F.softmax(logits, dim=1, dtype=torch.float)
    weights, selected = torch.topk(probs, k, dim=-1)
    weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
    out = torch.zeros_like(x)
    mask = F.one_hot(selected, num_classes=gate.shape[0]).permute(2, 1, 0)
    hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in hit.flatten().tolist():
        idx, top_x = torch.where(mask[e])
        h = x[top_x]
        y = F.linear(F.silu(F.linear(h, w_gate[e])) * F.linear(h, w_up[e]), w_down[e])
        out.index_add_(0, top_x, (y * weights[top_x, idx, None]).to(x.dtype))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--ffn", type=int, default=768)
    p.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    p.add_argument("--mode", choices=["fwd", "lora", "full"], default="full")
    p.add_argument("--zipf", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    x, gate, w_gate, w_up, w_down = build(args, dtype)
    # lora: experts frozen (dx only); full: every weight gets a gradient.
    x.requires_grad_(args.mode != "fwd")
    gate.requires_grad_(args.mode != "fwd")
    for w in w_gate + w_up + w_down:
        w.requires_grad_(args.mode == "full")
    dout = torch.randn_like(x)

    times = []
    for it in range(args.warmup + args.iters):
        start = time.perf_counter()
        if args.mode == "fwd":
            with torch.no_grad():
                moe_block(x, gate, w_gate, w_up, w_down, args.top_k)
        else:
            out = moe_block(x, gate, w_gate, w_up, w_down, args.top_k)
            out.backward(dout)
            for t in [x, gate] + w_gate + w_up + w_down:
                t.grad = None
        if it >= args.warmup:
            times.append(time.perf_counter() - start)
    s = statistics.median(times)
    passes = {"fwd": 1, "lora": 2, "full": 3}[args.mode]
    flops = passes * 6.0 * args.tokens * args.top_k * args.hidden * args.ffn
    print(json.dumps({
        "impl": "pytorch-hf-loop", "torch": torch.__version__, "mode": args.mode,
        "dtype": args.dtype, "tokens": args.tokens, "threads": args.threads,
        "seconds": s, "tokens_per_s": args.tokens / s, "tflops": flops / s / 1e12,
    }))


if __name__ == "__main__":
    main()
