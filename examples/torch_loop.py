"""A plain PyTorch training loop over a transformers Qwen3-MoE whose MoE blocks, routers
included, run in TierMoE (tiermoe.torch.patch): full fine-tuning with torch's AdamW.

    python examples/torch_loop.py [--work-dir DIR]
"""
import argparse
import json
import os
import tempfile

import torch
import transformers

import tiermoe.torch
from tiny import setup


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "tiermoe-examples"))
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()

    model_dir, chats = setup(args.work_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tiermoe.torch.patch(model)  # every Qwen3MoeSparseMoeBlock becomes a TieredMoE
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    with open(chats) as f:
        texts = [tokenizer.apply_chat_template(json.loads(line)["messages"], tokenize=False)
                 for line in f]

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    g = torch.Generator().manual_seed(0)
    for step in range(args.steps):
        rows = [texts[int(i)] for i in torch.randint(0, len(texts), (16,), generator=g)]
        batch = tokenizer(rows, return_tensors="pt", padding=True)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        loss = model(**batch, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step + 1}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
