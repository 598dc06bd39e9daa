"""PEFT's LoRA on the experts (target_parameters) computed by the engine, against stock
transformers + PEFT in f64, whose experts run W + scaling * B A per expert (PEFT's own fold):
loss and every gradient (attention and expert LoRA factors) to 1e-9 relative. The engine
computes the adapters from their factors, and PEFT's fold never runs (under the experts backend
TierMoE has PEFT register its parametrization without torch's check, which would run it),
gpt-oss's x-major experts with their interleaved gate and up rows included. Shown to fail when
the engine reads down_proj's A and B swapped, and gpt-oss's gate and up rows as halves."""
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

import tiermoe.torch
import tiermoe.transformers  # noqa: F401
from hf_models import (Float64Everywhere, batch, compare, run, stock_f64, tiered_with, twin,
                       worst_relative)
from tiermoe import _lora, _ops

RTOL = 1e-9
EXPERT_PARAMS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


def with_expert_lora(model, targets=EXPERT_PARAMS, seed=5):
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                     target_parameters=targets)
    with Float64Everywhere():
        model = get_peft_model(model, cfg)
    return randomize_adapters(model, seed)


def with_expert_lora_function(model, seed=5):
    """The same adapter as with_expert_lora's, from tiermoe.torch.expert_lora."""
    with Float64Everywhere():
        model = tiermoe.torch.expert_lora(
            model, r=4, alpha=8, config=LoraConfig(r=4, lora_alpha=8,
                                                   target_modules=["q_proj", "v_proj"]))
    return randomize_adapters(model, seed)


def randomize_adapters(model, seed=5):
    """Every LoRA factor drawn from `seed` (B too, which PEFT starts at 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def count_folds(monkeypatch):
    """Counts the runs of PEFT's dense fold W + scaling * B A, and the gradients that flow
    through it (none may: the engine trains the factors)."""
    import peft.tuners.lora.layer as layer
    fold = layer._LoraFactorsProxy.forward
    counts = {"folds": 0}

    def counted(self, W):
        counts["folds"] += 1
        out = fold(self, W)
        if out.requires_grad:
            out.register_hook(lambda g: counts.__setitem__("grads", counts.get("grads", 0) + 1))
        return out

    monkeypatch.setattr(layer._LoraFactorsProxy, "forward", counted)
    return counts


@pytest.mark.parametrize("adapt", [with_expert_lora, with_expert_lora_function],
                         ids=["LoraConfig", "expert_lora"])
@pytest.mark.parametrize("path,order", [("experts", None), ("patch", "peft first"),
                                        ("patch", "patch first")])
@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "deepseek_v3", "qwen3_5_moe",
                                    "gpt_oss"])
def test_expert_lora_equals_stock_peft(family, path, order, adapt, monkeypatch):
    stock = stock_f64(family)
    want = run(with_expert_lora(twin(stock)), batch())
    model = tiered_with(stock, path, adapt, order)
    counts = count_folds(monkeypatch)
    report = compare(run(model, batch()), want, RTOL)
    assert counts["folds"] == 0, counts
    assert "grads" not in counts, "a gradient flowed through PEFT's dense fold"
    assert any("experts" in k and "lora_A" in k for k in report)
    assert any("experts" in k and "lora_B" in k for k in report)


def with_two_active_adapters(model):
    model = with_expert_lora(model)
    model.add_adapter("other", LoraConfig(r=2, target_parameters=EXPERT_PARAMS))
    model.base_model.set_adapter(["default", "other"])
    return randomize_adapters(model)


def test_two_active_adapters_fall_back_to_peft_and_equal_it():
    stock = stock_f64("qwen3_moe")
    want = run(with_two_active_adapters(twin(stock)), batch())
    model = tiered_with(stock, "experts", with_two_active_adapters)
    compare(run(model, batch()), want, RTOL)
    modules = set(model.modules())
    engines = [e for m, e in _ops._ENGINES.items() if m in modules]
    assert engines and all(e.op.lora_rank == 0 for e in engines), "the engine ran a LoRA"


def test_patch_refuses_expert_lora_it_does_not_compute():
    model = tiered_with(stock_f64("qwen3_moe"), "patch", with_two_active_adapters)
    with pytest.raises(tiermoe.TierMoEError, match="several active adapters"):
        run(model, batch())


@pytest.mark.parametrize("path", ["experts", "patch"])
def test_fails_with_down_projs_a_and_b_swapped(path, monkeypatch):
    stock = stock_f64("qwen3_moe")
    want = run(with_expert_lora(twin(stock)), batch())
    init = _lora.EngineLora.__init__

    def swapped(self, factors, dtype, interleaved=False):
        init(self, factors, dtype, interleaved)
        A, B = self.held["down"]  # [E, R, F] and [E, D, R]: D == F here
        self.held["down"] = (B.transpose(1, 2).contiguous(), A.transpose(1, 2).contiguous())

    monkeypatch.setattr(_lora.EngineLora, "__init__", swapped)
    with pytest.raises(AssertionError, match="differs by"):
        compare(run(tiered_with(stock, path, with_expert_lora), batch()), want, RTOL)


@pytest.mark.parametrize("path", ["experts", "patch"])
def test_fails_with_gpt_oss_gate_and_up_rows_read_as_halves(path, monkeypatch):
    stock = stock_f64("gpt_oss")
    want = run(with_expert_lora(twin(stock)), batch())
    init = _lora.EngineLora.__init__
    monkeypatch.setattr(_lora.EngineLora, "__init__",
                        lambda self, factors, dtype, interleaved=False: init(self, factors, dtype))
    with pytest.raises(AssertionError, match="differs by"):
        compare(run(tiered_with(stock, path, with_expert_lora), batch()), want, RTOL)


def test_frozen_base_trains_only_the_adapters():
    model = tiered_with(stock_f64("qwen3_moe"), "experts", with_expert_lora)
    run(model, batch())
    experts = model.base_model.model.model.layers[0].mlp.experts
    base = experts.get_base_layer() if hasattr(experts, "get_base_layer") else experts
    assert base.gate_up_proj.grad is None and base.down_proj.grad is None
    assert experts.lora_A["default"].weight.grad is not None


def test_patch_with_the_adapter_disabled_or_merged_runs_the_base():
    stock = stock_f64("qwen3_moe")

    def logits(model):
        with Float64Everywhere(), torch.no_grad():
            return model(input_ids=batch()).logits

    model = tiered_with(stock, "patch", with_expert_lora)
    with model.disable_adapter():  # attention LoRA off as well: the stock model itself
        assert worst_relative(logits(model), logits(twin(stock))) <= RTOL
    want = logits(with_expert_lora(twin(stock)))
    model.merge_adapter()  # into the weights, which the engine then reads
    assert worst_relative(logits(model), want) <= RTOL


def test_stock_peft_keeps_its_fold(monkeypatch):
    """The registration change applies to experts that run in TierMoE only."""
    counts = count_folds(monkeypatch)
    run(with_expert_lora(twin(stock_f64("qwen3_moe"))), batch())
    assert counts["folds"] > 0 and counts.get("grads", 0) > 0, counts


def sgd_steps(model, steps, seed):
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    losses = []
    for k in range(steps):
        ids = batch(seed=seed + k)
        with Float64Everywhere():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_expert_lora_saves_an_adapter_stock_peft_loads_and_that_loads_back_and_continues(
        tmp_path):
    """Experts at their own rank and alpha beside attention's (PEFT's rank_pattern and
    alpha_pattern): trained two steps and saved; stock transformers + PEFT loads the adapter and
    gives the same loss; loaded back into TierMoE it continues as the run that saved it."""
    stock = stock_f64("qwen3_moe")
    attention = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])

    def make():
        model = twin(stock)
        model.set_experts_implementation("tiermoe")
        return model

    with Float64Everywhere():
        model = tiermoe.torch.expert_lora(make(), r=2, alpha=6, config=attention)
    randomize_adapters(model)
    experts = model.base_model.model.model.layers[0].mlp.experts
    assert experts.lora_A["default"].weight.shape[0] == 2 * experts.num_experts  # rank 2
    assert experts.scaling["default"] == 3.0
    sgd_steps(model, 2, seed=20)
    model.save_pretrained(tmp_path)

    ids = batch(seed=30)
    with Float64Everywhere(), torch.no_grad():
        ours = model(input_ids=ids, labels=ids).loss.item()
        on_stock = PeftModel.from_pretrained(twin(stock), tmp_path)
        theirs = on_stock(input_ids=ids, labels=ids).loss.item()
    assert abs(ours - theirs) <= RTOL * abs(theirs), (ours, theirs)

    with Float64Everywhere():
        loaded = PeftModel.from_pretrained(make(), tmp_path, is_trainable=True)
    assert sgd_steps(loaded, 2, seed=40) == sgd_steps(model, 2, seed=40)


def test_expert_lora_refuses_what_peft_would_not_save_or_run():
    stock = stock_f64("qwen3_moe")
    with pytest.raises(tiermoe.TierMoEError, match="dropout"):
        tiermoe.torch.expert_lora(twin(stock), dropout=0.1)
    with pytest.raises(tiermoe.TierMoEError, match="lora_dropout=0.0 in config"):
        tiermoe.torch.expert_lora(twin(stock), config=LoraConfig(target_modules=["q_proj"],
                                                                lora_dropout=0.05))
    with pytest.raises(tiermoe.TierMoEError, match="gate_up_proj, down_proj"):
        tiermoe.torch.expert_lora(twin(stock), targets=("up_proj",))
    with pytest.raises(tiermoe.TierMoEError, match="positive rank"):
        tiermoe.torch.expert_lora(twin(stock), r=0)
    with pytest.raises(tiermoe.TierMoEError, match="PeftModel already"):
        tiermoe.torch.expert_lora(with_expert_lora(twin(stock)))
    with pytest.raises(tiermoe.TierMoEError, match="no experts module"):
        tiermoe.torch.expert_lora(torch.nn.Sequential(torch.nn.Linear(4, 4)))
