"""`tiermoe quantize`'s checkpoints read by the libraries users load and serve them with:
compressed-tensors parses the config and, packing the source weights with the file's own scales,
writes the very same words; transformers 5 loads the directory (dequantize=True) to the values
compressed-tensors decompresses, and its loss is the source model's within the quantization's
error."""
import json
import os
import subprocess

import pytest
import torch
import transformers
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationConfig
from safetensors import safe_open

from hf_models import Float64Everywhere

FAMILY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "families",
                      "qwen3_moe_yarn")


def tensors(path):
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def eval_loss(model, ids):
    with torch.no_grad(), Float64Everywhere():
        logits = model.to(torch.float64)(input_ids=ids[:, :-1]).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 ids[:, 1:].reshape(-1)).item()


@pytest.mark.parametrize("experts,bits", [("int4", 4), ("int8", 8)])
def test_quantize_output_reads_in_compressed_tensors_and_transformers(experts, bits, tmp_path):
    out = str(tmp_path / "q")
    subprocess.run([os.environ["TIERMOE_CLI"], "quantize", "--model", FAMILY, "--out", out,
                    "--experts", experts, "--group", "16"], check=True, capture_output=True)
    config = json.load(open(os.path.join(out, "config.json")))
    # compressed-tensors' own schema of the config, and the compressor it builds from it.
    parsed = QuantizationConfig.model_validate(config["quantization_config"])
    scheme = parsed.config_groups["group_0"]
    assert ModelCompressor.from_compression_config(
        transformers.CompressedTensorsConfig.from_dict(config["quantization_config"])
    ).quantization_config == parsed
    assert scheme.weights.num_bits == bits and scheme.weights.group_size == 16

    src, got = tensors(FAMILY), tensors(out)
    modules = sorted(k[:-len(".weight_packed")] for k in got if k.endswith(".weight_packed"))
    assert len(modules) == 2 * 4 * 3  # layers x experts x (gate, up, down): nothing else
    decoded = {}
    for m in modules:
        weight = src[m + ".weight"].to(torch.float32)
        ours = {k: got[m + "." + k] for k in ("weight_packed", "weight_scale", "weight_shape")}
        theirs = PackedQuantizationCompressor.compress(
            {"weight": weight, "weight_scale": ours["weight_scale"]}, scheme)
        assert torch.equal(theirs["weight_packed"], ours["weight_packed"]), m
        assert torch.equal(theirs["weight_shape"], ours["weight_shape"]), m
        decoded[m] = PackedQuantizationCompressor.decompress(dict(ours), scheme)["weight"]
        step = ours["weight_scale"].to(torch.float32).repeat_interleave(16, dim=1)
        # Half a step, what the scale's rounding to bf16 moves the largest codes (which may
        # then saturate), and the value's own rounding to bf16.
        bound = step / 2 + weight.abs() * 2 ** -8 + (weight.abs() + step) * 2 ** -9
        assert ((decoded[m].float() - weight).abs() <= bound).all(), m

    model = transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float64, attn_implementation="eager", experts_implementation="eager",
        quantization_config=transformers.CompressedTensorsConfig(dequantize=True))
    params = dict(model.named_parameters())
    for layer in range(2):
        gate_up = params[f"model.layers.{layer}.mlp.experts.gate_up_proj"]
        down = params[f"model.layers.{layer}.mlp.experts.down_proj"]
        for e in range(4):
            p = f"model.layers.{layer}.mlp.experts.{e}."
            want = torch.cat([decoded[p + "gate_proj"], decoded[p + "up_proj"]])
            assert torch.equal(gate_up[e].to(want.dtype), want)
            assert torch.equal(down[e].to(want.dtype), decoded[p + "down_proj"])

    base = transformers.AutoModelForCausalLM.from_pretrained(
        FAMILY, dtype=torch.float64, attn_implementation="eager", experts_implementation="eager")
    ids = torch.arange(17).reshape(1, 17) % config["vocab_size"]
    assert abs(eval_loss(model, ids) - eval_loss(base, ids)) < (0.2 if bits == 4 else 0.02)
