"""tiermoe.torch.patch: the whole MoE block of a transformers 5 model, router included, in TierMoE.

    import tiermoe.torch
    tiermoe.torch.patch(model)

Every MoE block is replaced by a TieredMoE over the same submodules (shared,
not copied; state_dict keys unchanged, so save_pretrained writes the stock
layout). Its routing (softmax top-k, DeepSeek-V3's group-limited sigmoid
router with its correction bias, gpt-oss's biased router), dispatch, experts
and combine run forward and backward in the engine through one
torch.autograd.Function; the combine is never replayed. Shared experts run in
PyTorch beside it (so PEFT adapts them like any nn.Linear).
"""
from typing import Optional

import torch

from . import _core
from ._families import BLOCKS, BlockSpec, experts_params, make_engine
from ._lora import EngineLora, bindable, unwrap
from ._ops import BlockMoe, check_input, engine_for, lora_inputs, score_dtype

__all__ = ["TieredMoE", "patch"]


class TieredMoE(torch.nn.Module):
    """A transformers MoE block whose routed part runs in TierMoE."""

    def __init__(self, block: torch.nn.Module, name: str, spec: BlockSpec, absorb_scores: str,
                 remat: str):
        super().__init__()
        # The block's own children, parameters and buffers under their own names.
        for n, child in block.named_children():
            self.add_module(n, child)
        for n, p in block.named_parameters(recurse=False):
            self.register_parameter(n, p)
        for n, b in block.named_buffers(recurse=False):
            self.register_buffer(n, b)
        self.tiered_from = type(block).__name__
        self.block_name = name
        self.spec = spec
        self.jitter_noise = float(getattr(block, "jitter_noise", 0.0))
        self.absorb_scores = absorb_scores
        self.remat = remat
        # Made now, so that an unsupported block or dtype fails at patch time.
        self._engine()

    def _engine(self):
        experts, _ = unwrap(self.experts)  # under PEFT's ParamWrappers, when it adapts them
        return engine_for(self, experts.gate_up_proj.dtype,
                          lambda: make_engine(experts, self.block_name, absorb=self.absorb_scores,
                                              remat=self.remat, block=self, spec=self.spec))

    def extra_repr(self) -> str:
        return f"{self.tiered_from} in TierMoE, absorb_scores={self.absorb_scores}, remat={self.remat}"

    def forward(self, hidden_states: torch.Tensor):
        shape = hidden_states.shape
        x_TD = hidden_states.reshape(-1, shape[-1])
        if self.spec.jitter and self.training and self.jitter_noise > 0:
            x_TD = x_TD * torch.empty_like(x_TD).uniform_(1.0 - self.jitter_noise,
                                                          1.0 + self.jitter_noise)
        engine = self._engine()
        check_input(self.block_name, x_TD, engine.dtype)
        gate = getattr(self, self.spec.router_attr)
        bias = gate.bias if self.spec.router == "gpt_oss" else None
        selection_bias = gate.e_score_correction_bias if self.spec.router == "deepseek_v3" else None
        engine.sync_router(gate.weight, bias, selection_bias)
        experts, factors = unwrap(self.experts)
        lora = None
        if factors and not engine.transposed and bindable(factors):
            lora = EngineLora(factors, score_dtype(engine.dtype))
        elif factors is None or factors:
            raise _core.TierMoEError(
                f"{self.block_name}: PEFT's expert LoRA here is merged, disabled, one of several "
                "active adapters, on gpt-oss's x-major experts or of two ranks, which patch does "
                "not compute (hint: one active adapter of one rank on swiglu experts, or use "
                "experts_implementation=\"tiermoe\", which falls back to PEFT's own product)")
        params = experts_params(experts)
        engine.sync_experts(*params)
        out_TD, logits_TE = BlockMoe.apply(engine, lora, x_TD, gate.weight, bias, selection_bias,
                                           *params, *lora_inputs(lora))
        self._emit_router_logits(gate, x_TD, logits_TE)
        if self.spec.shared is not None:
            out_TD = out_TD + self.spec.shared(self, x_TD)
        out = out_TD.reshape(shape)
        # gpt-oss's decoder layer unpacks (out, router_scores) and drops the scores.
        return (out, None) if self.spec.returns_scores else out

    @staticmethod
    def _emit_router_logits(gate, x_TD, logits_TE):
        """The router module's forward hooks see the engine's logits, as if it had run: that is how
        transformers records router_logits for the aux loss (output_router_logits), and how any
        user hook on the router sees them. Their gradient reaches the engine's router."""
        for hook in list(gate._forward_hooks.values()):
            hook(gate, (x_TD,), (logits_TE, None, None))


def patch(model: torch.nn.Module, *, device: Optional[str] = None,
          device_memory: Optional[int] = None, placement: str = "auto", remat: str = "default",
          absorb_scores: str = "auto", threads: Optional[int] = None) -> torch.nn.Module:
    """Replaces every MoE block of `model` (in place) with a TieredMoE; returns `model`.

    remat: which of the engine's MoE regions a forward keeps (none, full, default, save-w2-only,
    save:A,B); absorb_scores: auto (absorb the router scores before W2 unless the experts carry
    a post-expert norm), on, off; threads: the engine's threads for calls from this thread.
    """
    if device not in (None, "none"):
        raise _core.TierMoEError(
            f"patch(device={device!r}): the device tier is not reachable from Python yet "
            "(hint: run the MoE blocks on the host, device=None; the CLI's train --device runs it)")
    if device_memory is not None or placement != "auto":
        raise _core.TierMoEError(
            "patch: device_memory and placement choose the device tier, which needs device= "
            "(hint: leave them unset)")
    done = [n for n, m in model.named_modules() if isinstance(m, TieredMoE)]
    if done:
        raise _core.TierMoEError(
            f"patch: {done[0]} is already a TieredMoE; patch was called twice on this model "
            "(hint: patch a model once)")
    blocks = [(n, m) for n, m in model.named_modules() if type(m).__name__ in BLOCKS]
    if not blocks:
        kinds = sorted({type(m).__name__ for n, m in model.named_modules()
                        if hasattr(m, "experts") and n})
        raise _core.TierMoEError(
            f"patch: no MoE block TierMoE knows in {type(model).__name__}"
            + (f" (blocks with experts: {', '.join(kinds)})" if kinds else "")
            + f" (hint: supported: {', '.join(sorted(BLOCKS))})")
    if threads is not None:
        _core.set_num_threads(int(threads))
    for name, block in blocks:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, TieredMoE(block, name, BLOCKS[type(block).__name__],
                                         absorb_scores, remat))
    return model
