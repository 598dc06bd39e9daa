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
import json
import weakref
from typing import Optional

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from . import _core
from ._families import BLOCKS, BlockSpec, experts_params, make_engine
from ._lora import EngineLora, bindable, unwrap
from ._ops import DTYPE_NAMES, BlockMoe, check_input, engine_for, lora_inputs, score_dtype

__all__ = ["TieredMoE", "patch", "stats", "save_profile"]

# The device tier of each patched model, by its blocks (beside them, not on them: a block
# deep-copies as transformers' own; a copy runs on the host).
_TIERS = weakref.WeakKeyDictionary()


class _TierState:
    """One model's device tier and where its training is: a step begins at the first MoE
    forward after the previous optimizer step, and ends at the next optimizer step."""

    def __init__(self, op, blocks):
        self.op = op
        self.blocks = weakref.WeakSet(blocks)
        self.in_step = False
        self.steps = 0
        self.last = None

    def begin(self):
        if not self.in_step:
            # Placing experts uploads their weights: every layer's must be bound first.
            for b in self.blocks:
                b._bind_experts()
            self.op.begin_step()
            self.in_step = True

    def end(self):
        if not self.in_step:
            return
        trained = any(p.requires_grad for b in self.blocks for p in b.experts.parameters())
        self.last = json.loads(self.op.end_step(trained))
        self.in_step = False
        self.steps += 1


_STEP_HOOK = None


def _after_optimizer_step(optimizer, args, kwargs):
    for state in {id(s): s for s in _TIERS.values()}.values():
        state.end()


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
        tier = _TIERS.get(self)
        if tier is not None:
            tier.begin()
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
        _attach_tier(tiered, device, device_memory, placement, profile, rates)
    return model


def _attach_tier(blocks, device, device_memory, placement, profile, rates):
    global _STEP_HOOK
    experts = [unwrap(b.experts)[0] for b in blocks]
    engines = [b._engine() for b in blocks]
    e0, w13 = engines[0], experts[0].gate_up_proj
    E, F2, D = (w13.shape[0], w13.shape[2], w13.shape[1]) if e0.transposed else tuple(w13.shape)
    full = any(p.requires_grad for x in experts for p in x.parameters())
    if device_memory is None:
        raise _core.TierMoEError(
            f"patch(device={device!r}): device_memory must be given with a device "
            "(hint: the tier's budget in bytes on the device, e.g. device_memory=8 << 30)")
    op = _core.TierSession(device=device, memory=int(device_memory), placement=placement,
                      full=full, hidden=D, ffn=F2 // 2, dtype=DTYPE_NAMES[e0.dtype],
                      bias=bool(getattr(experts[0], "has_bias", False)),
                      activation="gpt_oss" if e0.transposed else "swiglu",
                      absorb=e0.op.absorbs_scores, layers=len(blocks), experts=E,
                      profile_in=profile or "",
                      rates=[float(r) for r in rates] if rates is not None else None)
    for layer, engine in enumerate(engines):
        engine.op.attach_tier(op, layer)
    state = _TierState(op, blocks)
    for b in blocks:
        _TIERS[b] = state
    if _STEP_HOOK is None:
        _STEP_HOOK = register_optimizer_step_post_hook(_after_optimizer_step)


def _tier_of(model):
    for m in model.modules():
        if m in _TIERS:
            return _TIERS[m]
    raise _core.TierMoEError(
        f"{type(model).__name__} has no device tier (hint: tiermoe.torch.patch(model, "
        "device=\"cpu\", device_memory=BYTES))")


def stats(model: torch.nn.Module) -> dict:
    """The device tier's figures: the last step's (hot fraction, rows on the device, launches,
    bytes each way, the time split host / device / wait / transfers, re-placements and weight
    moves, the experts resident after it, per layer) and the run's totals so far."""
    state = _tier_of(model)
    return {"steps": state.steps, "last_step": state.last, "totals": json.loads(state.op.totals()),
            "resident_experts": state.op.resident_experts()}


def save_profile(model: torch.nn.Module, path: str) -> None:
    """Writes the routing profile (rows per layer and expert, an average over steps), which
    patch(..., profile=PATH) plans the first step from."""
    _tier_of(model).op.save_profile(str(path))
