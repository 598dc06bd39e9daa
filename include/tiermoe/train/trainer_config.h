#pragma once
// Everything that defines a training run, as `tiermoe train` takes it from
// its flags and as trainer_state.json records it, and the setup it implies:
// the model (a checkpoint, or a preset initialised at random from the seed),
// the data (a token file, or the built-in Markov corpus), fine-tuning mode,
// remat policy and score absorption.
//
// A resumed run rebuilds everything from the recorded config, so the same
// seed, data and flags give the same bits.
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "tiermoe/model/causal_lm.h"
#include "tiermoe/model/lora.h"
#include "tiermoe/train/data.h"
#include "tiermoe/train/markov_corpus.h"
#include "tiermoe/kernels/quant.h"
#include "tiermoe/train/tier_session.h"
#include "tiermoe/train/trainer.h"

namespace tiermoe {

struct TrainConfig {
  // The model: a checkpoint directory, or (when empty) `preset` at random.
  std::string model_dir;
  std::string preset = "tiny";
  std::optional<int64_t> layers;  // overrides the preset's layer count
  DType dtype = DType::f32;       // compute dtype
  uint64_t seed = 0;              // random init, LoRA's A, the data's shuffle and corpus sample

  // The data: a token file (.npy / llm.c .bin), SFT JSON Lines (sft_data.h),
  // or (when empty) the built-in corpus.
  std::string data_file;
  bool pack = true;  // SFT data: pack examples into rows (false: one per row, padded)
  int64_t corpus_tokens = int64_t(1) << 20;  // tokens sampled from the Markov chain

  // Fine-tuning: LoRA when set, full fine-tuning otherwise.
  std::optional<LoraConfig> lora;
  std::string lora_init;  // a PEFT adapter directory to start from

  // The routed experts kept at int4 or int8 (`experts_group` columns per
  // scale), quantized at load from the weights the model starts with and
  // frozen (LoRA runs only; kernels/quant.h). Unset: the compute dtype.
  std::optional<QuantFormat> experts;
  int64_t experts_group = 128;
  // Full fine-tuning of a checkpoint that ships low-bit matrices
  // (quantization_config): trains them as copies dequantized to the compute
  // dtype (--dequantize); refused without it.
  bool dequantize = false;

  int64_t lm_head_chunk = kDefaultLmHeadChunk;  // token rows per LM head chunk (0: all)
  std::string remat = "none";   // RematPolicy text
  std::string absorb = "auto";  // AbsorbScores text

  TrainerOptions trainer;
  // Where the experts run (not recorded in checkpoints: see tier_session.h).
  TierRunConfig tier;

  // Checks every field that can be checked without reading files (the remat
  // policy, absorb mode, LoRA config, trainer options); throws naming the flag.
  void validate() const;

  nlohmann::json to_json() const;
  // `where` names the source in errors (a trainer_state.json path).
  static TrainConfig from_json(const nlohmann::json& j, const std::string& where);
};

// The model a run starts from: the checkpoint or the randomly initialised
// preset, with the remat policy and absorption applied, and LoRA attached
// (fresh from the seed, or from lora_init). Full fine-tuning leaves every
// parameter trainable. With a Comm of P > 1 ranks the model is expert
// parallel (causal_lm.h): this rank builds and loads its experts only.
CausalLM build_model(const TrainConfig& config, Comm* comm = nullptr, ProgressSink progress = {});

// Before the first tensor is allocated: refuses a run whose model, gradients,
// optimizer state and one micro-batch's activations (a lower bound,
// model/memory_estimate.h) exceed the host's available memory, naming the
// model and what would help. build_model runs it; so does the memory plan.
void check_fits_host(const TrainConfig& config, int ranks);

// The training rows, validated against the model's vocabulary: token
// windows, or SFT rows (packed or padded with the config's pad token). With
// the built-in corpus, `corpus` is set to the chain (for its loss floor).
std::unique_ptr<RowSource> build_data(const TrainConfig& config, const ModelConfig& model,
                                      std::unique_ptr<MarkovCorpus>* corpus = nullptr,
                                      ProgressSink progress = {});
// At least the bytes build_data holds, which the memory check adds to the
// plan: the built-in corpus's 4 a token; a token file's size (each token is
// held as 4 bytes, stored in 2 or 4); 0 for SFT JSON Lines, whose held size
// the text does not tell.
uint64_t data_bytes(const TrainConfig& config);
// Data from a file: SFT JSON Lines (io/sft_jsonl.h) as SftData, anything else
// as token windows; ids and labels checked against the vocabulary.
std::unique_ptr<RowSource> open_data_file(const std::string& path, const ModelConfig& model,
                                          int64_t seq_len, bool pack);

}  // namespace tiermoe
