"""What the examples share: a tiny random Qwen3-MoE made on the spot, a JSONL of chats, and a
word-level tokenizer over them with a chat template, so that every example runs offline in a
minute. Replace these three with your checkpoint, tokenizer and data."""
import json
import os
import random

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

# Questions and their answers: a pattern a tiny model learns in a few dozen steps.
FRUITS = ["apple", "pear", "plum", "fig", "kiwi", "lime", "date", "melon"]
COLORS = ["red", "green", "purple", "brown", "brown", "green", "brown", "orange"]
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} <eos> "
                 "{% endfor %}{% if add_generation_prompt %}<assistant> {% endif %}")


def write_chats(path, n=256, seed=0):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            i = rng.randrange(len(FRUITS))
            chat = [{"role": "user", "content": f"what color is the {FRUITS[i]} ?"},
                    {"role": "assistant", "content": f"the {FRUITS[i]} is {COLORS[i]} ."}]
            f.write(json.dumps({"messages": chat}) + "\n")


def make_tokenizer(chats_path):
    words = set()
    with open(chats_path) as f:
        for line in f:
            for m in json.loads(line)["messages"]:
                words.update(m["content"].split())
    special = ["<unk>", "<pad>", "<eos>", "<user>", "<assistant>"]
    vocab = {w: i for i, w in enumerate(special + sorted(words))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                               pad_token="<pad>", eos_token="<eos>")
    out.chat_template = CHAT_TEMPLATE
    return out


def make_model(out_dir, tokenizer, seed=0):
    """A 2-layer Qwen3-MoE (8 experts, top-2) with random weights, saved to out_dir."""
    torch.manual_seed(seed)
    config = transformers.Qwen3MoeConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, tie_word_embeddings=False)
    transformers.Qwen3MoeForCausalLM(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def setup(work_dir):
    """The chats, the tokenizer and the model under work_dir; returns (model dir, chats path)."""
    os.makedirs(work_dir, exist_ok=True)
    chats = os.path.join(work_dir, "chats.jsonl")
    write_chats(chats)
    model_dir = os.path.join(work_dir, "tiny-qwen3-moe")
    make_model(model_dir, make_tokenizer(chats))
    return model_dir, chats
