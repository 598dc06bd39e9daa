"""TierMoE: Mixture-of-Experts fine-tuning with the experts on the host CPU and a device tier.

From PyTorch and transformers 5:

    import tiermoe.transformers  # registers experts_implementation="tiermoe"
    model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="tiermoe")

or, for the whole MoE block (router included) in the engine:

    import tiermoe.torch
    tiermoe.torch.patch(model)

torch is needed only by those two modules; `import tiermoe` and the `tiermoe`
command line work without it.
"""
from ._core import TierMoEError, __version__, num_threads, set_num_threads

__all__ = ["TierMoEError", "__version__", "num_threads", "set_num_threads"]
