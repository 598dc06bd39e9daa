"""TRL's SFTTrainer LoRA step with LoRA on attention and on the experts, stock or TierMoE.

stock: transformers' grouped_mm experts, PEFT's LoRA from the trainer's peft_config
(target_modules for attention, target_parameters for the experts' gate_up_proj and down_proj).
tiermoe: experts_implementation="tiermoe" and tiermoe.torch.expert_lora(model, config=<the same
attention LoraConfig>), handed to the trainer as a PeftModel. Either way one adapter of rank r
on both, AdamW (the Trainer's default), no gradient accumulation, the model in --dtype (no
autocast). The rows are windows of a token file (as torch_step.py draws them), already
tokenized, so the trainer does no text processing. Each step is timed from the trainer's
on_step_begin to its on_step_end (forward, backward, optimizer); prints one JSON object: the
median after --warmup steps, tokens/s, peak RSS and the losses.
"""
import argparse
import json
import resource
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

from step_args import add_step_args


def tokenizer(vocab_size):
    """A word-level tokenizer over the model's vocabulary: the trainer wants a pad token."""
    import transformers
    from tokenizers import Tokenizer, models
    vocab = {"<pad>": 0, **{f"t{i}": i for i in range(1, vocab_size)}}
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")),
        pad_token="<pad>", eos_token="<pad>", unk_token="<pad>")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    add_step_args(p, dtype="bf16")
    p.add_argument("--impl", choices=["stock", "tiermoe"], required=True)
    p.add_argument("--gradient-checkpointing", action="store_true")
    args = p.parse_args()

    import datasets
    import transformers
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.dtype == "f32" else torch.bfloat16
    if args.impl == "tiermoe":
        import tiermoe.torch
        import tiermoe.transformers  # noqa: F401  (registers the backend)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model, dtype=dtype, attn_implementation="sdpa",
        experts_implementation="tiermoe" if args.impl == "tiermoe" else "grouped_mm")
    model.config.use_cache = False
    attention = LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    if args.impl == "tiermoe":
        model = tiermoe.torch.expert_lora(model, r=args.lora_rank, alpha=args.lora_alpha,
                                          config=attention)
        peft_config = None
    else:
        peft_config = attention
        peft_config.target_parameters = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]

    B, L = args.batch, args.seq_len
    total = args.warmup + args.steps
    tokens = np.load(args.data).astype(np.int64)
    if tokens.size < total * B * L:
        raise SystemExit(f"error: {args.data} holds {tokens.size} tokens; {total} steps of "
                         f"{B} x {L} need {total * B * L}")
    rows = [{"input_ids": tokens[w * L:(w + 1) * L].tolist()} for w in range(total * B)]

    times = []

    class StepTimer(transformers.TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            times.append(time.perf_counter() - self.start)
            print(f"trl step {len(times)}/{total}: {times[-1]:.2f} s", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as out:
        config = SFTConfig(output_dir=out, max_steps=total, per_device_train_batch_size=B,
                           gradient_accumulation_steps=1, max_length=L, learning_rate=1e-4,
                           lr_scheduler_type="constant", weight_decay=0.0, logging_steps=1,
                           save_strategy="no", report_to=[], use_cpu=True, seed=0,
                           gradient_checkpointing=args.gradient_checkpointing,
                           dataloader_drop_last=True)
        trainer = SFTTrainer(model=model, args=config, processing_class=tokenizer(
            model.config.vocab_size), peft_config=peft_config,
            train_dataset=datasets.Dataset.from_list(rows), callbacks=[StepTimer()])
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    step = statistics.median(times[args.warmup:])
    trainable = sum(q.numel() for q in trainer.model.parameters() if q.requires_grad)
    print(json.dumps({"impl": args.impl, "dtype": args.dtype, "threads": args.threads,
                      "gradient_checkpointing": args.gradient_checkpointing,
                      "trainable_parameters": trainable, "step_time_s": step,
                      "tokens_per_s": B * L / step, "step_times_s": times,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "losses": losses}))


if __name__ == "__main__":
    main()
