#include "tiermoe/train/trainer_config.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tiermoe/core/bounds.h"
#include "tiermoe/core/error.h"
#include "tiermoe/io/hf_names.h"
#include "tiermoe/io/tokens.h"
#include "tiermoe/model/checkpoint.h"
#include "tiermoe/model/memory_estimate.h"
#include "tiermoe/moe/moe_layer.h"
#include "tiermoe/remat/policy.h"
#include "tiermoe/train/run_fields.h"
#include "tiermoe/train/sft_data.h"

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
  if (experts) {
    TIERMOE_CHECK(*experts == QuantFormat::int4 || *experts == QuantFormat::int8,
                  str_of("--experts ", quant_format_name(*experts),
                         " is read from checkpoints as shipped, not made at load"),
                  "--experts", "quantize at load to int4 or int8");
    TIERMOE_CHECK(lora, str_of("--experts ", quant_format_name(*experts), " freezes the experts"),
                  "--experts",
                  "train LoRA adapters (--lora-rank); full fine-tuning trains the experts in the "
                  "compute dtype");
    TIERMOE_CHECK(experts_group >= 1, str_of("--experts-group ", experts_group, " must be >= 1"),
                  "--experts-group", "use 32, 64 or 128 columns per scale");
    TIERMOE_CHECK(dtype != DType::f64, "--experts quantizes for the f32 and bf16 kernels",
                  "--experts", "use --dtype bf16 or f32 (f64 runs check the model against transformers)");
  }
  // Only a run on the built-in corpus reads it (a --data file's own length is
  // checked when it is opened).
  TIERMOE_CHECK(
      !data_file.empty() || corpus_tokens > trainer.seq_len,
      str_of("the built-in corpus of ", corpus_tokens, " tokens is shorter than one window"),
      "--corpus-tokens", "pass more --corpus-tokens or a smaller --seq-len");
}

json TrainConfig::to_json() const {
  json j = json::object();
  for (const RunField& f : run_fields()) j[f.key] = f.get(*this);
  return j;
}

TrainConfig TrainConfig::from_json(const json& j, const std::string& where) {
  try {
    TrainConfig c;
    for (const RunField& f : run_fields()) {
      f.set(c, !j.contains(f.key) && f.absent ? *f.absent : j.at(f.key), where);
    }
    c.trainer.data_seed = c.seed;
    c.validate();
    return c;
  } catch (const json::exception& e) {
    throw Error(str_of("the recorded run config is malformed: ", e.what()), where,
                "the checkpoint's trainer_state.json is corrupt");
  }
}

namespace {

// The token SFT rows are padded with: the config's pad token, else its first
// eos token, else 0. Padding is inert (no loss, attended by nothing real, left
// out of the aux loss), so only its embedding row is read.
int32_t pad_token_for(const ModelConfig& m) {
  if (m.pad_token_id) return int32_t(*m.pad_token_id);
  if (!m.eos_token_id.empty()) return int32_t(m.eos_token_id.front());
  return 0;
}

CausalLM random_model(const TrainConfig& c, Comm* comm) {
  const ModelConfig config = preset(c.preset, c.layers);
  CausalLM model(config, c.dtype, comm);
  // Each tensor's values depend only on (seed, name), so a rank holding some
  // of the experts initialises exactly those.
  std::vector<HfTensor> tensors = hf_tensors(config);
  std::erase_if(tensors, [&](const HfTensor& t) {
    return t.role == HfRole::expert && t.expert >= 0 && !model.holds_expert(t.expert);
  });
  std::vector<ModelParam> params = model.params();
  TIERMOE_ASSERT(params.size() == tensors.size());
  for (size_t i = 0; i < params.size(); ++i) {
    TIERMOE_ASSERT(params[i].name == tensors[i].name);
    if (params[i].hf_transposed) {  // drawn in the checkpoint's layout, as init writes it
      params[i].value.copy_from(
          swap_last_two_dims(init_hf_tensor(tensors[i], config, c.seed, params[i].value.dtype())));
      continue;
    }
    fill_hf_tensor(params[i].value, tensors[i], config, c.seed);
  }
  return model;
}

// A checkpoint that ships low-bit matrices: full fine-tuning only with
// --dequantize (it trains widened copies), and no second quantization of
// experts already stored at low width.
void check_stored_width(const TrainConfig& c, const ModelConfig& m) {
  if (m.quant_method.empty()) return;
  const std::string stored =
      m.quant_method == "compressed-tensors" ? str_of("int", m.quant_bits) : m.quant_method;
  TIERMOE_CHECK(c.lora || c.dequantize,
                str_of("the checkpoint ships its weights at ", stored, " (", m.quant_method,
                       "), and full fine-tuning trains them"),
                c.model_dir,
                "pass --dequantize to train copies in the compute dtype (the checkpoints saved "
                "are then at that width), or train LoRA adapters over the frozen weights "
                "(--lora-rank)");
  TIERMOE_CHECK(!c.experts,
                str_of("--experts ", c.experts ? quant_format_name(*c.experts) : "",
                       " would quantize experts the checkpoint already ships at ", stored),
                "--experts", "drop --experts: the stored experts are read at their width");
}

}  // namespace

void check_fits_host(const TrainConfig& c, int ranks) {
  const bool from_preset = c.model_dir.empty();
  const ModelConfig model =
      from_preset ? preset(c.preset, c.layers) : load_model_config(c.model_dir);
  const TrainerOptions& t = c.trainer;
  RunMemoryShape run;
  run.dtype = c.dtype;
  run.backward = true;
  run.full_ft = !c.lora;
  run.optimizer_states = t.optimizer == OptimizerKind::adamw ? 2 : (t.sgd.momentum > 0 ? 1 : 0);
  run.tokens = checked_mul(t.batch, t.seq_len, "--batch x --seq-len", "--batch");
  run.lm_head_chunk = c.lm_head_chunk;
  run.ranks = ranks;
  run.weights_mapped = c.lora && !from_preset;  // build_model binds them mapped
  const std::string where = from_preset
                                ? str_of("--preset ", c.preset,
                                         c.layers ? str_of(" --layers ", *c.layers) : std::string())
                                : c.model_dir;
  // A preset is drawn in the compute dtype before --experts would quantize
  // it; init writes the low-width checkpoint one expert at a time instead.
  const std::string low_width =
      from_preset && c.lora && model.num_experts > 0
          ? str_of("write it with its experts at 4 bits (tiermoe init --preset ", c.preset,
                   " --experts ", model.spec().shipped_experts,
                   " --out DIR) and train --model DIR, ")
          : std::string();
  check_host_memory_for(
      model, run, where, "--batch x --seq-len",
      str_of(low_width, from_preset ? "pass fewer --layers, " : "",
             c.lora ? "" : "train LoRA adapters (--lora-rank) instead of --full, ",
             "use a smaller --batch or --seq-len, or a machine with more memory"));
}

CausalLM build_model(const TrainConfig& c, Comm* comm, ProgressSink progress) {
  c.validate();
  check_fits_host(c, comm ? comm->size() : 1);
  // LoRA freezes every base weight, so it reads them in place from the
  // checkpoint at their stored width; full fine-tuning trains copies.
  const WeightBinding binding = c.lora ? WeightBinding::mapped : WeightBinding::copy;
  if (!c.model_dir.empty()) check_stored_width(c, load_model_config(c.model_dir));
  CausalLM model = c.model_dir.empty()
                       ? random_model(c, comm)
                       : CausalLM::from_checkpoint(c.model_dir, c.dtype, comm, binding, progress);
  model.set_lm_head_chunk(c.lm_head_chunk);
  model.set_moe_options(RematPolicy::parse(c.remat, "--remat"),
                        parse_absorb_scores(c.absorb, "--absorb-scores"));
  if (c.lora) {
    model.enable_lora(*c.lora, c.seed);
    if (!c.lora_init.empty()) model.load_lora_adapter(c.lora_init);
  }
  if (c.experts) {
    const auto [before, after] = model.quantize_experts(*c.experts, c.experts_group);
    if (progress.out) {
      *progress.out << "experts: " << quant_format_name(*c.experts) << " g" << c.experts_group
                    << ", frozen, " << format_size(uint64_t(before)) << " -> "
                    << format_size(uint64_t(after)) << "\n";
    }
  }
  model.zero_grad();
  return model;
}

std::unique_ptr<RowSource> open_data_file(const std::string& path, const ModelConfig& model,
                                          int64_t seq_len, bool pack) {
  if (is_sft_jsonl(path)) {
    SftOptions o{.seq_len = seq_len, .pack = pack, .pad_id = pad_token_for(model)};
    auto data = std::make_unique<SftData>(SftData::from_file(path, o));
    validate_tokens(data->ids(), model.vocab_size, path);
    for (int32_t t : data->targets()) {
      TIERMOE_CHECK(t == -100 || (t >= 0 && t < model.vocab_size),
                    str_of("a label ", t, " is outside the vocabulary [0, ", model.vocab_size, ")"),
                    path, "labels are token ids of this model's tokenizer, or -100");
    }
    return data;
  }
  auto data = std::make_unique<TokenWindows>(TokenWindows::from_file(path));
  validate_tokens(data->tokens(), model.vocab_size, path);
  TIERMOE_CHECK(data->num_windows(seq_len) >= 1,
                str_of("the data holds ", data->size(), " tokens, fewer than one window of --seq-len ",
                       seq_len, " needs (", seq_len + 1, ")"),
                path, "use a smaller --seq-len or a longer data file");
  return data;
}

uint64_t data_bytes(const TrainConfig& c) {
  if (c.data_file.empty()) return uint64_t(c.corpus_tokens) * sizeof(int32_t);
  std::error_code ec;
  if (is_sft_jsonl(c.data_file)) return 0;
  const uintmax_t size = std::filesystem::file_size(c.data_file, ec);
  return ec ? 0 : uint64_t(size);
}

std::unique_ptr<RowSource> build_data(const TrainConfig& c, const ModelConfig& model,
                                      std::unique_ptr<MarkovCorpus>* corpus,
                                      ProgressSink progress) {
  if (!c.data_file.empty()) return open_data_file(c.data_file, model, c.trainer.seq_len, c.pack);
  auto chain = std::make_unique<MarkovCorpus>(MarkovCorpusOptions{});
  // Its ids are valid tokens of any vocabulary at least as large (a real
  // model's ids 0..255 are just 256 of its tokens): the floor still holds.
  TIERMOE_CHECK(chain->vocab() <= model.vocab_size,
                str_of("the built-in corpus has vocab ", chain->vocab(), ", the model only ",
                       model.vocab_size),
                "built-in Markov corpus",
                "pass --data with tokens for this model, or use --preset tiny");
  auto data = std::make_unique<TokenWindows>(chain->generate(c.corpus_tokens, c.seed, progress),
                                             "built-in Markov corpus");
  if (corpus) *corpus = std::move(chain);
  return data;
}

}  // namespace tiermoe
