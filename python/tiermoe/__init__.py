"""TierMoE: Mixture-of-Experts fine-tuning with the experts on the host CPU and a device tier.

From PyTorch and transformers 5:

    import tiermoe.transformers  # registers experts_implementation="tiermoe"
    model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="tiermoe")

or, for the whole MoE block (router included) in the engine:

    import tiermoe.torch
    tiermoe.torch.patch(model)

and on either path, the hot experts on the device tier:

    tiermoe.configure(model, device="cpu", device_memory=8 << 30)

torch is needed only by those modules and configure; `import tiermoe` and the
`tiermoe` command line work without it.
"""
from ._core import TierMoEError, __version__, num_threads, set_num_threads

__all__ = ["TierMoEError", "__version__", "configure", "num_threads", "set_num_threads"]


def configure(model, **tier):
    """tiermoe.torch.configure(model, device=, device_memory=, placement=, profile=, rates=):
    the hot experts of a model on either path on the device tier (imports torch)."""
    from .torch import configure as configure_tier
    return configure_tier(model, **tier)
