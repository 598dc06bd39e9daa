// tiermoe init: a randomly initialised Hugging Face checkpoint of a preset
// (config.json + model.safetensors, or shards and an index above the shard
// limit) that transformers' *ForCausalLM loads as-is.
//
// Values follow transformers' _init_weights (init_hf_tensor in hf_names.h):
// every block of every tensor draws from its own stream seeded by (--seed,
// tensor name, block), so the files depend only on the flags, and a deeper
// model shares its first layers with a shallower one of the same seed.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>

#include "commands.h"
#include "flag_bounds.h"
#include "tiermoe/core/bounds.h"
#include "tiermoe/core/files.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/io/hf_names.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/io/safetensors.h"

namespace tiermoe::cli {

namespace {

namespace fs = std::filesystem;
using detail::str_of;

// Above this a write reports its size first and its progress as it goes.
constexpr uint64_t kLargeWriteBytes = 1'000'000'000;

struct InitOptions {
  std::string preset;
  std::string out;
  uint64_t seed = 0;
  std::string dtype = "bf16";
  int64_t layers = 0;  // 0: the preset's
  std::string max_shard_size = "5GB";
  bool force = false;
  bool layers_given = false;
  int64_t vocab_size = 0;  // 0: the preset's
};

// The shards save_checkpoint_tensors would cut (huggingface_hub's split),
// planned from the tensors' sizes before any is allocated.
std::vector<std::vector<size_t>> plan_shards(const std::vector<HfTensor>& tensors, DType dtype,
                                             uint64_t max_shard_bytes) {
  std::vector<uint64_t> bytes;
  bytes.reserve(tensors.size());
  for (const HfTensor& t : tensors) {
    bytes.push_back(uint64_t(shape_numel(t.shape)) * dtype_size(dtype));
  }
  return plan_checkpoint_shards(bytes, max_shard_bytes);
}

// Allocates and initialises one shard's tensors, in parallel over tensors.
NamedTensors make_shard(const std::vector<HfTensor>& tensors, const std::vector<size_t>& shard,
                        const ModelConfig& config, uint64_t seed, DType dtype) {
  NamedTensors named;
  for (size_t i : shard) {
    named.emplace_back(tensors[i].name, Tensor::empty(tensors[i].shape, dtype, MemTag::weights));
  }
  // Work items are (tensor, block) pairs of equal size, so the threads stay
  // balanced even when one tensor (the embedding) dwarfs the others.
  std::vector<std::pair<size_t, int64_t>> work;
  for (size_t j = 0; j < shard.size(); ++j) {
    for (int64_t b = 0; b < hf_init_blocks(tensors[shard[j]]); ++b) work.emplace_back(j, b);
  }
  parallel_for(int64_t(work.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      const auto [j, b] = work[size_t(w)];
      fill_hf_tensor_blocks(named[j].second, tensors[shard[j]], config, seed, b, b + 1);
    }
  });
  return named;
}

// Refuses to overwrite a checkpoint without --force. Files of an earlier
// checkpoint are removed first (the names save_checkpoint_tensors owns), so no
// stale shard or index survives next to the new files.
void prepare_out_dir(const fs::path& out, bool force) {
  std::error_code ec;
  if (fs::exists(out, ec)) {
    TIERMOE_CHECK(fs::is_directory(out), "--out exists and is not a directory", out.string(),
                  "choose a directory path for --out");
    TIERMOE_CHECK(force || !fs::exists(out / "config.json"),
                  "--out already holds a checkpoint (config.json)", out.string(),
                  "pass --force to overwrite it, or choose another --out");
    static const std::regex ours(
        R"(config\.json|model\.safetensors|model\.safetensors\.index\.json|)"
        R"(model-\d{5}-of-\d{5}\.safetensors)");
    for (const auto& entry : fs::directory_iterator(out)) {
      if (entry.is_regular_file() && std::regex_match(entry.path().filename().string(), ours)) {
        fs::remove(entry.path());
      }
    }
  }
  fs::create_directories(out, ec);
  TIERMOE_CHECK(fs::is_directory(out), "cannot create --out: " + ec.message(), out.string(),
                "check the path and permissions");
}

void run_init(const InitOptions& o) {
  const DType dtype = parse_dtype(o.dtype, "--dtype");
  const uint64_t max_shard_bytes = parse_bytes(o.max_shard_size, "--max-shard-size");
  TIERMOE_CHECK(max_shard_bytes > 0, "--max-shard-size must be positive", "--max-shard-size",
                "the default is 5GB");
  ModelConfig config =
      preset(o.preset, o.layers_given ? std::optional<int64_t>(o.layers) : std::nullopt);
  config.torch_dtype = torch_dtype_name(dtype);
  if (o.vocab_size != 0) {
    for (const std::string& id : config.set_vocab_size(o.vocab_size)) {
      std::cerr << "note: --vocab-size " << o.vocab_size << " drops the preset's " << id
                << " (outside the vocabulary, so config.json has no such id)\n";
    }
    config.validate("--vocab-size");
  }

  const std::vector<HfTensor> tensors = hf_tensors(config);
  const ParamCounts counts = param_counts(config);
  const uint64_t total_bytes = uint64_t(counts.total) * dtype_size(dtype);
  const fs::path out(o.out);

  if (total_bytes > kLargeWriteBytes) {
    std::cerr << "warning: " << o.preset << " with " << config.num_hidden_layers << " layers is "
              << human_count(counts.total) << " parameters, " << human_bytes(total_bytes)
              << " of " << dtype_name(dtype) << " to write to " << out.string()
              << " (--layers N writes fewer layers)\n";
  }
  prepare_out_dir(out, o.force);
  std::error_code ec;
  auto space = fs::space(out, ec);
  TIERMOE_CHECK(ec || space.available > total_bytes,
                str_of("not enough disk space: the checkpoint needs ", human_bytes(total_bytes),
                       ", ", human_bytes(space.available), " is free"),
                out.string(), "free space, pass --layers N, or write somewhere else");

  const auto shards = plan_shards(tensors, dtype, max_shard_bytes);
  // Memory holds one shard at a time.
  uint64_t largest_shard = 0;
  for (const auto& shard : shards) {
    uint64_t bytes = 0;
    for (size_t i : shard) bytes += uint64_t(shape_numel(tensors[i].shape)) * dtype_size(dtype);
    largest_shard = std::max(largest_shard, bytes);
  }
  check_host_memory(largest_shard, "writing the largest shard", out.string(),
                    "pass a smaller --max-shard-size, fewer --layers or a smaller --vocab-size");
  // Shard by shard (the random init, then the write): a progress line with
  // the rate and ETA when it takes more than a second.
  ProgressMeter meter(stderr_progress(), "init " + out.string(), double(total_bytes));
  if (shards.size() == 1) {
    NamedTensors named = make_shard(tensors, shards[0], config, o.seed, dtype);
    save_checkpoint_tensors(out.string(), named, max_shard_bytes);
  } else {
    // Sharded checkpoints are written one shard at a time so that memory holds
    // one shard, not the model (61 GB for qwen3-30b-a3b in bf16).
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
      NamedTensors named = make_shard(tensors, shards[s], config, o.seed, dtype);
      save_safetensors((out / name).string(), named);
      uint64_t bytes = 0;
      for (const auto& [tensor, t] : named) {
        weight_map[tensor] = name;
        bytes += t.nbytes();
      }
      meter.advance(double(bytes));
    }
    nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}},
                            {"weight_map", std::move(weight_map)}};
    write_file_atomic((out / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  }
  meter.finish();
  // config.json goes last: a directory with a config.json is a finished checkpoint.
  save_model_config(config, (out / "config.json").string());

  std::cout << "wrote " << out.string() << ": " << o.preset << " (" << config.model_type << ", "
            << config.num_hidden_layers << " layers), " << tensors.size() << " tensors, "
            << human_count(counts.total) << " parameters, " << human_bytes(total_bytes) << " of "
            << dtype_name(dtype) << " in "
            << (shards.size() == 1 ? std::string("model.safetensors")
                                   : std::to_string(shards.size()) + " shards")
            << " + config.json, seed " << o.seed << "\n";
}

}  // namespace

void add_init_command(CLI::App& app) {
  auto opts = std::make_shared<InitOptions>();
  CLI::App* cmd = app.add_subcommand(
      "init", "Write a randomly initialised Hugging Face checkpoint of a preset");
  std::string presets;
  for (const auto& n : preset_names()) presets += (presets.empty() ? "" : "|") + n;
  cmd->add_option("--preset", opts->preset, "Model shape: " + presets)->required();
  cmd->add_option("--out", opts->out, "Checkpoint directory to write")->required();
  cmd->add_option("--seed", opts->seed, "Random seed (0 to 2^64-1)")
      ->check(CLI::Validator(
          [](const std::string& s) {
            return s.starts_with("-") ? std::string("the seed is a non-negative integer")
                                      : std::string();
          },
          "UINT64"))
      ->capture_default_str();
  cmd->add_option("--dtype", opts->dtype, "Weight dtype: bf16|f32|f64")->capture_default_str();
  CLI::Option* layers =
      cmd->add_option("--layers", opts->layers, "Number of decoder layers (overrides the preset)")
          ->check(count_in(1, ModelConfig::kMaxLayers));
  cmd->add_option("--vocab-size", opts->vocab_size,
                  "Vocabulary size (overrides the preset's; e.g. real expert shapes with a small "
                  "embedding for benchmarks)")
      ->check(count_in(256, ModelConfig::kMaxVocab,
                       "the built-in corpus uses token ids 0..255; token ids are 32-bit"));
  cmd->add_option("--max-shard-size", opts->max_shard_size,
                  "Largest safetensors file before sharding (bytes, or 500MB, 5GB, 2GiB)")
      ->capture_default_str();
  cmd->add_flag("--force", opts->force, "Overwrite a checkpoint already in --out");
  cmd->callback([opts, layers] {
    opts->layers_given = layers->count() > 0;
    run_init(*opts);
  });
}

}  // namespace tiermoe::cli
