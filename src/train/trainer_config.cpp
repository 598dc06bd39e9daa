#include "tiermoe/train/trainer_config.h"

#include <nlohmann/json.hpp>

#include "tiermoe/core/error.h"
#include "tiermoe/io/hf_names.h"
#include "tiermoe/io/tokens.h"
#include "tiermoe/moe/moe_layer.h"
#include "tiermoe/remat/policy.h"

namespace tiermoe {

using detail::str_of;
using nlohmann::json;

void TrainConfig::validate() const {
  trainer.validate();
  tier.validate();
  RematPolicy::parse(remat, "--remat");
  parse_absorb_scores(absorb, "--absorb-scores");
  if (lora) lora->validate("--lora-rank/--lora-alpha/--lora-targets");
  TIERMOE_CHECK(lora_init.empty() || lora, "--lora-init needs LoRA", "--lora-init",
                "pass --lora-rank (or drop --lora-init)");
  TIERMOE_CHECK(
      corpus_tokens > trainer.seq_len,
      str_of("the built-in corpus of ", corpus_tokens, " tokens is shorter than one window"),
      "--corpus-tokens", "pass more --corpus-tokens or a smaller --seq-len");
}

json TrainConfig::to_json() const {
  const TrainerOptions& t = trainer;
  json j = {
      {"model", model_dir},
      {"preset", preset},
      {"layers", layers ? json(*layers) : json(nullptr)},
      {"dtype", dtype_name(dtype)},
      {"seed", seed},
      {"data", data_file},
      {"corpus_tokens", corpus_tokens},
      {"remat", remat},
      {"absorb_scores", absorb},
      {"steps", t.steps},
      {"batch", t.batch},
      {"seq_len", t.seq_len},
      {"grad_accum", t.grad_accum},
      {"max_grad_norm", t.max_grad_norm},
      {"optimizer", optimizer_kind_name(t.optimizer)},
      {"lr", t.schedule.base_lr},
      {"lr_schedule", t.schedule.kind == LrScheduleKind::cosine ? "cosine" : "constant"},
      {"warmup_steps", t.schedule.warmup_steps},
      {"min_lr_ratio", t.schedule.min_lr_ratio},
      {"weight_decay",
       t.optimizer == OptimizerKind::adamw ? t.adamw.weight_decay : t.sgd.weight_decay},
      {"adam_beta1", t.adamw.beta1},
      {"adam_beta2", t.adamw.beta2},
      {"adam_eps", t.adamw.eps},
      {"momentum", t.sgd.momentum},
      {"shuffle", t.shuffle},
  };
  if (lora) {
    j["lora"] = {{"rank", lora->rank},
                 {"alpha", lora->alpha},
                 {"rslora", lora->rslora},
                 {"targets", std::vector<std::string>(lora->targets.begin(), lora->targets.end())},
                 {"init", lora_init}};
  } else {
    j["lora"] = nullptr;
  }
  return j;
}

TrainConfig TrainConfig::from_json(const json& j, const std::string& where) {
  try {
    TrainConfig c;
    c.model_dir = j.at("model").get<std::string>();
    c.preset = j.at("preset").get<std::string>();
    if (!j.at("layers").is_null()) c.layers = j.at("layers").get<int64_t>();
    c.dtype = parse_dtype(j.at("dtype").get<std::string>(), where);
    c.seed = j.at("seed").get<uint64_t>();
    c.data_file = j.at("data").get<std::string>();
    c.corpus_tokens = j.at("corpus_tokens").get<int64_t>();
    c.remat = j.at("remat").get<std::string>();
    c.absorb = j.at("absorb_scores").get<std::string>();
    TrainerOptions& t = c.trainer;
    t.steps = j.at("steps").get<int64_t>();
    t.batch = j.at("batch").get<int64_t>();
    t.seq_len = j.at("seq_len").get<int64_t>();
    t.grad_accum = j.at("grad_accum").get<int64_t>();
    t.max_grad_norm = j.at("max_grad_norm").get<double>();
    t.optimizer = parse_optimizer_kind(j.at("optimizer").get<std::string>());
    t.schedule.base_lr = j.at("lr").get<double>();
    t.schedule.kind = parse_lr_schedule(j.at("lr_schedule").get<std::string>());
    t.schedule.warmup_steps = j.at("warmup_steps").get<int64_t>();
    t.schedule.min_lr_ratio = j.at("min_lr_ratio").get<double>();
    t.adamw.weight_decay = t.sgd.weight_decay = j.at("weight_decay").get<double>();
    t.adamw.beta1 = j.at("adam_beta1").get<double>();
    t.adamw.beta2 = j.at("adam_beta2").get<double>();
    t.adamw.eps = j.at("adam_eps").get<double>();
    t.sgd.momentum = j.at("momentum").get<double>();
    t.shuffle = j.at("shuffle").get<bool>();
    t.data_seed = c.seed;
    if (const json& l = j.at("lora"); !l.is_null()) {
      LoraConfig lc;
      lc.rank = l.at("rank").get<int64_t>();
      lc.alpha = l.at("alpha").get<double>();
      lc.rslora = l.at("rslora").get<bool>();
      const auto targets = l.at("targets").get<std::vector<std::string>>();
      lc.targets = {targets.begin(), targets.end()};
      c.lora = lc;
      c.lora_init = l.at("init").get<std::string>();
    }
    c.validate();
    return c;
  } catch (const json::exception& e) {
    throw Error(str_of("the recorded run config is malformed: ", e.what()), where,
                "the checkpoint's trainer_state.json is corrupt");
  }
}

namespace {

CausalLM random_model(const TrainConfig& c) {
  const ModelConfig config = preset(c.preset, c.layers);
  CausalLM model(config, c.dtype);
  const std::vector<HfTensor> tensors = hf_tensors(config);
  std::vector<ModelParam> params = model.params();
  TIERMOE_ASSERT(params.size() == tensors.size());
  for (size_t i = 0; i < params.size(); ++i) {
    TIERMOE_ASSERT(params[i].name == tensors[i].name);
    fill_hf_tensor(params[i].value, tensors[i], config, c.seed);
  }
  return model;
}

}  // namespace

CausalLM build_model(const TrainConfig& c) {
  c.validate();
  CausalLM model =
      c.model_dir.empty() ? random_model(c) : CausalLM::from_checkpoint(c.model_dir, c.dtype);
  model.set_moe_options(RematPolicy::parse(c.remat, "--remat"),
                        parse_absorb_scores(c.absorb, "--absorb-scores"));
  if (c.lora) {
    model.enable_lora(*c.lora, c.seed);
    if (!c.lora_init.empty()) model.load_lora_adapter(c.lora_init);
  }
  model.zero_grad();
  return model;
}

TokenWindows build_data(const TrainConfig& c, int64_t vocab,
                        std::unique_ptr<MarkovCorpus>* corpus) {
  if (!c.data_file.empty()) {
    TokenWindows data = TokenWindows::from_file(c.data_file);
    validate_tokens(data.tokens(), vocab, c.data_file);
    TIERMOE_CHECK(
        data.num_windows(c.trainer.seq_len) >= 1,
        str_of("the data holds ", data.size(), " tokens, fewer than one window of --seq-len ",
               c.trainer.seq_len, " needs (", c.trainer.seq_len + 1, ")"),
        c.data_file, "use a smaller --seq-len or a longer data file");
    return data;
  }
  auto chain = std::make_unique<MarkovCorpus>(MarkovCorpusOptions{});
  // Its ids are valid tokens of any vocabulary at least as large (a real
  // model's ids 0..255 are just 256 of its tokens): the floor still holds.
  TIERMOE_CHECK(chain->vocab() <= vocab,
                str_of("the built-in corpus has vocab ", chain->vocab(), ", the model only ", vocab),
                "built-in Markov corpus",
                "pass --data with tokens for this model, or use --preset tiny");
  TokenWindows data(chain->generate(c.corpus_tokens, c.seed), "built-in Markov corpus");
  if (corpus) *corpus = std::move(chain);
  return data;
}

}  // namespace tiermoe
