"""PEFT's LoRA on the experts (LoraConfig(target_parameters=[...gate_up_proj, ...down_proj])),
computed by the engine as thin products beside the frozen weights.

PEFT 0.21 adapts a 3-D expert parameter [E, out, in] with one ParamWrapper per parameter:
lora_A [R*E, in] and lora_B [out, R*E], expert e's delta scaling * B_e A_e. To run the experts
it parametrizes the parameter with _LoraFactorsProxy(lhs = B [E, out, R], rhs = A [E, R, in],
scaling), which folds the delta into a dense copy of the whole stack on every forward. TierMoE
reads the factors instead and hands them to the engine: the W13 LoRA becomes gate_proj's and
up_proj's (one A, B's row halves), the W2 LoRA down_proj's, the scaling folded into B; their
gradients go back to the factors, and through PEFT's reshapes to lora_A and lora_B.

Where the factors cannot be read that way (several active adapters, gpt-oss's x-major experts,
W13 and W2 of different ranks, another parametrization) the parameter is used as PEFT computes
it: the same result, at the dense delta's cost.
"""
from dataclasses import dataclass
from typing import Optional

import torch
from torch.nn.utils import parametrize

NAMES = ("gate_up_proj", "down_proj")


@dataclass
class Factors:
    B: torch.Tensor  # [E, out, R], differentiable back to lora_B
    A: torch.Tensor  # [E, R, in], differentiable back to lora_A
    scaling: float


def _proxy_factors(proxy) -> Optional[Factors]:
    # PEFT's _LoraFactorsProxy, matched by name and fields (its module is private).
    if type(proxy).__name__ != "_LoraFactorsProxy":
        return None
    B, A = proxy.lhs, proxy.rhs
    if B.dim() != 3 or A.dim() != 3 or B.shape[2] != A.shape[1]:
        return None  # the x-major layout (lhs = A^T): left to PEFT
    return Factors(B, A, float(proxy.scaling))


def active_factors(experts: torch.nn.Module):
    """{name: Factors} of the LoRA PEFT has made active on `experts` right now (inside its
    ParamWrapper's forward), and whether any parametrization is there that they do not cover."""
    found, other = {}, False
    for name in NAMES:
        if not parametrize.is_parametrized(experts, name):
            continue
        plist = experts.parametrizations[name]
        f = _proxy_factors(plist[0]) if len(plist) == 1 else None
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
            B, A, scaling = module.get_delta_factors(active[0])
            if B.dim() != 3 or A.dim() != 3 or B.shape[2] != A.shape[1]:
                return _base(module), None
            factors[name] = Factors(B, A, float(scaling))
        module = module.base_layer
    return module, factors


def _base(module):
    while type(module).__name__ == "ParamWrapper":
        module = module.base_layer
    return module


def bindable(factors) -> bool:
    """Whether the engine takes these factors: one rank for all of them."""
    return len({f.A.shape[1] for f in factors.values()}) == 1


class EngineLora:
    """The engine copies of one forward's factors: A as the engine reads it (its master dtype),
    B with the scaling folded in; W13's B split into gate_proj's and up_proj's rows."""

    def __init__(self, factors, master_dtype):
        self.factors = factors
        self.held = {}
        for name, f in factors.items():
            A = f.A.detach().to(master_dtype).contiguous()
            B = (f.B.detach().to(master_dtype) * f.scaling).contiguous()
            if name == "gate_up_proj":
                F = B.shape[1] // 2
                self.held["gate"] = (A, B[:, :F].contiguous())
                self.held["up"] = (A, B[:, F:].contiguous())
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
                dB = torch.cat([from_engine(op.grad("lora.gate.B")),
                                from_engine(op.grad("lora.up.B"))], dim=1)
            else:
                dA, dB = from_engine(op.grad("lora.down.A")), from_engine(op.grad("lora.down.B"))
            out[name] = ((dB * f.scaling).to(f.B.dtype), dA.to(f.A.dtype))
        return out
