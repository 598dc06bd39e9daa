"""Both entry points under what fine-tuning adds around them: PEFT's LoRA on attention (applied
before or after patch), gradient checkpointing (where the MoE blocks keep nothing between
forward and backward), and save_pretrained writing the stock layout. Stock transformers + PEFT
in f64 is the reference, to 1e-9 relative."""
import contextlib

import pytest
import torch
import transformers
from peft import LoraConfig, get_peft_model

import tiermoe.torch
import tiermoe.transformers  # noqa: F401
from hf_models import FAMILIES, Float64Everywhere, batch, compare, run, stock_f64, tiered_with, twin

RTOL = 1e-9
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def with_lora(model, seed=3):
    with Float64Everywhere():
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # A is drawn from the global RNG and B is zero: both from `seed`
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("path,order", [("experts", None), ("patch", "patch first"),
                                        ("patch", "peft first")])
def test_attention_lora_equals_stock_peft(family, path, order):
    stock = stock_f64(family)
    want = run(with_lora(twin(stock)), batch())
    got = run(tiered_with(stock, path, with_lora, order), batch())
    report = compare(got, want, RTOL)
    assert any("lora_A" in k for k in report) and all("experts" not in k for k in report)


@pytest.mark.parametrize("family", ["qwen2_moe", "gpt_oss"])
@pytest.mark.parametrize("path", ["experts", "patch"])
def test_gradient_checkpointing_equals_stock(family, path):
    stock = stock_f64(family)
    want = run(stock, batch())
    model = twin(stock)
    if path == "experts":
        model.set_experts_implementation("tiermoe")
    else:
        tiermoe.torch.patch(model)
    # The recomputation runs inside backward, where the forward's TorchFunctionMode is not
    # active: context_fn puts the f64 mode around it too.
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={
        "use_reentrant": False,
        "context_fn": lambda: (contextlib.nullcontext(), Float64Everywhere())})
    assert model.is_gradient_checkpointing
    compare(run(model, batch()), want, RTOL)
    # Between forward and backward the blocks keep nothing: the recomputation rebuilds it.
    model.zero_grad(set_to_none=True)
    with Float64Everywhere():
        loss = model(input_ids=batch(), labels=batch()).loss
    nodes = moe_nodes(loss)
    assert len(nodes) == moe_layers(model) and all(n.kept is None for n in nodes)
    with Float64Everywhere():
        loss.backward()
    assert all(n.kept is not None for n in nodes)  # what the recomputation kept, read


def moe_layers(model):
    return sum(1 for m in model.modules() if "gate_up_proj" in m._parameters)


def moe_nodes(loss):
    """The engine's autograd nodes (RoutedMoe's or BlockMoe's) in the graph of `loss`."""
    seen, todo, found = set(), [loss.grad_fn], []
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ in ("RoutedMoeBackward", "BlockMoeBackward"):
            found.append(node)
        todo.extend(n for n, _ in node.next_functions)
    return found


@pytest.mark.parametrize("path", ["experts", "patch"])
def test_without_checkpointing_the_blocks_keep_their_saves(path):
    model = twin(stock_f64("qwen3_moe"))
    if path == "experts":
        model.set_experts_implementation("tiermoe")
    else:
        tiermoe.torch.patch(model)
    with Float64Everywhere():
        loss = model(input_ids=batch(), labels=batch()).loss
    nodes = moe_nodes(loss)
    assert len(nodes) == moe_layers(model) and all(n.kept for n in nodes)


@pytest.mark.parametrize("path", ["experts", "patch"])
def test_save_pretrained_writes_the_stock_checkpoint(path, tmp_path):
    stock = stock_f64("qwen2_moe")
    model = twin(stock)
    if path == "experts":
        model.set_experts_implementation("tiermoe")
    else:
        tiermoe.torch.patch(model)
    run(model, batch())
    stock.save_pretrained(tmp_path / "stock")
    model.save_pretrained(tmp_path / "ours")
    from safetensors.torch import load_file
    a = load_file(tmp_path / "stock" / "model.safetensors")
    b = load_file(tmp_path / "ours" / "model.safetensors")
    assert sorted(a) == sorted(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # Stock transformers loads it as it loads its own.
    reload = [transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / d, dtype=torch.float64, experts_implementation="eager").train()
        for d in ("stock", "ours")]
    compare(run(reload[1], batch()), run(reload[0], batch()), 0.0)
