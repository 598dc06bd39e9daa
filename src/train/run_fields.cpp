#include "tiermoe/train/run_fields.h"

namespace tiermoe {

namespace {

using nlohmann::json;

// A setting held as it is written: `member` points to it in a config.
template <class Member>
RunField plain(const char* key, std::vector<std::string> flags, Member member,
               std::optional<json> absent = std::nullopt) {
  return {key, std::move(flags),
          [member](const TrainConfig& c) { return json(*member(const_cast<TrainConfig&>(c))); },
          [member](TrainConfig& c, const json& v, const std::string&) {
            auto* m = member(c);
            *m = v.get<std::remove_cvref_t<decltype(*m)>>();
          },
          std::move(absent)};
}

json lora_json(const TrainConfig& c) {
  if (!c.lora) return nullptr;
  const LoraConfig& l = *c.lora;
  return {{"rank", l.rank},
          {"alpha", l.alpha},
          {"rslora", l.rslora},
          {"targets", std::vector<std::string>(l.targets.begin(), l.targets.end())},
          {"layers", std::vector<int64_t>(l.layers.begin(), l.layers.end())},
          {"init", c.lora_init}};
}

void set_lora(TrainConfig& c, const json& l, const std::string&) {
  if (l.is_null()) return;
  LoraConfig lc;
  lc.rank = l.at("rank").get<int64_t>();
  lc.alpha = l.at("alpha").get<double>();
  lc.rslora = l.at("rslora").get<bool>();
  const auto targets = l.at("targets").get<std::vector<std::string>>();
  lc.targets = {targets.begin(), targets.end()};
  if (l.contains("layers")) {  // checkpoints before layers_to_transform: every layer
    const auto layers = l.at("layers").get<std::vector<int64_t>>();
    lc.layers = {layers.begin(), layers.end()};
  }
  c.lora = lc;
  c.lora_init = l.at("init").get<std::string>();
}

}  // namespace

const std::vector<RunField>& run_fields() {
  using C = TrainConfig;
  static const std::vector<RunField> fields = {
      plain("model", {"--model"}, [](C& c) { return &c.model_dir; }),
      plain("preset", {"--preset"}, [](C& c) { return &c.preset; }),
      {"layers",
       {"--layers"},
       [](const C& c) { return c.layers ? json(*c.layers) : json(nullptr); },
       [](C& c, const json& v, const std::string&) {
         if (!v.is_null()) c.layers = v.get<int64_t>();
       }},
      {"dtype",
       {"--dtype"},
       [](const C& c) { return json(dtype_name(c.dtype)); },
       [](C& c, const json& v, const std::string& where) {
         c.dtype = parse_dtype(v.get<std::string>(), where);
       }},
      plain("seed", {"--seed"}, [](C& c) { return &c.seed; }),
      plain("data", {"--data"}, [](C& c) { return &c.data_file; }),
      // Runs saved before SFT data existed packed nothing.
      plain(
          "pack", {"--no-packing"}, [](C& c) { return &c.pack; }, true),
      plain(
          "lm_head_chunk", {"--lm-head-chunk"}, [](C& c) { return &c.lm_head_chunk; },
          kDefaultLmHeadChunk),
      plain("corpus_tokens", {"--corpus-tokens"}, [](C& c) { return &c.corpus_tokens; }),
      plain("remat", {"--remat"}, [](C& c) { return &c.remat; }),
      plain("absorb_scores", {"--absorb-scores"}, [](C& c) { return &c.absorb; }),
      // Runs saved before quantized experts existed kept them in the dtype.
      {"experts",
       {"--experts"},
       [](const C& c) {
         return c.experts ? json(std::string(quant_format_name(*c.experts))) : json(nullptr);
       },
       [](C& c, const json& v, const std::string& where) {
         if (!v.is_null()) c.experts = parse_quant_format(v.get<std::string>(), where);
       },
       nullptr},
      plain(
          "experts_group", {"--experts-group"}, [](C& c) { return &c.experts_group; },
          int64_t(128)),
      plain(
          "dequantize", {"--dequantize"}, [](C& c) { return &c.dequantize; }, false),
      plain("steps", {"--steps"}, [](C& c) { return &c.trainer.steps; }),
      plain("batch", {"--batch"}, [](C& c) { return &c.trainer.batch; }),
      plain("seq_len", {"--seq-len"}, [](C& c) { return &c.trainer.seq_len; }),
      plain("grad_accum", {"--grad-accum"}, [](C& c) { return &c.trainer.grad_accum; }),
      plain("max_grad_norm", {"--max-grad-norm"}, [](C& c) { return &c.trainer.max_grad_norm; }),
      {"optimizer",
       {"--optimizer"},
       [](const C& c) { return json(optimizer_kind_name(c.trainer.optimizer)); },
       [](C& c, const json& v, const std::string&) {
         c.trainer.optimizer = parse_optimizer_kind(v.get<std::string>());
       }},
      plain("lr", {"--lr"}, [](C& c) { return &c.trainer.schedule.base_lr; }),
      {"lr_schedule",
       {"--lr-schedule"},
       [](const C& c) {
         return json(c.trainer.schedule.kind == LrScheduleKind::cosine ? "cosine" : "constant");
       },
       [](C& c, const json& v, const std::string&) {
         c.trainer.schedule.kind = parse_lr_schedule(v.get<std::string>());
       }},
      plain("warmup_steps", {"--warmup-steps"},
            [](C& c) { return &c.trainer.schedule.warmup_steps; }),
      plain("min_lr_ratio", {"--min-lr-ratio"},
            [](C& c) { return &c.trainer.schedule.min_lr_ratio; }),
      // One flag for the optimizer in use: both hold it.
      {"weight_decay",
       {"--weight-decay"},
       [](const C& c) {
         const TrainerOptions& t = c.trainer;
         return json(t.optimizer == OptimizerKind::adamw ? t.adamw.weight_decay
                                                         : t.sgd.weight_decay);
       },
       [](C& c, const json& v, const std::string&) {
         c.trainer.adamw.weight_decay = c.trainer.sgd.weight_decay = v.get<double>();
       }},
      plain("adam_beta1", {"--adam-beta1"}, [](C& c) { return &c.trainer.adamw.beta1; }),
      plain("adam_beta2", {"--adam-beta2"}, [](C& c) { return &c.trainer.adamw.beta2; }),
      plain("adam_eps", {"--adam-eps"}, [](C& c) { return &c.trainer.adamw.eps; }),
      plain("momentum", {"--momentum"}, [](C& c) { return &c.trainer.sgd.momentum; }),
      plain("shuffle", {"--no-shuffle"}, [](C& c) { return &c.trainer.shuffle; }),
      {"lora",
       {"--full", "--lora-rank", "--lora-alpha", "--lora-targets", "--rslora", "--lora-init"},
       lora_json,
       set_lora},
  };
  return fields;
}

}  // namespace tiermoe
