"""kt-kernel's MoE operator at the bench's shapes, timed like `tiermoe bench moe-layer`.

One Qwen3-MoE layer (E 128, K 8, D 2048, F 768 by default) in bf16 on
kt-kernel 0.7's native BF16 MoE: AMXBF16_MOE where the wheel's AMX variant
loads, else AVX2BF16_MOE, the choice kt-kernel's own NativeMoEWrapper makes.
The router (logits in f32, softmax, top-k, renormalised as Qwen3 does) runs in
PyTorch and is timed with the layer, as TierMoE's bench times its own router.
Routing is uniform: random router weights, no skew (the bench's --zipf 0).

Before timing, a few rows of kt-kernel's output are checked against an f32
PyTorch evaluation of the same experts; a mismatch is an error, not a figure.

lora and full run kt-kernel's SFT operator (its KTMoEWrapper in mode "sft"),
which exists only in the AMX variant (elsewhere they print {"not_run": reason}
and exit 0, so the table says why): lora is AMXBF16_SFT_SkipLoRA, frozen
experts with no adapters, forward then dx (and d of the routing weights),
what TierMoE's lora mode times; full is AMXBF16_SFT with full_weight_grad,
forward, dx and every expert's dW (bf16 gradient buffers). The router's own
backward (its logits back to x) is not run: PyTorch would, and it is about 1%
of the step. Before timing, dx on a few rows, and in full one expert's dW13
and dW2, are checked against PyTorch's autograd in f32.

Prints one JSON object on stdout (kt-kernel's own chatter goes to stderr).
"""
import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import time


@contextlib.contextmanager
def stdout_to_stderr():
    """kt-kernel's C++ prints to fd 1; keep stdout for the one JSON line."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def not_run(reason):
    print(json.dumps({"not_run": reason}))


def route(x_TD, router_ED, k):
    """Qwen3MoeSparseMoeBlock's routing with norm_topk_prob: ids [T, K] int64, weights f32."""
    import torch
    probs = torch.softmax(x_TD.float() @ router_ED.t(), dim=-1)
    w, ids = torch.topk(probs, k, dim=-1)
    return ids.contiguous(), (w / w.sum(dim=-1, keepdim=True)).contiguous()


def reference_rows(rows, x_TD, ids, w, gate, up, down):
    """out[t] = sum_k w[t,k] * down_e (silu(gate_e x) * up_e x), in f32."""
    import torch
    out = []
    for t in rows:
        xf = x_TD[t].float()
        acc = torch.zeros(x_TD.shape[1])
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            a = torch.nn.functional.silu(gate[e].float() @ xf) * (up[e].float() @ xf)
            acc += w[t, j] * (down[e].float() @ a)
        out.append(acc)
    return torch.stack(out)


def reference_grads(rows, x_TD, ids, w, dy_TD, gate, up, down, expert):
    """PyTorch's autograd in f32: dx of `rows`, and expert `expert`'s dW13 ([2F, D], gate rows
    then up) and dW2 over every token routed to it."""
    import torch
    dx = []
    for t in rows:
        xf = x_TD[t].float().requires_grad_(True)
        acc = torch.zeros(x_TD.shape[1])
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            a = torch.nn.functional.silu(gate[e].float() @ xf) * (up[e].float() @ xf)
            acc = acc + w[t, j] * (down[e].float() @ a)
        (acc * dy_TD[t].float()).sum().backward()
        dx.append(xf.grad)
    g13 = torch.cat([gate[expert], up[expert]]).float().requires_grad_(True)
    g2 = down[expert].float().requires_grad_(True)
    tok, slot = (ids == expert).nonzero(as_tuple=True)
    xf = x_TD[tok].float()
    F = gate[expert].shape[0]
    h = xf @ g13.t()
    a = torch.nn.functional.silu(h[:, :F]) * h[:, F:]
    y = (a @ g2.t()) * w[tok, slot, None]
    (y * dy_TD[tok].float()).sum().backward()
    return torch.stack(dx), g13.grad, g2.grad


def rel_err(got, want):
    return float((got.float() - want).abs().max() / want.abs().max())


def run_sft(args, version, variant):
    """lora and full on kt-kernel's SFT operator (see the module docstring)."""
    import torch
    from kt_kernel.experts import KTMoEWrapper
    E, K, D, F, T = args.experts, args.top_k, args.hidden, args.ffn, args.tokens
    full = args.mode == "full"
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(args.seed)

    def weights(rows, cols):
        return (torch.randn(E, rows, cols, generator=g) * 0.02).bfloat16().contiguous()

    gate, up, down = weights(F, D), weights(F, D), weights(D, F)
    router_ED = torch.randn(E, D, generator=g) * 0.02
    x_TD = torch.randn(T, D, generator=g).bfloat16().contiguous()
    dy_TD = torch.randn(T, D, generator=g).bfloat16().contiguous()
    times, router_times, errs = [], [], {}
    with stdout_to_stderr():
        moe = KTMoEWrapper(
            layer_idx=0, num_experts=E, num_experts_per_tok=K, hidden_size=D,
            moe_intermediate_size=F, gpu_experts_mask=None, cpuinfer_threads=args.threads,
            threadpool_count=1, weight_path="", chunked_prefill_size=T, mode="sft",
            method="AMXBF16_SFT" if full else "AMXBF16_SFT_SkipLoRA",
            lora_rank=0 if full else 8, full_weight_grad=full)
        start = time.perf_counter()
        if full:
            moe.init_full_weight_grad_buffers(gate, up, down)
        moe.load_weights_from_tensors(gate, up, down, torch.arange(E, dtype=torch.int64))
        load_s = time.perf_counter() - start
        for it in range(args.warmup + args.iters):
            start = time.perf_counter()
            ids, w = route(x_TD, router_ED, K)
            routed = time.perf_counter()
            out_TD = moe.forward(x_TD, ids, w, save_for_backward=True)
            dx_TD, _dw_TK = moe.backward(dy_TD)
            if it >= args.warmup:
                times.append(time.perf_counter() - start)
                router_times.append(routed - start)
            if it == 0:
                rows = [0, T // 2, T - 1]
                errs["out"] = rel_err(out_TD[rows], reference_rows(rows, x_TD, ids, w, gate, up,
                                                                    down))
                expert = int(ids[0, 0])
                dx, d13, d2 = reference_grads(rows, x_TD, ids, w, dy_TD, gate, up, down, expert)
                errs["dx"] = rel_err(dx_TD[rows], dx)
                if full:
                    got13 = torch.cat([moe.grad_gate_proj_buf[expert], moe.grad_up_proj_buf[expert]])
                    errs["dw13"] = rel_err(got13, d13)
                    errs["dw2"] = rel_err(moe.grad_down_proj_buf[expert], d2)
        del moe
        gc.collect()
    bad = {k: v for k, v in errs.items() if not v < 2e-2}  # bf16 results: about 0.4% seen
    if bad:
        print(f"error: kt-kernel is off PyTorch's f32 autograd by {bad} (relative to the largest "
              "value)", file=sys.stderr)
        sys.exit(1)
    s = statistics.median(times)
    flops = (18.0 if full else 12.0) * T * K * D * F  # fwd 6, dx 6, dW 6 per routed row
    print(json.dumps({
        "impl": "kt-kernel", "kt_kernel": version, "variant": variant,
        "class": "AMXBF16_SFT" if full else "AMXBF16_SFT_SkipLoRA", "mode": args.mode,
        "dtype": "bf16", "tokens": T, "threads": args.threads, "seconds": s,
        "tokens_per_s": T / s, "tflops": flops / s / 1e12,
        "router_s": statistics.median(router_times), "load_s": load_s, "max_rel_err": errs,
    }))
    # The wrapper's thread pool says goodbye on fd 1 at exit: after this line,
    # fd 1 is stderr, so the JSON stays the last line of stdout.
    sys.stdout.flush()
    os.dup2(2, 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--ffn", type=int, default=768)
    p.add_argument("--mode", choices=["fwd", "lora", "full"], default="fwd")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    try:
        with stdout_to_stderr():
            import torch
            import kt_kernel
            import kt_kernel_ext
            import kt_kernel_ext.moe as moe_mod
    except Exception as e:  # not installed, or its wheel does not load here
        return not_run(f"kt_kernel does not import: {e}")
    variant = kt_kernel.__cpu_variant__
    version = getattr(kt_kernel, "__version__", "?")
    if args.mode != "fwd":
        if getattr(moe_mod, "AMXBF16_SFT_MOE", None) is None:
            return not_run(f"kt-kernel {version} ({variant} variant) has no BF16 SFT backward "
                           "(AMXBF16_SFT_MOE is in its AMX variant only)")
        return run_sft(args, version, variant)
    cls = getattr(moe_mod, "AMXBF16_MOE", None) or getattr(moe_mod, "AVX2BF16_MOE", None)
    if cls is None:
        return not_run(f"kt-kernel {version} ({variant} variant) has no BF16 MoE class")

    E, K, D, F, T = args.experts, args.top_k, args.hidden, args.ffn, args.tokens
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(args.seed)

    def stack(rows, cols):  # one tensor per expert, as kt-kernel's loaders hand them over
        return [(torch.randn(rows, cols, generator=g) * 0.02).bfloat16().contiguous()
                for _ in range(E)]

    gate, up, down = stack(F, D), stack(F, D), stack(D, F)
    router_ED = torch.randn(E, D, generator=g) * 0.02
    x_TD = torch.randn(T, D, generator=g).bfloat16().contiguous()
    out_TD = torch.zeros(T, D, dtype=torch.bfloat16)
    bsz = torch.full((1,), T, dtype=torch.int32)

    times, router_times = [], []
    with stdout_to_stderr():
        pool = kt_kernel_ext.WorkerPoolConfig()
        pool.subpool_count = 1
        pool.subpool_numa_map = [0]
        pool.subpool_thread_count = [args.threads]
        cpu_infer = kt_kernel_ext.CPUInfer(pool)
        on_gpu = torch.zeros(E, dtype=torch.bool)  # every expert on the CPU
        cfg = moe_mod.MOEConfig(E, K, D, F, on_gpu.data_ptr())
        cfg.layer_idx = 0
        cfg.pool = cpu_infer.backend_
        cfg.max_len = T
        cfg.gate_projs = [[t.data_ptr() for t in gate]]
        cfg.up_projs = [[t.data_ptr() for t in up]]
        cfg.down_projs = [[t.data_ptr() for t in down]]
        cfg.gate_scales = cfg.up_scales = cfg.down_scales = [[0] * E]  # BF16: no scales
        moe = cls(cfg)
        identity = torch.arange(E, dtype=torch.int64)  # physical -> logical expert ids
        start = time.perf_counter()
        cpu_infer.submit(moe.load_weights_task(identity.data_ptr()))
        cpu_infer.sync()
        load_s = time.perf_counter() - start

        for it in range(args.warmup + args.iters):
            start = time.perf_counter()
            ids, w = route(x_TD, router_ED, K)
            routed = time.perf_counter()
            cpu_infer.submit(moe.forward_task(bsz.data_ptr(), K, ids.data_ptr(), w.data_ptr(),
                                              x_TD.data_ptr(), out_TD.data_ptr(), False))
            cpu_infer.sync()
            if it >= args.warmup:
                times.append(time.perf_counter() - start)
                router_times.append(routed - start)
            if it == 0:
                rows = [0, T // 2, T - 1]
                ref = reference_rows(rows, x_TD, ids, w, gate, up, down)
                err = float((out_TD[rows].float() - ref).abs().max() / ref.abs().max())
        del moe, cpu_infer
        gc.collect()
    if not err < 2e-2:  # bf16 output, f32 sums: about 0.4% seen
        print(f"error: kt-kernel's output is off the f32 reference by {err:.3g} (relative to the "
              "largest output)", file=sys.stderr)
        sys.exit(1)
    s = statistics.median(times)
    print(json.dumps({
        "impl": "kt-kernel", "kt_kernel": version, "variant": variant, "class": cls.__name__,
        "mode": args.mode, "dtype": "bf16", "tokens": T, "threads": args.threads,
        "seconds": s, "tokens_per_s": T / s, "tflops": 6.0 * T * K * D * F / s / 1e12,
        "router_s": statistics.median(router_times), "load_s": load_s, "max_rel_err": err,
    }))


if __name__ == "__main__":
    main()
