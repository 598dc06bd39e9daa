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

from . import _core, _tier
from ._families import BLOCKS, EXPERTS, BlockSpec, experts_class_name, experts_params, make_engine
from ._lora import EngineLora, bindable, expert_lora, unwrap
from ._ops import BlockMoe, check_input, engine_for, lora_inputs, score_dtype
from ._tier import save_profile, stats

__all__ = ["TieredMoE", "patch", "configure", "expert_lora", "stats", "save_profile"]


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

    def _bind_experts(self, experts=None):
        """Binds the engine to the experts' tensors (unless unchanged); returns them. `experts`:
        the experts module under PEFT's wrappers, when the caller has it."""
        params = experts_params(experts if experts is not None else unwrap(self.experts)[0])
        self._engine().sync_experts(*params)
        return params

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
        selection_bias = self.spec.selection_bias(self) if self.spec.router == "deepseek_v3" else None
        engine.sync_router(gate.weight, bias, selection_bias)
        experts, factors = unwrap(self.experts)
        lora = None
        if factors and bindable(factors):
            lora = EngineLora(factors, score_dtype(engine.dtype), engine.interleaved)
        elif factors is None or factors:
            raise _core.TierMoEError(
                f"{self.block_name}: PEFT's expert LoRA here is one of several active adapters, "
                "or of two ranks on gate_up_proj and down_proj, which patch does not compute "
                "(hint: one active adapter of one rank, or use experts_implementation=\"tiermoe\", "
                "which falls back to PEFT's own product)")
        params = self._bind_experts(experts)
        _tier.begin_step(self)
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
          absorb_scores: str = "auto", threads: Optional[int] = None,
          profile: Optional[str] = None, rates: Optional[tuple] = None) -> torch.nn.Module:
    """Replaces every MoE block of `model` (in place) with a TieredMoE; returns `model`.

    remat: which of the engine's MoE regions a forward keeps (none, full, default, save-w2-only,
    save:A,B); absorb_scores: auto (absorb the router scores before W2 unless the experts carry
    a post-expert norm), on, off; threads: the engine's threads for calls from this thread.

    device="cpu" (the device tier's CPU backend) or "cuda" with device_memory=BYTES puts the hot
    experts on the device tier, the others on the host, in the same step, with the same results:
    placement "auto" (the planner, on rates measured now), "device" (the budget filled hottest
    first) or "host"; profile=PATH plans the first step from a saved routing profile; rates=(host
    flop/s, device flop/s, link byte/s, launch s) plans with these instead of measuring (e.g. to
    plan for another device, as `tiermoe plan` takes them). Steps
    end at each optimizer step (any torch optimizer); stats(model) and save_profile(model, PATH)
    read the tier.
    """
    if device in (None, "none") and (device_memory is not None or placement != "auto"
                                     or profile is not None or rates is not None):
        raise _core.TierMoEError(
            "patch: device_memory, placement, profile and rates choose the device tier, which needs "
            "device= (hint: device=\"cpu\" or \"cuda\", or leave them unset)")
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
    tiered = []
    for name, block in blocks:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        t = TieredMoE(block, name, BLOCKS[type(block).__name__], absorb_scores, remat)
        setattr(parent, child, t)
        tiered.append(t)
    if device not in (None, "none"):
        configure(model, device=device, device_memory=device_memory, placement=placement,
                  profile=profile, rates=rates)
    return model


def configure(model: torch.nn.Module, *, device: str, device_memory: Optional[int] = None,
              placement: str = "auto", profile: Optional[str] = None,
              rates: Optional[tuple] = None) -> torch.nn.Module:
    """Puts the hot experts of `model` on the device tier (device="cpu", the tier's CPU backend,
    or "cuda" where the build has it), the cold ones on the host, in the same step; returns
    `model`. For a model on either path: experts_implementation="tiermoe" or patched. patch's
    arguments of the same names say what they choose.
    """
    blocks = [m for m in model.modules() if isinstance(m, TieredMoE)]
    if blocks:
        _tier.attach(blocks, [b._engine() for b in blocks],
                     lambda b: b._bind_experts(), lambda b: unwrap(b.experts)[0],
                     device=device, device_memory=device_memory, placement=placement,
                     profile=profile, rates=rates, where="configure")
        return model
    found = [m for m in model.modules() if experts_class_name(m) in EXPERTS]
    experts = [m for m in found
               if getattr(getattr(m, "config", None), "_experts_implementation", None) == "tiermoe"]
    if not experts:
        raise _core.TierMoEError(
            f"configure: no MoE layer of {type(model).__name__} runs in TierMoE"
            + (f" ({len(found)} experts modules run transformers' own experts)" if found else "")
            + " (hint: load it with experts_implementation=\"tiermoe\" after "
            "import tiermoe.transformers, or tiermoe.torch.patch(model) first)")
    from .transformers import bind_original, experts_engine
    _tier.attach(experts, [experts_engine(m) for m in experts], bind_original,
                 lambda m: m, device=device, device_memory=device_memory, placement=placement,
                 profile=profile, rates=rates, where="configure")
    return model
