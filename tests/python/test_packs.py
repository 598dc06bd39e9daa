"""The packed copies of the expert weights (the grouped kernels' layout) follow the torch
tensors' version counters: frozen experts are packed once over many steps, trainable ones
again after each optimizer step, and never in between."""
import pytest
import torch

import tiermoe.torch
import tiermoe.transformers  # noqa: F401
from hf_models import batch, stock_f64, twin
from tiermoe import _ops


def bf16_model(path):
    model = twin(stock_f64("qwen3_moe")).to(torch.bfloat16)
    if path == "experts":
        model.set_experts_implementation("tiermoe")
    else:
        tiermoe.torch.patch(model)
    return model


def experts_modules(model):
    return [m for m in model.modules() if type(m).__name__ == "Qwen3MoeExperts"]


def pack_counts(model):
    """Packs so far per MoE layer (the experts backend keys its engines by experts module,
    patch by TieredMoE block)."""
    return [_ops._ENGINES[m].op.pack_stats()["packs"] for m in model.modules() if m in _ops._ENGINES]


def train_steps(model, steps, train_experts=None):
    """SGD steps; pack counts after each. train_experts: whether the experts train (None: as
    they are)."""
    if train_experts is not None:
        for m in experts_modules(model):
            m.gate_up_proj.requires_grad_(train_experts)
            m.down_proj.requires_grad_(train_experts)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    counts = []
    for _ in range(steps):
        model(input_ids=batch(), labels=batch()).loss.backward()
        opt.step()
        opt.zero_grad()
        counts.append(pack_counts(model))
    return counts


@pytest.mark.parametrize("path", ["experts", "patch"])
def test_frozen_experts_are_packed_once(path):
    counts = train_steps(bf16_model(path), 4, train_experts=False)
    assert all(c > 0 for c in counts[0]), f"the grouped kernels never packed: {counts[0]}"
    assert counts[-1] == counts[0], f"frozen experts repacked: {counts}"


@pytest.mark.parametrize("path", ["experts", "patch"])
def test_trainable_experts_are_repacked_after_each_step(path):
    counts = train_steps(bf16_model(path), 4, train_experts=True)
    per_step = [[b - a for a, b in zip(x, y)] for x, y in zip(counts, counts[1:])]
    assert all(d == counts[0] for d in per_step), f"packs per step {per_step}, first {counts[0]}"
    assert all(c > 0 for c in counts[0])


@pytest.mark.parametrize("path", ["experts", "patch"])
def test_experts_under_expert_lora_are_packed_once_and_again_after_a_merge(path):
    """PEFT's expert LoRA leaves the frozen weights to the grouped kernels (its branches run
    beside them). PEFT registers its parametrization at every forward, which sets each weight to
    itself and moves its version counter; that is not a change, so nothing is repacked. Merging
    the adapter into the weights is one, and the engine's next forward reads the merged weights."""
    model = tiermoe.torch.expert_lora(bf16_model(path), r=2, alpha=4)
    counts = train_steps(model, 4)
    assert all(c > 0 for c in counts[0]), f"the grouped kernels never packed: {counts[0]}"
    assert counts[-1] == counts[0], f"frozen experts under expert LoRA repacked: {counts}"
    with torch.no_grad():
        before = model(input_ids=batch()).logits
        model.merge_adapter()
        merged = model(input_ids=batch()).logits
        model.unmerge_adapter()
    assert pack_counts(model) != counts[-1], "the merged weights were not packed"
    assert (merged - before).abs().max() <= 0.05 * before.abs().max()  # the same model, in bf16
