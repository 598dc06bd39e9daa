"""One transformers MoE block at Qwen3-30B-A3B's shapes (D 2048, F 768, E 128, top-8), forward
and LoRA backward (the block frozen: dx only), under each experts implementation in one process:
transformers' grouped_mm and eager, TierMoE's experts backend (experts_implementation="tiermoe")
and tiermoe.torch.patch (the whole block in the engine). Prints one JSON line per (dtype,
implementation): median forward and backward seconds over --reps after one warm-up, tokens/s
and TFLOP/s (the expert GEMMs' 6 T K D F multiply-adds each way).

Run by bench/compare/python.sh, which sets the measured peak beside it.
"""
import argparse
import copy
import json
import statistics
import time

import torch
import transformers

import tiermoe.torch
import tiermoe.transformers  # noqa: F401

D, F, E, K = 2048, 768, 128, 8


def make_block(dtype):
    cfg = transformers.Qwen3MoeConfig(hidden_size=D, moe_intermediate_size=F, num_experts=E,
                                      num_experts_per_tok=K, norm_topk_prob=True,
                                      num_hidden_layers=1, experts_implementation="eager")
    block = transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * D ** -0.5)
    return block.to(dtype).requires_grad_(False)


def variant(block, impl):
    if impl == "patch":
        holder = torch.nn.Module()
        holder.mlp = copy.deepcopy(block)
        tiermoe.torch.patch(holder)
        return holder.mlp
    block.experts.config._experts_implementation = impl
    return block


def time_block(block, x, reps):
    fwd, bwd = [], []
    for r in range(reps + 1):
        xi = x.clone().requires_grad_(True)
        t0 = time.perf_counter()
        out = block(xi)
        t1 = time.perf_counter()
        out.backward(torch.ones_like(out))
        t2 = time.perf_counter()
        if r:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    return statistics.median(fwd), statistics.median(bwd)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dtypes", default="bf16,f32")
    p.add_argument("--impls", default="grouped_mm,eager,tiermoe,patch")
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        tiermoe.set_num_threads(args.threads)
    flops = 6 * args.tokens * K * D * F
    for dt in args.dtypes.split(","):
        dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dt]
        base = make_block(dtype)
        x = torch.randn(1, args.tokens, D, generator=torch.Generator().manual_seed(1)).to(dtype)
        for impl in args.impls.split(","):
            fwd, bwd = time_block(variant(base, impl), x, args.reps)
            print(json.dumps({"dtype": dt, "impl": impl, "tokens": args.tokens,
                              "threads": torch.get_num_threads(), "fwd_s": fwd, "bwd_s": bwd,
                              "fwd_tflops": flops / fwd / 1e12, "bwd_tflops": flops / bwd / 1e12,
                              "tokens_per_s": args.tokens / (fwd + bwd)}), flush=True)


if __name__ == "__main__":
    main()
