"""The device tier of a model whose MoE experts run in TierMoE, on either path: hot experts on
the device tier, cold ones on the host, in the same step, as `tiermoe train --device` runs them.

A model's tier is one _core.TierSession over all its MoE layers. A step begins at the first MoE
forward after the previous optimizer step (every layer's experts are bound then: placing experts
uploads their weights) and ends at the next optimizer step (torch's global post-step hook),
where full fine-tuning's updated weights go back up and the placement is re-planned.
"""
import json
import weakref
from typing import Callable, List, Optional

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from . import _core
from ._ops import DTYPE_NAMES, EngineMoe

# The tier of each module that runs a layer of it (a TieredMoE, or an experts module under
# experts_implementation="tiermoe"), beside the modules rather than on them: a module
# deep-copies as transformers' own, and a copy runs on the host.
_TIERS = weakref.WeakKeyDictionary()


class TierState:
    """One model's device tier and where its training is."""

    def __init__(self, op, modules, bind: Callable[[torch.nn.Module], None],
                 experts: Callable[[torch.nn.Module], torch.nn.Module]):
        self.op = op
        self.modules = weakref.WeakSet(modules)
        self._bind = bind  # binds a module's experts to its engine
        self._experts = experts  # a module's experts module (under PEFT's wrappers)
        self.in_step = False
        self.steps = 0
        self.last = None

    def begin(self):
        if not self.in_step:
            for m in self.modules:
                self._bind(m)
            self.op.begin_step()
            self.in_step = True

    def end(self):
        if not self.in_step:
            return
        trained = any(p.requires_grad for m in self.modules
                      for p in self._experts(m).parameters())
        self.last = json.loads(self.op.end_step(trained))
        self.in_step = False
        self.steps += 1


def begin_step(module: torch.nn.Module) -> None:
    """Called by each MoE forward: begins its model's tier step, if it has a tier."""
    state = _TIERS.get(module)
    if state is not None:
        state.begin()


_STEP_HOOK = None


def _after_optimizer_step(optimizer, args, kwargs):
    for state in {id(s): s for s in _TIERS.values()}.values():
        state.end()


def attach(modules: List[torch.nn.Module], engines: List[EngineMoe], bind, experts_of, *,
           device: str, device_memory: Optional[int], placement: str, profile: Optional[str],
           rates: Optional[tuple], where: str) -> None:
    """Puts the layers `engines` (of `modules`; experts_of(module) is its experts module) on one
    tier."""
    global _STEP_HOOK
    if device_memory is None:
        raise _core.TierMoEError(
            f"{where}(device={device!r}): device_memory must be given with a device "
            "(hint: the tier's budget in bytes on the device, e.g. device_memory=8 << 30)")
    taken = [m for m in modules if m in _TIERS]
    if taken:
        raise _core.TierMoEError(
            f"{where}: this model has a device tier already (hint: configure a model's tier once)")
    experts = [experts_of(m) for m in modules]
    e0, w13 = engines[0], experts[0].gate_up_proj
    E, F2, D = (w13.shape[0], w13.shape[2], w13.shape[1]) if e0.transposed else tuple(w13.shape)
    full = any(p.requires_grad for x in experts for p in x.parameters())
    op = _core.TierSession(device=device, memory=int(device_memory), placement=placement,
                           full=full, hidden=D, ffn=F2 // 2, dtype=DTYPE_NAMES[e0.dtype],
                           bias=bool(getattr(experts[0], "has_bias", False)),
                           activation="gpt_oss" if e0.interleaved else "swiglu",
                           absorb=e0.op.absorbs_scores, layers=len(engines), experts=E,
                           profile_in=profile or "",
                           rates=[float(r) for r in rates] if rates is not None else None)
    for layer, engine in enumerate(engines):
        engine.op.attach_tier(op, layer)
    state = TierState(op, modules, bind, experts_of)
    for m in modules:
        _TIERS[m] = state
    if _STEP_HOOK is None:
        _STEP_HOOK = register_optimizer_step_post_hook(_after_optimizer_step)


def tier_of(model: torch.nn.Module) -> TierState:
    for m in model.modules():
        if m in _TIERS:
            return _TIERS[m]
    raise _core.TierMoEError(
        f"{type(model).__name__} has no device tier (hint: tiermoe.torch.configure(model, "
        "device=\"cpu\", device_memory=BYTES))")


def stats(model: torch.nn.Module) -> dict:
    """The device tier's figures: the last step's (hot fraction, rows on the device, launches,
    bytes each way, the time split host / device / wait / transfers, re-placements and weight
    moves, the experts resident after it, per layer) and the run's totals so far."""
    state = tier_of(model)
    return {"steps": state.steps, "last_step": state.last, "totals": json.loads(state.op.totals()),
            "resident_experts": state.op.resident_experts()}


def save_profile(model: torch.nn.Module, path: str) -> None:
    """Writes the routing profile (rows per layer and expert, an average over steps), which
    configure(..., profile=PATH) plans the first step from."""
    tier_of(model).op.save_profile(str(path))
