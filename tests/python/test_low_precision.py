"""Both entry points in f32 and bf16 at Qwen3-30B-A3B's MoE layer shapes (D 2048, F 768, E 128,
top-8), against stock transformers in the same dtype.

The tolerance, argued: stock and TierMoE round at different points (stock rounds the W13 output,
the activation, the W2 output, the score product and the K-way index_add to the dtype; TierMoE
accumulates in fp32, absorbs the score before W2 and rounds once per product; its router logits
are fp32 where stock's nn.Linear rounds them to bf16). Neither is the exact result, so each is
measured against the exact one: the same block and the same (rounded) weights in f64, by the
relative Frobenius error of the output, the input gradient, the router's gradient and (f32,
trainable experts) the experts' gradients. In bf16 TierMoE must be at least as close to it as
stock is, within 25%. In f32 both must be within 1e-5 of it: the products run over 2048 and 768
terms at 6e-8 unit roundoff (measured 2026-12-06: stock 6.5e-7, TierMoE 1.4e-6 to 2e-6; the
summation orders differ, and at this size a factor of 2 either way is rounding noise).
"""
import copy

import pytest
import torch
import transformers

import tiermoe.torch
import tiermoe.transformers  # noqa: F401
from hf_models import Float64Everywhere

T = 256
CONFIG = dict(vocab_size=64, hidden_size=2048, moe_intermediate_size=768, num_experts=128,
              num_experts_per_tok=8, norm_topk_prob=True, num_hidden_layers=1,
              num_attention_heads=32, num_key_value_heads=4, head_dim=128,
              experts_implementation="eager")
# Trainable experts hold gradients beside the weights (three blocks' worth with the f64
# reference): their check cuts the expert count to fit a 24 GiB machine, the shapes kept.
TRAINED_EXPERTS = 32


def make_block(dtype, num_experts):
    cfg = transformers.Qwen3MoeConfig(**dict(CONFIG, num_experts=num_experts))
    block = transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (2048 ** -0.5))
    return block.to(dtype)


def relative(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def run_block(block, x, train_experts):
    block.experts.gate_up_proj.requires_grad_(train_experts)
    block.experts.down_proj.requires_grad_(train_experts)
    x = x.clone().requires_grad_(True)
    out = block(x)
    g = torch.Generator().manual_seed(2)
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
    out.backward(dout)
    res = {"out": out.detach(), "dx": x.grad, "d gate.weight": block.gate.weight.grad}
    if train_experts:
        res["d gate_up_proj"] = block.experts.gate_up_proj.grad
        res["d down_proj"] = block.experts.down_proj.grad
    block.zero_grad(set_to_none=True)
    return res


def tiered(block, path):
    if path == "experts":
        block.experts.config._experts_implementation = "tiermoe"
        return block
    holder = torch.nn.Module()
    holder.mlp = block
    tiermoe.torch.patch(holder)
    return holder.mlp


def check(path, dtype, num_experts, train_experts):
    x = torch.randn(1, T, 2048, generator=torch.Generator().manual_seed(1)).to(dtype)
    block = make_block(dtype, num_experts)
    stock = run_block(block, x, train_experts)
    ours = run_block(tiered(copy.deepcopy(block), path), x, train_experts)
    # The exact result: the same rounded weights and input, in f64 throughout.
    block.experts.config._experts_implementation = "eager"
    block.to(torch.float64)
    with Float64Everywhere():
        exact = run_block(block, x.double(), train_experts)
    for name in exact:
        e_ours, e_stock = relative(ours[name], exact[name]), relative(stock[name], exact[name])
        print(f"{path} {dtype} E={num_experts} {name}: TierMoE {e_ours:.3g}, stock {e_stock:.3g} "
              "(relative to exact)")
        if dtype == torch.float32:
            assert e_ours <= 1e-5 and e_stock <= 1e-5, f"{name}: TierMoE {e_ours:.3g}, stock {e_stock:.3g}"
        else:
            assert e_ours <= 1.25 * e_stock, f"{name}: TierMoE {e_ours:.3g} vs stock {e_stock:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", ["experts", "patch"])
def test_frozen_experts_as_close_to_exact_as_stock(dtype, path):
    check(path, dtype, 128, train_experts=False)


@pytest.mark.parametrize("path", ["experts", "patch"])
def test_trained_experts_as_close_to_exact_as_stock(path):
    check(path, torch.float32, TRAINED_EXPERTS, train_experts=True)
