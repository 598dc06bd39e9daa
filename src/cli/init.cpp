// tiermoe init: a randomly initialised Hugging Face checkpoint of a preset
// (config.json + model.safetensors, or shards and an index above the shard
// limit) that transformers' *ForCausalLM loads as-is.
//
// Values follow transformers' _init_weights (init_hf_tensor in hf_names.h):
// every block of every tensor draws from its own stream seeded by (--seed,
// tensor name, block), so the files depend only on the flags, and a deeper
// model shares its first layers with a shallower one of the same seed.
// With --experts int4|int8 each routed expert is packed as soon as it is
// drawn (the bytes `quantize` would write from the same draw), so a
// full-size preset never has its experts on disk at 16 bits.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "commands.h"
#include "flag_bounds.h"
#include "tiermoe/core/bounds.h"
#include "tiermoe/core/files.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/io/hf_names.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/io/pack_quantized.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/model/checkpoint.h"

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
  std::string experts;     // int4 | int8: the routed experts written pack-quantized
  int64_t group = 128;
};

// A shard's tensors: drawn in the dtype, the routed experts under --experts
// then quantized and packed (io/pack_quantized.h).
// gpt-oss's fused experts as its releases ship them (io/mxfp4.h): name_blocks
// U8 [E, out, in/32, 16] and name_scales U8 [E, out, in/32].
struct Mxfp4Stack {
  std::string name;
  Shape rows;  // [E, out, in]
  std::vector<uint8_t> blocks, scales;
};

struct Shard {
  NamedTensors drawn;
  std::vector<std::pair<std::string, PackedMatrix>> packed;  // module name, its tensors
  std::vector<Mxfp4Stack> mxfp4;
  std::vector<TensorBytes> tensors() const {
    std::vector<TensorBytes> out;
    for (const auto& [name, t] : drawn) {
      out.push_back({name, safetensors_dtype_name(t.dtype()), t.shape(), t.raw(), t.nbytes()});
    }
    for (const auto& [module, p] : packed) {
      for (TensorBytes& t : p.tensors(module)) out.push_back(std::move(t));
    }
    for (const Mxfp4Stack& m : mxfp4) {
      const int64_t E = m.rows[0], R = m.rows[1], B = m.rows[2] / 32;
      out.push_back({m.name + "_blocks", "U8", {E, R, B, 16}, m.blocks.data(), m.blocks.size()});
      out.push_back({m.name + "_scales", "U8", {E, R, B}, m.scales.data(), m.scales.size()});
    }
    return out;
  }
};

// How init writes the routed experts: in the dtype, pack-quantized, or
// (gpt-oss) MXFP4.
struct ExpertsAs {
  std::optional<QuantFormat> format;
  int64_t group = 0;
  bool quantized(const HfTensor& t) const { return format && t.role == HfRole::expert; }
  uint64_t bytes(const HfTensor& t, DType dtype) const {
    const uint64_t n = uint64_t(shape_numel(t.shape));
    if (!quantized(t)) return n * dtype_size(dtype);
    if (format == QuantFormat::mxfp4) return n / 2 + n / 32;
    return pack_quantized_bytes(*format, t.shape[0], t.shape[1], group);
  }
};

// A gpt-oss expert stack drawn x-major [E, in, out], as MXFP4 rows [E, out, in].
Mxfp4Stack mxfp4_stack(const std::string& name, const Tensor& x_major) {
  const Tensor w = swap_last_two_dims(x_major);
  const int64_t E = w.size(0), R = w.size(1), K = w.size(2);
  Mxfp4Stack m{name,
               {E, R, K},
               std::vector<uint8_t>(size_t(E * R * K / 2)),
               std::vector<uint8_t>(size_t(E * R * K / 32))};
  for (int64_t e = 0; e < E; ++e) {
    const QuantMatrix q = quantize_mxfp4(w.select(e));
    for (int64_t r = 0; r < R; ++r) {
      std::memcpy(m.blocks.data() + (e * R + r) * K / 2, q.codes + r * q.code_stride,
                  size_t(K / 2));
      std::memcpy(m.scales.data() + (e * R + r) * K / 32,
                  static_cast<const uint8_t*>(q.scales) + r * q.scale_stride, size_t(K / 32));
    }
  }
  return m;
}

// The shards save_checkpoint_tensors would cut (huggingface_hub's split),
// planned from the tensors' sizes before any is allocated.
std::vector<std::vector<size_t>> plan_shards(const std::vector<HfTensor>& tensors, DType dtype,
                                             const ExpertsAs& experts, uint64_t max_shard_bytes) {
  std::vector<uint64_t> bytes;
  bytes.reserve(tensors.size());
  for (const HfTensor& t : tensors) bytes.push_back(experts.bytes(t, dtype));
  return plan_checkpoint_shards(bytes, max_shard_bytes);
}

// Allocates and initialises one shard's tensors, in parallel over tensors.
Shard make_shard(const std::vector<HfTensor>& tensors, const std::vector<size_t>& shard,
                 const ModelConfig& config, uint64_t seed, DType dtype, const ExpertsAs& experts) {
  // Tensors written as drawn, and (under --experts) the routed experts, each
  // drawn, packed and released in turn: memory holds the shard's written
  // bytes and one expert's draw.
  std::vector<size_t> plain, quantized;
  for (size_t i : shard) (experts.quantized(tensors[i]) ? quantized : plain).push_back(i);
  auto draw = [&](const std::vector<size_t>& which) {
    NamedTensors named;
    for (size_t i : which) {
      named.emplace_back(tensors[i].name, Tensor::empty(tensors[i].shape, dtype, MemTag::weights));
    }
    // Work items are (tensor, block) pairs of equal size, so the threads stay
    // balanced even when one tensor (the embedding) dwarfs the others.
    std::vector<std::pair<size_t, int64_t>> work;
    for (size_t j = 0; j < which.size(); ++j) {
      for (int64_t b = 0; b < hf_init_blocks(tensors[which[j]]); ++b) work.emplace_back(j, b);
    }
    parallel_for(int64_t(work.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t w = begin; w < end; ++w) {
        const auto [j, b] = work[size_t(w)];
        fill_hf_tensor_blocks(named[j].second, tensors[which[j]], config, seed, b, b + 1);
      }
    });
    return named;
  };
  Shard out;
  out.drawn = draw(plain);
  for (size_t i : quantized) {
    const HfTensor& t = tensors[i];
    const Tensor w = draw({i})[0].second;
    if (experts.format == QuantFormat::mxfp4) {
      out.mxfp4.push_back(mxfp4_stack(t.name, w));
    } else {
      out.packed.emplace_back(hf_module_of(t.name),
                              pack_quantized(quantize_int(w, *experts.format, experts.group)));
    }
  }
  return out;
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
  ExpertsAs experts;
  if (!o.experts.empty()) {
    experts.format = parse_quant_format(o.experts, "--experts");
    experts.group = o.group;
    // gpt-oss ships MXFP4 (its fused experts); the per-expert families
    // compressed-tensors' int4/int8.
    const bool mxfp4 = experts.format == QuantFormat::mxfp4;
    const bool fused = config.spec().expert_layout == ExpertLayout::fused_x_major;
    TIERMOE_CHECK(
        fused ? mxfp4 : experts.format == QuantFormat::int4 || experts.format == QuantFormat::int8,
        str_of("--experts ", o.experts, " is not written for ", config.model_type), "--experts",
        fused ? str_of(config.model_type, "'s experts are written as its releases ship them: ",
                       config.spec().shipped_experts)
              : std::string("int4 or int8 (compressed-tensors' pack-quantized)"));
    for (const HfTensor& t : tensors) {
      // The input width: dimension 1 of [out, in] and of gpt-oss's x-major [E, in, out].
      const int64_t in = t.shape[1], g = mxfp4 ? 32 : o.group;
      TIERMOE_CHECK(!experts.quantized(t) || in % g == 0,
                    str_of(mxfp4 ? std::string("MXFP4's blocks of 32 do")
                                 : str_of("--group ", o.group, " does"),
                           " not divide the input width ", in, " of '", t.name, "'"),
                    mxfp4 ? "--experts" : "--group", "the groups must be whole");
    }
  }
  uint64_t total_bytes = 0;
  for (const HfTensor& t : tensors) total_bytes += experts.bytes(t, dtype);
  const fs::path out(o.out);

  const std::string routed_as = !experts.format ? std::string()
                                : *experts.format == QuantFormat::mxfp4
                                    ? std::string(" (routed experts mxfp4)")
                                    : str_of(" (routed experts ", o.experts, " g", o.group, ")");
  if (total_bytes > kLargeWriteBytes) {
    std::cerr << "warning: " << o.preset << " with " << config.num_hidden_layers << " layers is "
              << human_count(counts.total) << " parameters, " << human_bytes(total_bytes) << " of "
              << dtype_name(dtype) << routed_as << " to write to " << out.string()
              << " (--layers N writes fewer layers)\n";
  }
  prepare_out_dir(out, o.force);
  std::error_code ec;
  auto space = fs::space(out, ec);
  TIERMOE_CHECK(ec || space.available > total_bytes,
                str_of("not enough disk space: the checkpoint needs ", human_bytes(total_bytes),
                       ", ", human_bytes(space.available), " is free"),
                out.string(), "free space, pass --layers N, or write somewhere else");

  const auto shards = plan_shards(tensors, dtype, experts, max_shard_bytes);
  // Memory holds one shard at a time (and one quantized expert's draw).
  uint64_t largest_shard = 0;
  for (const auto& shard : shards) {
    uint64_t bytes = 0, draw = 0;
    for (size_t i : shard) {
      bytes += experts.bytes(tensors[i], dtype);
      if (experts.quantized(tensors[i])) {
        draw = std::max(draw, uint64_t(shape_numel(tensors[i].shape)) * dtype_size(dtype));
      }
    }
    largest_shard = std::max(largest_shard, bytes + draw);
  }
  check_host_memory(largest_shard, "writing the largest shard", out.string(),
                    "pass a smaller --max-shard-size, fewer --layers or a smaller --vocab-size");
  // Shard by shard (the random init, then the write): a progress line with
  // the rate and ETA when it takes more than a second.
  ProgressMeter meter(stderr_progress(), "init " + out.string(), double(total_bytes));
  // Written one shard at a time so that memory holds one shard, not the
  // model (61 GB for qwen3-30b-a3b in bf16).
  std::map<std::string, std::string> weight_map;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = checkpoint_shard_name(s, shards.size());
    const Shard shard = make_shard(tensors, shards[s], config, o.seed, dtype, experts);
    const std::vector<TensorBytes> written = shard.tensors();
    save_safetensors((out / name).string(), written);
    uint64_t bytes = 0;
    for (const TensorBytes& t : written) {
      weight_map[t.name] = name;
      bytes += t.nbytes;
    }
    meter.advance(double(bytes));
  }
  if (shards.size() > 1) save_checkpoint_index(out.string(), weight_map, total_bytes);
  meter.finish();
  // config.json goes last: a directory with a config.json is a finished checkpoint.
  if (experts.format) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(config.to_json());
    j["quantization_config"] =
        experts.format == QuantFormat::mxfp4
            ? nlohmann::ordered_json{{"quant_method", "mxfp4"},
                                     {"modules_to_not_convert",
                                      {"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                       "model.embed_tokens", "lm_head"}}}
            : nlohmann::ordered_json::parse(
                  pack_quantized_config(config, *experts.format, o.group).dump());
    write_file_atomic((out / "config.json").string(), j.dump(2) + "\n");
  } else {
    save_model_config(config, (out / "config.json").string());
  }

  std::cout << "wrote " << out.string() << ": " << o.preset << " (" << config.model_type << ", "
            << config.num_hidden_layers << " layers), " << tensors.size() << " tensors, "
            << human_count(counts.total) << " parameters, " << human_bytes(total_bytes) << " of "
            << dtype_name(dtype) << routed_as << " in "
            << (shards.size() == 1 ? std::string("model.safetensors")
                                   : std::to_string(shards.size()) + " shards")
            << " + config.json, seed " << o.seed << "\n";
}

}  // namespace

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
  cmd->add_option("--experts", opts->experts,
                  "Write the routed experts at int4|int8 (compressed-tensors' pack-quantized), "
                  "never in the dtype first");
  cmd->add_option("--group", opts->group, "Input columns per scale of --experts")
      ->capture_default_str()
      ->check(count_in(1, int64_t(1) << 20));
  cmd->add_flag("--force", opts->force, "Overwrite a checkpoint already in --out");
  cmd->callback([opts, layers] {
    opts->layers_given = layers->count() > 0;
    run_init(*opts);
  });
}

}  // namespace tiermoe::cli
