"""What TierMoE reads of each transformers 5 MoE family: its experts class and its MoE block.

Classes are matched by name, so that a module transformers does not define in
one of these families (another model's experts with its own gate function) is
refused rather than computed wrongly.
"""
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.nn.utils import parametrize

from . import _core
from ._ops import DTYPE_NAMES, EngineMoe

# Experts classes: swiglu (silu(gate) * up, gate rows then up rows) or gpt_oss
# (the clamped GLU on interleaved gate/up columns, biases, x-major weights).
EXPERTS = {
    "Qwen3MoeExperts": "swiglu",
    "Qwen2MoeExperts": "swiglu",
    "MixtralExperts": "swiglu",
    "OlmoeExperts": "swiglu",
    "Glm4MoeExperts": "swiglu",
    "DeepseekV3Experts": "swiglu",
    "Glm4MoeLiteExperts": "swiglu",
    "DeepseekV2Experts": "swiglu",
    "MiniMaxM2Experts": "swiglu",
    "Qwen3_5MoeExperts": "swiglu",
    "GptOssExperts": "gpt_oss",
}


@dataclass(frozen=True)
class BlockSpec:
    router_attr: str  # the router submodule: "gate" or "router"
    router: str  # the engine's router kind: softmax_topk, deepseek_v3, deepseek_v2 or gpt_oss
    # Whether the top-k weights are renormalised to sum 1 (softmax_topk).
    renormalize: Callable[[torch.nn.Module], bool] = lambda gate: gate.norm_topk_prob
    # The shared expert's output for x_TD, added to the routed experts'.
    shared: Optional[Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]] = None
    returns_scores: bool = False  # gpt-oss's block returns (out, router_scores)
    jitter: bool = False  # Mixtral's router_jitter_noise in training
    # deepseek_v3: the e_score_correction_bias (the router's; MiniMax-M2's block holds it),
    # and whether the router has groups and a scale (MiniMax-M2's has neither).
    selection_bias: Callable[[torch.nn.Module], torch.Tensor] = (
        lambda block: block.gate.e_score_correction_bias)
    grouped: bool = True


def _qwen2_shared(block, x_TD):
    return torch.sigmoid(block.shared_expert_gate(x_TD)) * block.shared_expert(x_TD)


def _deepseek_shared(block, x_TD):
    return block.shared_experts(x_TD)


BLOCKS = {
    "Qwen3MoeSparseMoeBlock": BlockSpec("gate", "softmax_topk"),
    "OlmoeSparseMoeBlock": BlockSpec("gate", "softmax_topk"),
    "MixtralSparseMoeBlock": BlockSpec("gate", "softmax_topk", renormalize=lambda gate: True,
                                       jitter=True),
    "Qwen2MoeSparseMoeBlock": BlockSpec("gate", "softmax_topk", shared=_qwen2_shared),
    "Glm4MoeMoE": BlockSpec("gate", "deepseek_v3", shared=_deepseek_shared),
    "DeepseekV3MoE": BlockSpec("gate", "deepseek_v3", shared=_deepseek_shared),
    "Glm4MoeLiteMoE": BlockSpec("gate", "deepseek_v3", shared=_deepseek_shared),
    # transformers' V2 router drops norm_topk_prob: it never renormalises.
    "DeepseekV2Moe": BlockSpec("gate", "deepseek_v2", renormalize=lambda gate: False,
                               shared=_deepseek_shared),
    "MiniMaxM2SparseMoeBlock": BlockSpec("gate", "deepseek_v3", renormalize=lambda gate: True,
                                         jitter=True, grouped=False,
                                         selection_bias=lambda block: block.e_score_correction_bias),
    # Qwen2-MoE's gated shared expert under a router that always renormalises.
    "Qwen3_5MoeSparseMoeBlock": BlockSpec("gate", "softmax_topk", renormalize=lambda gate: True,
                                          shared=_qwen2_shared),
    "GptOssMLP": BlockSpec("router", "gpt_oss", renormalize=lambda gate: False,
                           returns_scores=True),
}


def experts_params(experts: torch.nn.Module, original: bool = False):
    """The experts' parameters in their HF layout: gate_up_proj, down_proj, then the biases or
    None. Where PEFT parametrizes one (its LoRA), the value PEFT computes, or with `original`
    the frozen tensor under it."""
    def get(name):
        if original and parametrize.is_parametrized(experts, name):
            return experts.parametrizations[name].original
        return getattr(experts, name)

    bias = getattr(experts, "has_bias", False)
    return (get("gate_up_proj"), get("down_proj"),
            get("gate_up_proj_bias") if bias else None, get("down_proj_bias") if bias else None)


def experts_class_name(module: torch.nn.Module) -> str:
    """The module's class name; under torch's parametrize (PEFT's expert LoRA), which swaps in a
    subclass Parametrized<Name>, the class it derives from."""
    cls = type(module)
    return cls.__bases__[0].__name__ if parametrize.is_parametrized(module) else cls.__name__


def make_engine(experts: torch.nn.Module, name: str, *, absorb: str = "auto",
                remat: str = "default", block: Optional[torch.nn.Module] = None, spec: Optional[BlockSpec] = None) -> EngineMoe:
    """The engine op for an experts module (and, with `block`, its router)."""
    kind = experts_class_name(experts)
    activation = EXPERTS.get(kind)
    if activation is None:
        raise _core.TierMoEError(
            f"{name}: experts class {kind} is not one TierMoE runs "
            f"(hint: supported: {', '.join(sorted(EXPERTS))})")
    if getattr(experts, "has_post_expert_norm", False):
        raise _core.TierMoEError(f"{name}: experts with a post-expert norm are not supported")
    if activation == "swiglu" and type(getattr(experts, "act_fn", None)).__name__ not in (
            "SiLUActivation", "SiLU"):
        raise _core.TierMoEError(
            f"{name}: hidden_act is {type(experts.act_fn).__name__}; TierMoE's experts are SwiGLU "
            "(hint: hidden_act must be silu)")
    w13 = experts_params(experts, original=True)[0]
    dtype = w13.dtype
    if dtype not in DTYPE_NAMES:
        raise _core.TierMoEError(
            f"{name}: the experts are {dtype} (hint: TierMoE computes in float64, float32 or bfloat16)")
    transposed = bool(getattr(experts, "is_transposed", False))
    if transposed:
        E, D, F2 = w13.shape
    else:
        E, F2, D = w13.shape
    kwargs = dict(num_experts=E, hidden=D, ffn=F2 // 2, activation=activation,
                  bias=bool(getattr(experts, "has_bias", False)), dtype=DTYPE_NAMES[dtype],
                  absorb=absorb, remat=remat, name=name)
    if activation == "gpt_oss":
        kwargs.update(alpha=float(experts.alpha), limit=float(experts.limit))
    if block is not None:
        gate = getattr(block, spec.router_attr)
        kwargs.update(router=spec.router, top_k=int(gate.top_k),
                      norm_topk_prob=bool(spec.renormalize(gate)))
        if spec.router == "deepseek_v3" and spec.grouped:
            kwargs.update(n_group=int(gate.num_group), topk_group=int(gate.topk_group),
                          routed_scaling_factor=float(gate.routed_scaling_factor))
        if spec.router == "deepseek_v2":  # greedy: one group holding every expert
            grouped = gate.topk_method == "group_limited_greedy"
            kwargs.update(n_group=int(gate.num_group) if grouped else 1,
                          topk_group=int(gate.topk_group) if grouped else 1,
                          routed_scaling_factor=float(gate.routed_scaling_factor))
    return EngineMoe(_core.MoeOp(**kwargs), name, dtype, transposed,
                     interleaved=activation == "gpt_oss")
