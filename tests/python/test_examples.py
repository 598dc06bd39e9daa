"""The runnable examples (examples/), each as a user runs it: it finishes and its loss falls."""
import os
import re
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")


def run_example(name, *args, tmp_path):
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), "--work-dir",
                          str(tmp_path), *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.parametrize("args", [(), ("--expert-lora",), ("--device-tier",)])
def test_sft_trl(args, tmp_path):
    out = run_example("sft_trl.py", *args, tmp_path=tmp_path)
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", out).groups())
    assert last < first, out
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    if "--device-tier" in args:
        assert float(re.search(r"hot fraction ([\d.]+)", out).group(1)) > 0, out


def test_torch_loop(tmp_path):
    out = run_example("torch_loop.py", tmp_path=tmp_path)
    losses = [float(x) for x in re.findall(r"loss ([\d.]+)", out)]
    assert len(losses) >= 2 and losses[-1] < 0.5 * losses[0], out
