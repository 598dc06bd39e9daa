"""LoRA SFT of a transformers Qwen3-MoE with TRL's SFTTrainer, its MoE experts run by TierMoE.

The one TierMoE line is experts_implementation="tiermoe"; everything else is stock
transformers + PEFT + TRL. With --expert-lora the experts get LoRA too
(tiermoe.torch.expert_lora: PEFT's own adapter on the experts' weights, in the same adapter as
attention's), computed by TierMoE beside the frozen expert weights. With --device-tier the hot
experts run on the device tier's CPU backend (tiermoe.configure), and the trainer logs its
figures (tiermoe.trl.StatsCallback); experts that carry LoRA stay on the host.

    python examples/sft_trl.py [--expert-lora] [--device-tier] [--work-dir DIR]
"""
import argparse
import os
import tempfile

import datasets
import torch
import transformers
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer

import tiermoe
import tiermoe.torch
import tiermoe.transformers  # noqa: F401  (registers experts_implementation="tiermoe")
import tiermoe.trl
from tiny import setup


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--expert-lora", action="store_true")
    p.add_argument("--device-tier", action="store_true")
    p.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "tiermoe-examples"))
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args()

    model_dir, chats = setup(args.work_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, experts_implementation="tiermoe")
    if args.device_tier:
        # A budget of 2 MiB: the tier's staging and a few of the 16 experts' weights.
        tiermoe.configure(model, device="cpu", device_memory=2 << 20, placement="device")
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    if args.expert_lora:  # one PEFT adapter for both, which the trainer trains and saves
        model, lora = tiermoe.torch.expert_lora(model, r=8, alpha=16, config=lora), None
    config = SFTConfig(output_dir=os.path.join(args.work_dir, "run"), max_steps=args.steps,
                       per_device_train_batch_size=8, gradient_accumulation_steps=2,
                       learning_rate=2e-2, lr_scheduler_type="constant", logging_steps=5,
                       save_strategy="no", report_to=[], use_cpu=True, max_length=32,
                       gradient_checkpointing=True, seed=0)
    trainer = SFTTrainer(model=model, args=config, processing_class=tokenizer, peft_config=lora,
                         train_dataset=datasets.load_dataset("json", data_files=chats)["train"],
                         callbacks=[tiermoe.trl.StatsCallback()])
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    adapter = os.path.join(args.work_dir, "adapter")
    trainer.save_model(adapter)
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} over {args.steps} steps; "
          f"the PEFT adapter is in {adapter}")
    if args.device_tier:
        totals = tiermoe.torch.stats(model)["totals"]
        print(f"device tier: hot fraction {totals['hot_fraction']:.2f}, "
              f"{totals['bytes_up']} bytes up, {totals['bytes_down']} down")


if __name__ == "__main__":
    main()
