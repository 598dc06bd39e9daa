#!/usr/bin/env python3
"""Regenerates the whole-model fixtures in this directory (see README.md).

  cmake -S . -B build-twin -G Ninja -DCMAKE_BUILD_TYPE=Release
  cmake --build build-twin -j2 --target tiermoe
  /usr/bin/python3 tests/data/model/make_fixtures.py --tiermoe build-twin/tiermoe

Each case: `tiermoe init --preset tiny --dtype f64 --seed N` writes the checkpoint,
Python edits config.json (and, for variants, the weights), writes tokens.npy, then
scripts/fixtures/qwen3_moe_twin.py writes expected.json and grads.safetensors.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "scripts", "fixtures"))
import qwen3_moe_twin as twin  # noqa: E402

SEQ_LEN, BATCH = 16, 2


def init_checkpoint(tiermoe, out, seed):
    if os.path.exists(out):
        shutil.rmtree(out)
    subprocess.run([tiermoe, "init", "--preset", "tiny", "--out", out, "--dtype", "f64", "--seed", str(seed)],
                   check=True)


def edit_config(path, **changes):
    with open(path) as f:
        c = json.load(f)
    c.update(changes)
    with open(path, "w") as f:
        json.dump(c, f, indent=2)
        f.write("\n")


def write_tokens(path, vocab, seed, dtype):
    rng = np.random.default_rng(seed)
    np.save(path, rng.integers(0, vocab, size=BATCH * SEQ_LEN + 1).astype(dtype))


def make_moe(tiermoe):
    """(a) the tiny preset as `tiermoe init` writes it: 2 MoE layers, untied, norm_topk_prob."""
    d = os.path.join(HERE, "moe")
    init_checkpoint(tiermoe, d, seed=1)
    write_tokens(os.path.join(d, "tokens.npy"), 256, seed=11, dtype=np.int32)
    return d


def make_dense_tied_aux(tiermoe):
    """(b) layer 0 dense (mlp_only_layers [0]), tied embeddings, no top-k renormalisation, aux loss on.

    The init weights stay except: layer 0's router and experts become a dense SwiGLU MLP of
    intermediate_size, lm_head.weight is dropped, and every RMSNorm weight becomes
    1 + 0.1 * N(0, 1) (init leaves them at ones, where a missing `* weight` would go unseen).
    """
    d = os.path.join(HERE, "dense_tied_aux")
    init_checkpoint(tiermoe, d, seed=2)
    edit_config(os.path.join(d, "config.json"), mlp_only_layers=[0], tie_word_embeddings=True,
                norm_topk_prob=False, output_router_logits=True)
    with open(os.path.join(d, "config.json")) as f:
        cfg = twin.Config(json.load(f))
    tensors = twin.read_safetensors(os.path.join(d, "model.safetensors"))
    del tensors["lm_head.weight"]
    for name in [n for n in tensors if n.startswith("model.layers.0.mlp.")]:
        del tensors[name]
    g = torch.Generator().manual_seed(2024)
    std = 0.02  # HF initializer_range
    for proj, shape in (("gate_proj", [cfg.F_dense, cfg.D]), ("up_proj", [cfg.F_dense, cfg.D]),
                        ("down_proj", [cfg.D, cfg.F_dense])):
        tensors[f"model.layers.0.mlp.{proj}.weight"] = torch.randn(shape, generator=g, dtype=torch.float64) * std
    for name in sorted(n for n in tensors if n.endswith("norm.weight")):
        tensors[name] = 1.0 + 0.1 * torch.randn(tensors[name].shape, generator=g, dtype=torch.float64)
    twin.write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    write_tokens(os.path.join(d, "tokens.npy"), cfg.V, seed=12, dtype=np.uint16)
    return d


# SFT examples (vocab 256) whose rows differ in packing, masks and position restarts: with
# seq_len 16, packing fills row 0 with examples 0-2 (5 + 7 + 4 tokens) and row 1 with 3-4
# (9 + 3, then 4 pad tokens); example 5 (20 tokens) is truncated into row 2. Each example
# marks its loss another way: labels equal to the ids, labels with a masked prompt, an
# assistant_mask, labels masked in the middle (a second user turn), no labels at all.
SFT_EXAMPLES = [
    {"input_ids": [12, 200, 31, 7, 99], "labels": [12, 200, 31, 7, 99]},
    {"input_ids": [5, 17, 250, 64, 3, 128, 77], "labels": [-100, -100, -100, 64, 3, 128, 77]},
    {"input_ids": [40, 41, 42, 43], "assistant_mask": [0, 0, 1, 1]},
    {"input_ids": [9, 8, 7, 6, 5, 4, 3, 2, 1],
     "labels": [-100, -100, -100, -100, 5, 4, -100, 2, 1]},
    {"input_ids": [100, 150, 200]},
    {"input_ids": list(range(60, 80))},
]
SFT_CASES = [  # (case dir, checkpoint dir, packing)
    ("sft_moe_packed", "moe", True),
    ("sft_dense_tied_aux_packed", "dense_tied_aux", True),
    ("sft_moe_padded", "moe", False),
]


def make_sft():
    """The SFT cases over the checkpoints above: SFT_EXAMPLES as sft/data.jsonl, then the twin."""
    os.makedirs(os.path.join(HERE, "sft"), exist_ok=True)
    data = os.path.join(HERE, "sft", "data.jsonl")
    with open(data, "w") as f:
        for ex in SFT_EXAMPLES:
            f.write(json.dumps(ex) + "\n")
    for case, model, pack in SFT_CASES:
        out = os.path.join(HERE, case)
        e = twin.run_sft(os.path.join(HERE, model), data, SEQ_LEN, BATCH, pack, out)
        e_model = dict(e, model=model, data="sft/data.jsonl")
        with open(os.path.join(out, "expected.json"), "w") as f:
            json.dump(e_model, f, indent=1)
            f.write("\n")
        print(case, json.dumps({k: e[k] for k in (
            "loss", "ce", "aux", "counted_targets", "loss_without_document_mask",
            "loss_without_position_restarts", "topk_min_boundary_margin",
            "finite_difference_check")}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiermoe", help="path to the built tiermoe CLI (not needed with --sft-only)")
    ap.add_argument("--sft-only", action="store_true",
                    help="only the SFT cases, over the committed moe and dense_tied_aux checkpoints")
    a = ap.parse_args()
    if not a.sft_only:
        if not a.tiermoe:
            ap.error("--tiermoe is required unless --sft-only")
        for d in (make_moe(a.tiermoe), make_dense_tied_aux(a.tiermoe)):
            e = twin.run(d, os.path.join(d, "tokens.npy"), SEQ_LEN, BATCH, d)
            print(os.path.basename(d), json.dumps({k: e[k] for k in (
                "loss", "ce", "aux", "parameters", "topk_min_boundary_margin", "topk_min_inner_gap",
                "finite_difference_check")}))
    make_sft()


if __name__ == "__main__":
    main()
