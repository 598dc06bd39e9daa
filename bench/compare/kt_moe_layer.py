"""kt-kernel's MoE operator at the bench's shapes, where this CPU runs it.

kt-kernel 0.7's BF16 MoE (the AMX / AVX-512 native-precision backend, with
its SFT backward) needs AVX-512 BF16 or AMX. On a CPU without them this
prints {"not_run": reason} and exits 0, so the table says "not run" and why.
The timed call itself has not been written yet: no machine this project
has used so far could run it, and an untested call would be a guess.
"""
import argparse
import json


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--mode", choices=["fwd", "lora", "full"], default="full")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    flags = cpu_flags()
    if not ({"amx_bf16", "amx_tile"} <= flags or "avx512_bf16" in flags):
        print(json.dumps({"not_run": "this CPU has no AMX-BF16 or AVX-512 BF16, which kt-kernel's "
                          "BF16 MoE operator needs"}))
        return
    try:
        import kt_kernel  # noqa: F401
    except Exception as e:  # not installed, or its wheel does not load here
        print(json.dumps({"not_run": f"kt_kernel does not import: {e}"}))
        return
    print(json.dumps({"not_run": "kt-kernel imports, but its timed MoE call is not written yet "
                      "(bench/compare/kt_moe_layer.py)"}))


if __name__ == "__main__":
    main()
