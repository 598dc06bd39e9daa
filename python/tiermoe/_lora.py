"""PEFT's LoRA on the experts (LoraConfig(target_parameters=[...gate_up_proj, ...down_proj])),
computed by the engine as thin products beside the frozen weights.

PEFT 0.21 adapts a 3-D expert parameter [E, out, in] with one ParamWrapper per parameter:
lora_A [R*E, in] and lora_B [out, R*E], expert e's delta scaling * B_e A_e. To run the experts
it parametrizes the parameter with _LoraFactorsProxy(lhs = B [E, out, R], rhs = A [E, R, in],
scaling), which folds the delta into a dense copy of the whole stack on every forward. (gpt-oss
keeps its experts x-major, [E, in, out]: there lhs = A^T and rhs = B^T, the same factors.)
TierMoE reads the factors instead and hands them to the engine: the W13 LoRA becomes gate_proj's
and up_proj's (one A; B's row halves, or its even and odd rows where gpt-oss interleaves gate and
up), the W2 LoRA down_proj's, the scaling folded into B; their gradients go back to the factors,
and through PEFT's reshapes to lora_A and lora_B.

Where the factors cannot be read that way (several active adapters, W13 and W2 of different
ranks, another parametrization) the parameter is used as PEFT computes it: the same result, at
the dense delta's cost.
"""
import copy
from dataclasses import dataclass
from typing import Optional

import torch
from torch.nn.utils import parametrize

from ._core import TierMoEError
from ._families import EXPERTS, experts_class_name

NAMES = ("gate_up_proj", "down_proj")


@dataclass
class Factors:
    B: torch.Tensor  # [E, out, R], differentiable back to lora_B
    A: torch.Tensor  # [E, R, in], differentiable back to lora_A
    scaling: float


def _factors(lhs, rhs, scaling, transposed: bool) -> Optional[Factors]:
    """Factors from PEFT's delta factors (delta = scaling * lhs @ rhs in the parameter's layout),
    or None where they are not two 3-D factors of one rank."""
    if lhs.dim() != 3 or rhs.dim() != 3 or lhs.shape[2] != rhs.shape[1]:
        return None
    if transposed:  # [E, in, out] = A^T B^T
        return Factors(rhs.transpose(1, 2), lhs.transpose(1, 2), float(scaling))
    return Factors(lhs, rhs, float(scaling))


def _proxy_factors(proxy, transposed: bool) -> Optional[Factors]:
    # PEFT's _LoraFactorsProxy, matched by name and fields (its module is private).
    if type(proxy).__name__ != "_LoraFactorsProxy":
        return None
    return _factors(proxy.lhs, proxy.rhs, proxy.scaling, transposed)


def active_factors(experts: torch.nn.Module):
    """{name: Factors} of the LoRA PEFT has made active on `experts` right now (inside its
    ParamWrapper's forward), and whether any parametrization is there that they do not cover."""
    found, other = {}, False
    transposed = bool(getattr(experts, "is_transposed", False))
    for name in NAMES:
        if not parametrize.is_parametrized(experts, name):
            continue
        plist = experts.parametrizations[name]
        f = _proxy_factors(plist[0], transposed) if len(plist) == 1 else None
        if f is None:
            other = True
        else:
            found[name] = f
    return found, other


def unwrap(module: torch.nn.Module):
    """The experts module under PEFT's ParamWrappers, and {name: Factors} of their active adapter
    (tiermoe.torch.patch, whose block calls the experts without running the wrappers). A merged
    adapter is in the weights already, a disabled one adds nothing; None for the factors when
    several adapters are active at once, which TierMoE does not compute."""
    factors = {}
    while type(module).__name__ == "ParamWrapper":
        name = module.parameter_name
        active = [a for a in module.active_adapters if a in module.lora_A]
        if module.merged or module.disable_adapters:
            active = []
        if len(active) > 1:
            return _base(module), None
        if active:
            f = _factors(*module.get_delta_factors(active[0]),
                         getattr(_base(module), "is_transposed", False))
            if f is None:
                return _base(module), None
            factors[name] = f
        module = module.base_layer
    return module, factors


def _base(module):
    while type(module).__name__ == "ParamWrapper":
        module = module.base_layer
    return module


def bindable(factors) -> bool:
    """Whether the engine takes these factors: one rank for all of them."""
    return len({f.A.shape[1] for f in factors.values()}) == 1


def _gate_up_rows(B, interleaved: bool):
    """W13's rows of B [E, 2F, R]: gate_proj's and up_proj's (halves, or even and odd rows)."""
    if interleaved:
        return B[:, 0::2], B[:, 1::2]
    F = B.shape[1] // 2
    return B[:, :F], B[:, F:]


class EngineLora:
    """The engine copies of one forward's factors: A as the engine reads it (its master dtype),
    B with the scaling folded in; W13's B split into gate_proj's and up_proj's rows (interleaved:
    gpt-oss's even and odd rows)."""

    def __init__(self, factors, master_dtype, interleaved: bool = False):
        self.factors = factors
        self.interleaved = interleaved
        self.held = {}
        for name, f in factors.items():
            A = f.A.detach().to(master_dtype).contiguous()
            B = (f.B.detach().to(master_dtype) * f.scaling).contiguous()
            if name == "gate_up_proj":
                gate, up = _gate_up_rows(B, interleaved)
                self.held["gate"] = (A, gate.contiguous())
                self.held["up"] = (A, up.contiguous())
            else:
                self.held["down"] = (A, B)

    def bind(self, op):
        op.set_lora(next(iter(self.factors.values())).A.shape[1],
                    "gate_up_proj" in self.factors, "down_proj" in self.factors)
        for proj, (A, B) in self.held.items():
            op.bind_lora(proj, A, B)

    def grads(self, op, from_engine):
        """(dB, dA) per factor name, in the factors' dtypes, for the last backward."""
        out = {}
        for name, f in self.factors.items():
            if name == "gate_up_proj":
                dA = from_engine(op.grad("lora.gate.A")) + from_engine(op.grad("lora.up.A"))
                gate, up = from_engine(op.grad("lora.gate.B")), from_engine(op.grad("lora.up.B"))
                if self.interleaved:  # [E, F, 2, R] -> rows 2f (gate), 2f + 1 (up)
                    dB = torch.stack([gate, up], dim=2).flatten(1, 2)
                else:
                    dB = torch.cat([gate, up], dim=1)
            else:
                dA, dB = from_engine(op.grad("lora.down.A")), from_engine(op.grad("lora.down.B"))
            out[name] = ((dB * f.scaling).to(f.B.dtype), dA.to(f.A.dtype))
        return out


def expert_lora(model: torch.nn.Module, r: int = 8, alpha: float = 16,
                targets=("gate_up_proj", "down_proj"), dropout: float = 0.0, *,
                config=None, adapter_name: str = "default"):
    """LoRA of rank r on every routed expert of `model`, as PEFT's own adapter; returns the
    peft.PeftModel (get_peft_model's).

    The adapter is PEFT's target_parameters LoRA on the experts' fused `targets` (gate_up_proj,
    down_proj): per expert e, W_e + alpha / r * B_e A_e. Under experts_implementation="tiermoe"
    or tiermoe.torch.patch the engine computes it from its factors beside the frozen weights;
    saving, loading (PeftModel.from_pretrained on the stock model) and merging are PEFT's.
    `config`: a peft.LoraConfig for the rest of the model (attention's target_modules, say); the
    experts join its adapter (at rank r and alpha through its rank_pattern and alpha_pattern
    where they differ from its own), so one adapter holds both, as trainers save them.
    PEFT's expert adapters take no dropout: dropout, and config's lora_dropout, must be 0.
    """
    from peft import LoraConfig, PeftModel, get_peft_model

    if isinstance(model, PeftModel):
        raise TierMoEError(
            "expert_lora: the model is a PeftModel already; PEFT saves one adapter per config "
            "(hint: pass the stock model, with the other LoRA's LoraConfig as config=)")
    targets = tuple(targets) if not isinstance(targets, str) else (targets,)
    bad = [t for t in targets if t not in NAMES]
    if not targets or bad:
        raise TierMoEError(f"expert_lora: targets {bad or list(targets)} "
                           f"(hint: one or both of {', '.join(NAMES)})")
    if r <= 0:
        raise TierMoEError(f"expert_lora: r is {r} (hint: a positive rank, e.g. r=8)")
    if dropout or (config is not None and config.lora_dropout):
        raise TierMoEError(
            f"expert_lora: dropout {dropout or config.lora_dropout}; PEFT's LoRA on expert "
            "parameters has none, and one adapter shares its config's lora_dropout "
            "(hint: dropout=0.0, and lora_dropout=0.0 in config)")
    # Every experts module's path, by its last two parts (PEFT matches target_parameters by
    # suffix): "mlp.experts" in every family here.
    homes = sorted({".".join(n.split(".")[-2:]) for n, m in model.named_modules()
                    if experts_class_name(m) in EXPERTS})
    if not homes:
        raise TierMoEError(
            f"expert_lora: no experts module TierMoE runs in {type(model).__name__} "
            f"(hint: supported: {', '.join(sorted(EXPERTS))})")
    params = [f"{home}.{t}" for home in homes for t in targets]
    if config is None:
        cfg = LoraConfig(r=r, lora_alpha=alpha, target_modules=[], target_parameters=params)
    else:
        if not isinstance(config, LoraConfig):
            raise TierMoEError(f"expert_lora: config is a {type(config).__name__} "
                               "(hint: a peft.LoraConfig)")
        cfg = copy.deepcopy(config)
        cfg.target_parameters = sorted(set(cfg.target_parameters or []) | set(params))
        if r != cfg.r:
            cfg.rank_pattern = {**cfg.rank_pattern, **{p: r for p in params}}
        if alpha != cfg.lora_alpha:
            cfg.alpha_pattern = {**cfg.alpha_pattern, **{p: alpha for p in params}}
    return get_peft_model(model, cfg, adapter_name=adapter_name)
