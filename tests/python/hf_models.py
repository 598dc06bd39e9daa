"""Tiny random transformers 5 models of every family TierMoE runs, and the f64 comparison.

Each family's config puts the experts' ffn width equal to the hidden size, so a
down_proj per expert is square: a transposed one keeps its shape and must be
caught by the values alone.

## f64 throughout

transformers computes some steps in float32 even in a float64 model (the RMSNorm
statistics, RoPE, the eager softmax, the router softmax, DeepSeek's router logits).
Run as they are, the stock reference would carry float32 rounding (about 1e-7).
So both models run under Float64Everywhere, a TorchFunctionMode that turns every
float32 request (a dtype argument, `.float()`, `.to()`, `.type()`) into float64 and
raises if an op still returns float32. transformers' code is otherwise unchanged.
"""
import copy

import torch
import transformers
from torch.overrides import TorchFunctionMode

V, B, L = 64, 2, 8  # vocab, batch, sequence length
D = F = 16  # hidden and expert ffn: square down_proj per expert


class Float64Everywhere(TorchFunctionMode):
    """Every float32 request becomes float64; an op that still yields float32 is an error.
    The default dtype is float64 inside."""

    def __enter__(self):
        self._default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.set_default_dtype(self._default)
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.float:
            func, args = torch.Tensor.double, args[:1]
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        out = func(*args, **kwargs)
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                raise RuntimeError(f"{func} returned float32 under Float64Everywhere")
        return out


COMMON = dict(vocab_size=V, hidden_size=D, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, tie_word_embeddings=False, rms_norm_eps=1e-6,
              attn_implementation="eager", experts_implementation="eager")
ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def qwen3_moe():
    return transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        **COMMON, intermediate_size=32, moe_intermediate_size=F, num_hidden_layers=2, head_dim=8,
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, output_router_logits=True,
        router_aux_loss_coef=0.01, rope_parameters=ROPE))


def qwen2_moe():
    return transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
        **COMMON, intermediate_size=32, moe_intermediate_size=F, shared_expert_intermediate_size=24,
        num_hidden_layers=3, mlp_only_layers=[1], num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=False, output_router_logits=True, router_aux_loss_coef=0.01,
        rope_parameters=ROPE))


def mixtral():
    return transformers.MixtralForCausalLM(transformers.MixtralConfig(
        **COMMON, intermediate_size=F, num_hidden_layers=2, num_local_experts=4,
        num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.02,
        rope_parameters=ROPE))


def olmoe():
    return transformers.OlmoeForCausalLM(transformers.OlmoeConfig(
        **COMMON, intermediate_size=F, num_hidden_layers=2, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=False, output_router_logits=True, router_aux_loss_coef=0.01,
        rope_parameters=ROPE))


def glm4_moe():
    return transformers.Glm4MoeForCausalLM(transformers.Glm4MoeConfig(
        **COMMON, intermediate_size=32, moe_intermediate_size=F, n_shared_experts=2,
        num_hidden_layers=3, first_k_dense_replace=1, head_dim=8, n_routed_experts=8, n_group=2,
        topk_group=1, num_experts_per_tok=2, norm_topk_prob=True, routed_scaling_factor=2.5,
        use_qk_norm=True, num_mtp_layers=0,
        rope_parameters={**ROPE, "partial_rotary_factor": 0.5}))


def deepseek_v3():
    cfg = dict(COMMON, num_key_value_heads=4)
    return transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(
        **cfg, intermediate_size=32, moe_intermediate_size=F, n_shared_experts=1,
        num_hidden_layers=3, first_k_dense_replace=1, q_lora_rank=12, kv_lora_rank=10,
        qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, n_routed_experts=8, n_group=2,
        topk_group=1, num_experts_per_tok=2, norm_topk_prob=True, routed_scaling_factor=2.5,
        num_mtp_layers=0, rope_interleave=True, rope_parameters=ROPE))


def glm4_moe_lite():
    cfg = dict(COMMON, num_key_value_heads=4)
    return transformers.Glm4MoeLiteForCausalLM(transformers.Glm4MoeLiteConfig(
        **cfg, intermediate_size=32, moe_intermediate_size=F, n_shared_experts=1,
        num_hidden_layers=3, mlp_layer_types=["dense", "sparse", "sparse"], q_lora_rank=12,
        kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
        n_routed_experts=8, n_group=2, topk_group=1, num_experts_per_tok=2, norm_topk_prob=True,
        routed_scaling_factor=1.8, rope_interleave=True, rope_parameters=ROPE))


def deepseek_v2():
    cfg = dict(COMMON, num_key_value_heads=4)
    return transformers.DeepseekV2ForCausalLM(transformers.DeepseekV2Config(
        **cfg, intermediate_size=32, moe_intermediate_size=F, n_shared_experts=2,
        num_hidden_layers=3, first_k_dense_replace=1, q_lora_rank=12, kv_lora_rank=10,
        qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, n_routed_experts=8, n_group=4,
        topk_group=2, topk_method="group_limited_greedy", num_experts_per_tok=3,
        routed_scaling_factor=6.0, rope_parameters=ROPE))


def minimax_m2():
    return transformers.MiniMaxM2ForCausalLM(transformers.MiniMaxM2Config(
        **COMMON, intermediate_size=F, num_hidden_layers=2, head_dim=12, num_local_experts=8,
        num_experts_per_tok=2, rope_parameters={**ROPE, "partial_rotary_factor": 0.5}))


def qwen3_5_moe():
    cfg = dict(COMMON, rope_parameters={**ROPE, "partial_rotary_factor": 0.25})
    return transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(
        **cfg, num_hidden_layers=2, head_dim=8, linear_num_key_heads=2, linear_key_head_dim=6,
        linear_num_value_heads=4, linear_value_head_dim=5, moe_intermediate_size=F,
        shared_expert_intermediate_size=24, num_experts=4, num_experts_per_tok=2,
        layer_types=["linear_attention", "full_attention"]))


def gpt_oss():
    return transformers.GptOssForCausalLM(transformers.GptOssConfig(
        **COMMON, intermediate_size=F, num_hidden_layers=2, head_dim=8, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
        output_router_logits=True, router_aux_loss_coef=0.01, swiglu_limit=1.5,
        attention_bias=True, rope_parameters={**ROPE, "rope_theta": 150000.0}))


FAMILIES = {f.__name__: f for f in (qwen3_moe, qwen2_moe, mixtral, olmoe, glm4_moe, deepseek_v3,
                                     glm4_moe_lite, deepseek_v2, minimax_m2, qwen3_5_moe,
                                     gpt_oss)}
# Families whose router scales its weights (a doubled score can be made through the config).
SCALED = {"glm4_moe", "deepseek_v3", "glm4_moe_lite", "deepseek_v2"}


def randomize(model, seed=0):
    """Weights large enough that routing is decisive and every piece moves the loss; the
    router's e_score_correction_bias (a buffer) too, so that it changes the selection."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.randn(b.shape, generator=g, dtype=torch.float64))
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if "norm" in name:
                p.copy_(1 + 0.1 * noise)
            elif name.endswith(".bias") or name.endswith("_bias"):
                p.copy_(0.2 * noise)
            elif name.endswith(".sinks"):  # around the scores, so some heads mostly sink
                p.copy_(noise)
            else:
                p.copy_(0.3 * noise)
    return model


def stock_f64(family, seed=0):
    """The family's tiny model in float64 with random weights, in train mode (no dropout here)."""
    with Float64Everywhere():
        torch.manual_seed(seed)
        model = FAMILIES[family]().to(torch.float64)
    return randomize(model, seed).train()


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, L), generator=g)


def run(model, ids):
    """Logits, loss (with the aux loss where the config asks for it) and every gradient."""
    model.zero_grad(set_to_none=True)
    with Float64Everywhere():
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.requires_grad and p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads


def worst_relative(a, b):
    """max |a - b| / max |b| (0 when both are 0)."""
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / scale if scale > 0 else (a - b).abs().max().item()


def compare(ours, stock, rtol):
    """Raises AssertionError naming the worst tensor when any part differs by more than rtol."""
    (lo, lso, go), (ls, lss, gs) = ours, stock
    assert set(go) == set(gs), f"gradients differ in names: {sorted(set(go) ^ set(gs))}"
    report = {"logits": worst_relative(lo, ls), "loss": worst_relative(lso, lss)}
    report.update({f"grad {n}": worst_relative(go[n], gs[n]) for n in gs})
    name, worst = max(report.items(), key=lambda kv: kv[1])
    assert worst <= rtol, f"{name} differs by {worst:.3g} relative (> {rtol:g})"
    return report


def twin(model):
    return copy.deepcopy(model)


def tiered_with(stock, path, adapt, order="peft first"):
    """A twin of `stock` on a TierMoE path ("experts": experts_implementation="tiermoe";
    "patch": tiermoe.torch.patch) with `adapt` (e.g. PEFT's get_peft_model) applied to it, under
    patch before it or after it."""
    import tiermoe.torch
    import tiermoe.transformers  # noqa: F401
    model = twin(stock)
    if path == "experts":
        model.set_experts_implementation("tiermoe")
        return adapt(model)
    if order == "patch first":
        return adapt(tiermoe.torch.patch(model))
    model = adapt(model)
    tiermoe.torch.patch(model)
    return model
