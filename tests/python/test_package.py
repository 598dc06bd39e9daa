"""The package itself: importing it, tensors crossing without a copy, the CLI entry point, and
the errors a user sees for bad use."""
import subprocess
import sys

import pytest
import torch

import tiermoe
import tiermoe.torch
import tiermoe.transformers  # noqa: F401
from hf_models import stock_f64, twin
from tiermoe import _core, _ops


def test_import_needs_no_torch():
    code = "import sys, tiermoe; print(tiermoe.__version__, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    version, torch_loaded = out.stdout.split()
    assert version == tiermoe.__version__ and torch_loaded == "False"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_tensors_cross_without_a_copy(dtype):
    t = torch.randn(5, 7).to(dtype)
    assert _core.view_address(t) == t.data_ptr()  # into the engine
    back = torch.from_dlpack(_core.round_trip(t))  # into the engine and out again
    assert back.data_ptr() == t.data_ptr() and back.dtype == dtype and back.shape == t.shape


def test_a_non_contiguous_tensor_is_refused_not_copied():
    t = torch.randn(4, 6).t()
    with pytest.raises(TypeError):
        _core.view_address(t)


def test_engine_reads_the_experts_where_torch_keeps_them():
    model = twin(stock_f64("qwen3_moe"))
    model.set_experts_implementation("tiermoe")
    model(input_ids=torch.zeros(1, 4, dtype=torch.long))
    experts = model.model.layers[0].mlp.experts
    engine = _ops._ENGINES[experts]
    w13, w2 = engine._experts_held[:2]
    assert w13.data_ptr() == experts.gate_up_proj.data_ptr()
    assert w2.data_ptr() == experts.down_proj.data_ptr()


def test_cli_entry_point_runs_the_binary():
    out = subprocess.run([sys.executable, "-m", "tiermoe._cli", "--version"], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert tiermoe.__version__ in out.stdout
    help_out = subprocess.run([sys.executable, "-m", "tiermoe._cli", "--help"],
                              capture_output=True, text=True)
    assert help_out.returncode == 0 and "train" in help_out.stdout


def test_patch_twice_is_refused():
    model = tiermoe.torch.patch(twin(stock_f64("qwen3_moe")))
    with pytest.raises(tiermoe.TierMoEError, match="already a TieredMoE.*called twice"):
        tiermoe.torch.patch(model)


def test_patch_of_a_model_without_moe_blocks_is_refused():
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=1, num_attention_heads=2)
    with pytest.raises(tiermoe.TierMoEError, match="no MoE block TierMoE knows in LlamaForCausalLM"):
        tiermoe.torch.patch(transformers.LlamaForCausalLM(cfg))


def test_a_dtype_tiermoe_was_not_given_is_refused():
    model = twin(stock_f64("mixtral")).to(torch.float16)
    with pytest.raises(tiermoe.TierMoEError, match=r"model\.layers\.0\.mlp: the experts are torch\.float16"):
        tiermoe.torch.patch(model)
    model.set_experts_implementation("tiermoe")
    with pytest.raises(tiermoe.TierMoEError, match="MixtralExperts.*torch.float16"):
        model(input_ids=torch.zeros(1, 4, dtype=torch.long))


def test_hidden_states_in_another_dtype_are_refused():
    model = tiermoe.torch.patch(twin(stock_f64("qwen3_moe")))
    block = model.model.layers[0].mlp
    with pytest.raises(tiermoe.TierMoEError, match=r"model\.layers\.0\.mlp: hidden_states are torch\.float32"):
        block(torch.zeros(1, 3, 16, dtype=torch.float32))


def test_the_device_tier_needs_its_budget_and_a_device():
    with pytest.raises(tiermoe.TierMoEError, match="device_memory must be given"):
        tiermoe.torch.patch(twin(stock_f64("qwen3_moe")), device="cpu")
    with pytest.raises(tiermoe.TierMoEError, match="needs device="):
        tiermoe.torch.patch(twin(stock_f64("qwen3_moe")), placement="device")
    with pytest.raises(tiermoe.TierMoEError, match="has no device tier"):
        tiermoe.torch.stats(tiermoe.torch.patch(twin(stock_f64("qwen3_moe"))))


def test_an_unknown_remat_policy_names_the_flag():
    with pytest.raises(tiermoe.TierMoEError, match="remat"):
        tiermoe.torch.patch(twin(stock_f64("qwen3_moe")), remat="sometimes")


def test_engine_errors_carry_where_and_hint():
    with pytest.raises(tiermoe.TierMoEError, match="absorb_scores"):
        tiermoe.torch.patch(twin(stock_f64("qwen3_moe")), absorb_scores="maybe")


def test_hidden_states_off_the_cpu_are_refused():
    model = twin(stock_f64("qwen3_moe"))
    model.set_experts_implementation("tiermoe")
    experts = model.model.layers[0].mlp.experts
    x = torch.zeros(3, 16, dtype=torch.float64, device="meta")
    ids = torch.zeros(3, 2, dtype=torch.long, device="meta")
    with pytest.raises(tiermoe.TierMoEError, match="hidden_states are on meta; this TierMoE path runs CPU"):
        experts(x, ids, torch.zeros(3, 2, dtype=torch.float64, device="meta"))


def test_from_pretrained_with_experts_implementation_tiermoe(tmp_path):
    import transformers
    stock = stock_f64("gpt_oss")
    stock.save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float64, experts_implementation="tiermoe")
    assert model.config._experts_implementation == "tiermoe"
    model(input_ids=torch.zeros(1, 4, dtype=torch.long))
    engines = [m for m in model.modules() if m in _ops._ENGINES]
    assert len(engines) == stock.config.num_hidden_layers
    assert all(type(m).__name__ == "GptOssExperts" for m in engines)
