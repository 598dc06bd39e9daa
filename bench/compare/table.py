"""Prints bench/compare/run.sh's table from its JSON lines."""
import json
import os
import sys

log, tokens, threads = sys.argv[1], sys.argv[2], sys.argv[3]
systems = [("tiermoe", "TierMoE (grouped kernels)"), ("perexpert", "TierMoE, --per-expert"),
           ("onednn", "TierMoE, TIERMOE_ISA=onednn"),
           ("torch", "PyTorch HF expert loop"), ("torchf32", "PyTorch HF expert loop, f32"),
           ("kt", "kt-kernel MoE operator")]
modes = ["fwd", "lora", "full"]


def cell(path):
    if not os.path.exists(path):
        return None, None  # a row this machine does not run
    try:
        with open(path) as f:
            j = json.loads(f.read().strip().splitlines()[-1])
    except Exception as e:
        return f"no result ({e})", None
    if "tokens_per_s" in j:
        extra = (f" [{j['isa']}]" if "isa" in j else f" [torch {j['torch']}]" if "torch" in j
                 else f" [{j['variant']}]" if "variant" in j else "")
        return f"{j['tokens_per_s']:,.0f}{extra}", j["tokens_per_s"]
    return "not run", j.get("not_run") or j.get("error")


print(f"One MoE layer, Qwen3-30B-A3B shapes, T = {tokens}, bf16, {threads} threads, uniform "
      "routing (tokens/s)")
print(f"{'system':<30} " + " ".join(f"{m:>22}" for m in modes))
notes = []
base = {}
for key, name in systems:
    row = []
    if not any(os.path.exists(os.path.join(log, f"{key}_{m}.json")) for m in modes):
        continue
    for m in modes:
        text, v = cell(os.path.join(log, f"{key}_{m}.json"))
        text = text or "not run"
        if isinstance(v, float):
            base.setdefault(m, {})[key] = v
        elif v:
            notes.append(f"{name}, {m}: {v}")
        row.append(text)
    print(f"{name:<30} " + " ".join(f"{c:>22}" for c in row))
for m in modes:
    b = base.get(m, {})
    if "tiermoe" in b:
        ratios = ", ".join(f"{k} {b['tiermoe'] / v:.2f}x" for k, v in b.items() if k != "tiermoe")
        print(f"TierMoE / others, {m}: {ratios}")
for m in modes:
    try:
        with open(os.path.join(log, f"tiermoe_{m}.json")) as f:
            j = json.loads(f.read().strip().splitlines()[-1])
        print(f"TierMoE {m}: weight packing {j['packs']} stacks in {j['pack_s']:.2f} s over the run "
              f"({j['pack_bytes'] / 1e6:,.0f} MB held)")
    except Exception:
        pass
for n in notes:
    print("note:", n)
