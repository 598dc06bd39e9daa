"""Both entry points against stock transformers 5 in f64, for every family TierMoE runs.

The experts backend (experts_implementation="tiermoe": transformers routes, the
engine runs the experts) and tiermoe.torch.patch (the engine runs the block,
router included) must give stock's logits, loss (with the aux loss) and every
gradient (attention, norms, routers, the trainable experts) to 1e-9 relative.
Each comparison is also shown to fail when the engine is fed a doubled score
or reads an expert's down_proj transposed.
"""
import pytest
import torch

import tiermoe.torch
import tiermoe.transformers  # noqa: F401  (registers "tiermoe")
from hf_models import FAMILIES, SCALED, batch, compare, run, stock_f64, twin
from tiermoe import _ops

PATHS = ("experts", "patch")
RTOL = 1e-9


def tiered(stock, path):
    model = twin(stock)
    if path == "experts":
        model.set_experts_implementation("tiermoe")
    else:
        tiermoe.torch.patch(model)
    return model


@pytest.fixture(scope="module")
def stock_runs():
    cache = {}

    def get(family):
        if family not in cache:
            stock = stock_f64(family)
            cache[family] = (stock, run(stock, batch()))
        return cache[family]

    return get


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("family", FAMILIES)
def test_equals_stock(stock_runs, family, path):
    stock, want = stock_runs(family)
    got = run(tiered(stock, path), batch())
    report = compare(got, want, RTOL)
    assert any(k.startswith("grad") and "experts" in k for k in report), "no expert gradient compared"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("family", FAMILIES)
def test_fails_on_a_transposed_down_proj(stock_runs, family, path, monkeypatch):
    stock, want = stock_runs(family)
    sync = _ops.EngineMoe.sync_experts

    def transposed(self, w13, w2, b13=None, b2=None):
        return sync(self, w13, w2.transpose(1, 2), b13, b2)  # square per expert: same shape

    monkeypatch.setattr(_ops.EngineMoe, "sync_experts", transposed)
    with pytest.raises(AssertionError, match="differs by"):
        compare(run(tiered(stock, path), batch()), want, RTOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_experts_backend_fails_on_a_doubled_score(stock_runs, family):
    stock, want = stock_runs(family)
    model = tiered(stock, "experts")
    for m in model.modules():
        if type(m).__name__.endswith("Experts"):
            m.register_forward_pre_hook(lambda m, args: (args[0], args[1], 2 * args[2]))
    with pytest.raises(AssertionError, match="differs by"):
        compare(run(model, batch()), want, RTOL)


@pytest.mark.parametrize("family", sorted(SCALED))
def test_patch_fails_on_a_doubled_score(stock_runs, family):
    """The engine's router scales its weights by routed_scaling_factor: doubling it there (and
    only there: stock's router is not run by a patched model) doubles every score."""
    stock, want = stock_runs(family)
    model = twin(stock)
    for m in model.modules():
        if hasattr(m, "routed_scaling_factor"):
            m.routed_scaling_factor *= 2
    tiermoe.torch.patch(model)
    with pytest.raises(AssertionError, match="differs by"):
        compare(run(model, batch()), want, RTOL)


def test_patch_scores_go_to_the_same_modules(stock_runs):
    """A patched model keeps its parameter names and tensors: nothing is copied."""
    stock, _ = stock_runs("qwen2_moe")
    model = twin(stock)
    before = {n: p.data_ptr() for n, p in model.named_parameters()}
    tiermoe.torch.patch(model)
    after = {n: p.data_ptr() for n, p in model.named_parameters()}
    assert after == before
    assert sum(isinstance(m, tiermoe.torch.TieredMoE) for m in model.modules()) == 2
    assert torch.equal(model.state_dict()["model.layers.0.mlp.experts.gate_up_proj"],
                       stock.state_dict()["model.layers.0.mlp.experts.gate_up_proj"])
