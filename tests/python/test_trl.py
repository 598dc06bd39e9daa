"""TRL's SFTTrainer over a model whose only TierMoE line is experts_implementation="tiermoe":
PEFT's LoRA on attention and on the experts from the trainer's peft_config (or the experts' from
tiermoe.torch.expert_lora), gradient
accumulation and checkpointing; the loss falls, and the adapter trainer.save_model writes
loads in PEFT on the stock model and gives TierMoE's eval loss there, in f64, to 1e-9."""
import datasets
import pytest
import torch
import transformers
from peft import LoraConfig, PeftModel
from tokenizers import Tokenizer, models, pre_tokenizers
from trl import SFTConfig, SFTTrainer

import tiermoe.torch
import tiermoe.transformers  # noqa: F401
from hf_models import Float64Everywhere, V, stock_f64

WORDS = [f"w{i}" for i in range(V - 3)]


def tokenizer():
    vocab = {"<unk>": 0, "<pad>": 1, "<eos>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                                pad_token="<pad>", eos_token="<eos>")


def corpus(n=64, seed=0):
    """Sentences from a few fixed patterns: learnable in a few steps."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        start = int(torch.randint(0, 8, (1,), generator=g))
        rows.append({"text": " ".join(WORDS[(start + 3 * k) % len(WORDS)] for k in range(12))})
    return datasets.Dataset.from_list(rows)


def peft_config():
    return LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("base")
    model = stock_f64("qwen3_moe")
    model.config.pad_token_id, model.config.eos_token_id, model.config.bos_token_id = 1, 2, None
    model.to(torch.float32).save_pretrained(path)
    tokenizer().save_pretrained(path)
    return path


@pytest.mark.parametrize("adapter", ["peft_config", "expert_lora"])
def test_sft_trainer_lowers_the_loss_and_saves_a_peft_adapter(base_dir, tmp_path, adapter):
    """The expert LoRA from the trainer's peft_config (target_parameters), or from
    tiermoe.torch.expert_lora on the model the trainer gets."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        base_dir, dtype=torch.float32, experts_implementation="tiermoe")
    config = peft_config()
    if adapter == "expert_lora":
        config.target_parameters = None
        model, config = tiermoe.torch.expert_lora(model, r=8, alpha=16, config=config), None
    args = SFTConfig(output_dir=str(tmp_path / "run"), max_steps=12, per_device_train_batch_size=4,
                     gradient_accumulation_steps=2, learning_rate=2e-2, logging_steps=1,
                     report_to=[], save_strategy="no", use_cpu=True, max_length=16,
                     gradient_checkpointing=True, lr_scheduler_type="constant", seed=0)
    trainer = SFTTrainer(model=model, args=args, train_dataset=corpus(),
                         processing_class=tokenizer(), peft_config=config)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 12 and losses[-1] < 0.8 * losses[0], losses
    adapter = tmp_path / "adapter"
    trainer.save_model(str(adapter))
    assert (adapter / "adapter_model.safetensors").exists()

    # The adapter on the stock model (transformers' eager experts, PEFT's own fold) and on
    # TierMoE's: the same eval loss in f64.
    ids = tokenizer()(list(corpus(4, seed=1)["text"]), return_tensors="pt")["input_ids"]

    def eval_loss(experts_implementation):
        base = transformers.AutoModelForCausalLM.from_pretrained(
            base_dir, dtype=torch.float64, experts_implementation=experts_implementation)
        model = PeftModel.from_pretrained(base, adapter).to(torch.float64).eval()
        with Float64Everywhere(), torch.no_grad():
            return model(input_ids=ids, labels=ids).loss.item()

    stock, ours = eval_loss("eager"), eval_loss("tiermoe")
    assert abs(ours - stock) <= 1e-9 * abs(stock), (ours, stock)
    assert stock < losses[0]  # the adapter carries what training learned


def test_stats_callback_logs_the_device_tier(base_dir, tmp_path):
    import tiermoe.trl
    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    experts = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                  if ".experts." in n)
    tiermoe.torch.patch(model, device="cpu", placement="device",
                        device_memory=401408 + experts // 2)
    args = SFTConfig(output_dir=str(tmp_path / "run"), max_steps=4, per_device_train_batch_size=4,
                     gradient_accumulation_steps=2, learning_rate=2e-2, logging_steps=1,
                     report_to=[], save_strategy="no", use_cpu=True, max_length=16, seed=0)
    trainer = SFTTrainer(model=model, args=args, train_dataset=corpus(),
                         processing_class=tokenizer(),
                         peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
                         callbacks=[tiermoe.trl.StatsCallback()])
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 4
    assert all(h["tier/hot_fraction"] > 0 and h["tier/bytes_up"] > 0 for h in logged[1:]), logged
