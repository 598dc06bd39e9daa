"""The command-line flags torch_step.py and trl_step.py share: the checkpoint, the token file,
the batch, the timed steps and the LoRA, as step.sh and python.sh pass them."""
import os


def add_step_args(p, dtype="f32"):
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True, help="a .npy of token ids (step.sh writes one)")
    p.add_argument("--dtype", choices=["f32", "bf16"], default=dtype)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=3, help="timed steps")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--lora-alpha", type=float, default=16)
    p.add_argument("--threads", type=int, default=os.cpu_count())
