#!/usr/bin/env python3
"""Summarises scripts/gpu_check.sh's runs: summary.md and summary.json.

Each run left runs/NAME.json (the last line of `tiermoe train --json`) and
runs/NAME.jsonl (one metrics line per step); each --placement auto run also
runs/NAME.plan.json (`tiermoe plan --json` for its budget, profile and the
rates it measured). Step figures are medians over the steps after the first
(the first captures the graphs and warms the caches).
"""
import argparse
import json
import statistics
from pathlib import Path


def median(values):
    return statistics.median(values) if values else float("nan")


def load_run(runs: Path, name: str) -> dict:
    summary = json.loads((runs / f"{name}.json").read_text())
    steps = [json.loads(line) for line in (runs / f"{name}.jsonl").read_text().splitlines() if line]
    later = steps[1:] or steps
    tier = [s["tier"] for s in later if "tier" in s]

    def per_step(key):
        return median([t[key] for t in tier])

    run = {
        "name": name,
        "steps": summary["steps"],
        "final_loss": summary["final_loss"],
        "step_s": median([s["step_time_s"] for s in later]),
        "tokens_per_s": median([s["tokens_per_s"] for s in later]),
        "hot_fraction": per_step("hot_fraction"),
        "host_s": per_step("host_s"),
        "wait_s": per_step("wait_s"),
        "device_s": per_step("device_s"),
        "transfer_s": per_step("transfer_s"),
        "bytes_up": per_step("bytes_up"),
        "bytes_down": per_step("bytes_down"),
        "padding_waste": per_step("padding_waste"),
        "resident": tier[-1]["resident"] if tier else 0,
        "predicted_step_s": tier[-1]["predicted_step_s"] if tier else float("nan"),
        "bytes_moved": summary["tier"]["bytes_moved"],
        "bytes_synced": summary["tier"]["bytes_synced"],
        "replacements": summary["tier"]["replacements"],
        "faults": summary["tier"]["faults"],
        "device": summary["tier"]["device"],
        "device_memory": summary["tier"]["device_memory"],
        "rates": summary["tier"]["rates"],
    }
    plan_file = runs / f"{name}.plan.json"
    if plan_file.exists():
        plan = json.loads(plan_file.read_text())
        run["plan"] = {k: plan[k] for k in ("resident", "hot_fraction", "step_s", "sync_s",
                                              "all_host_step_s", "speedup", "bytes")}
    return run


def mb(b):
    return f"{b / 1e6:,.1f}"


def size(b):
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.0f} MiB"


def table(runs):
    rows = ["| run | budget | step s | tok/s | hot | resident | host / wait / device / transfer s "
            "| up / down MB per step | moved MB | synced MB | plan: hot, experts s | measured experts s |",
            "|---|---:|---:|---:|---:|---:|---|---|---:|---:|---|---:|"]
    for r in runs:
        plan = r.get("plan")
        predicted = f"{plan['hot_fraction']:.2f}, {plan['step_s']:.3f}" if plan else ""
        rows.append(
            f"| {r['name']} | {size(r['device_memory'])} | {r['step_s']:.3f} "
            f"| {r['tokens_per_s']:,.0f} | {r['hot_fraction']:.2f} | {r['resident']} "
            f"| {r['host_s']:.3f} / {r['wait_s']:.3f} / {r['device_s']:.3f} / {r['transfer_s']:.3f} "
            f"| {mb(r['bytes_up'])} / {mb(r['bytes_down'])} | {mb(r['bytes_moved'])} "
            f"| {mb(r['bytes_synced'])} | {predicted} | {r['host_s'] + r['wait_s']:.3f} |")
    return "\n".join(rows)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", required=True)
    p.add_argument("--build-s", type=float, required=True)
    p.add_argument("--configure-s", type=float, required=True)
    p.add_argument("--tests", required=True)
    p.add_argument("--tests-s", type=float, required=True)
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--rehearse", type=int, default=0)
    a = p.parse_args()

    names = sorted(f.stem for f in a.runs.glob("*.json")
                   if not f.name.endswith(".plan.json") and not f.name.endswith(".profile.json"))
    runs = [load_run(a.runs, n) for n in names]
    # The host placement first, then the budgets from small to large.
    runs.sort(key=lambda r: (r["name"].split("-")[0], not r["name"].endswith("-host"),
                             r["device_memory"]))
    by_mode = {m: [r for r in runs if r["name"].startswith(m + "-")] for m in ("lora", "full")}
    for mode_runs in by_mode.values():
        host = next((r for r in mode_runs if r["name"].endswith("-host")), None)
        for r in mode_runs:
            if host and r is not host:
                r["speedup_vs_host"] = host["step_s"] / r["step_s"]
                r["loss_vs_host"] = r["final_loss"] - host["final_loss"]

    summary = {"device": a.device, "rehearsal": bool(a.rehearse),
               "build": {"configure_s": a.configure_s, "build_s": a.build_s},
               "tests": {"result": a.tests, "seconds": a.tests_s},
               "tokens_per_step": a.tokens, "steps": a.steps, "runs": runs}
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

    lines = [f"# gpu_check summary ({'REHEARSAL on the CPU device, not a GPU' if a.rehearse else a.device})",
             "",
             f"- build: configure {a.configure_s:.0f} s, build {a.build_s:.0f} s",
             f"- cuda tests: {a.tests} ({a.tests_s:.0f} s)",
             f"- {a.tokens} tokens a step, {a.steps} steps a run; step figures are medians of steps 2..{a.steps}",
             ""]
    if runs:
        r0 = runs[0]["rates"]
        lines.append(f"- rates measured at start-up (first run): host {r0['host_flops_per_s'] / 1e12:.3f} "
                     f"TFLOP/s, device {r0['device_flops_per_s'] / 1e12:.3f} TFLOP/s, link "
                     f"{r0['link_bytes_per_s'] / 1e9:.1f} GB/s, launch {r0['launch_s'] * 1e6:.0f} us")
        lines.append("")
    for mode, mode_runs in by_mode.items():
        if not mode_runs:
            continue
        lines += [f"## {mode}", "", table(mode_runs), ""]
        for r in mode_runs:
            if "speedup_vs_host" in r:
                lines.append(f"- {r['name']}: {r['speedup_vs_host']:.2f}x the host placement's step; "
                             f"final loss {r['final_loss']:.4f} ({r['loss_vs_host']:+.2e} vs host)")
        lines.append("")
    lines.append("'measured experts s' is host_s + wait_s: the host's share of the experts, then "
                 "waiting for the device (the experts' makespan); 'plan' is `tiermoe plan`'s "
                 "prediction for the same profile, budget and measured rates.")
    (a.out / "summary.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
