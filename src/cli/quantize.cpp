// tiermoe quantize: a checkpoint with its routed experts quantized to int4 or
// int8 in compressed-tensors' pack-quantized format (io/pack_quantized.h),
// which transformers 5, vLLM and the compressed-tensors package read, and
// which TierMoE keeps at that width. Everything else is copied as stored
// (tensors, tokenizer and generation files); config.json gains the
// quantization_config and is written last.
//
// One shard is held at a time: each expert matrix is read from the mapped
// source, quantized (quantize_int: compressed-tensors' min-max rule with
// bf16 scales) and packed; the other tensors are written from the mapping.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "commands.h"
#include "flag_bounds.h"
#include "tiermoe/core/bounds.h"
#include "tiermoe/core/files.h"
#include "tiermoe/io/hf_names.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/io/pack_quantized.h"
#include "tiermoe/io/safetensors.h"

namespace tiermoe::cli {

namespace {

namespace fs = std::filesystem;
using detail::str_of;

struct QuantizeOptions {
  std::string model, out, experts, max_shard_size = "5GB";
  int64_t group = 128;
  bool force = false;
};

// One unit of the output: a tensor copied as stored, or an expert matrix
// written as its three packed tensors; units are never split across shards.
struct Unit {
  std::string name;  // the source tensor
  bool expert = false;
  uint64_t bytes = 0;  // written
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void check_source(const QuantizeOptions& o, const ModelConfig& c, const CheckpointTensors& ck,
                  const std::vector<HfTensor>& experts) {
  TIERMOE_CHECK(c.quant_method.empty(),
                str_of("the checkpoint already ships quantized weights (", c.quant_method, ")"),
                o.model, "quantize a checkpoint in bf16 or f32");
  TIERMOE_CHECK(c.spec().expert_layout != ExpertLayout::fused_x_major,
                str_of(c.model_type, "'s experts are fused x-major tensors, shipped in ",
                       c.spec().shipped_experts),
                o.model, "train it from its release as shipped, which TierMoE reads at 4 bits");
  TIERMOE_CHECK(!experts.empty(), "the model has no routed experts", o.model,
                "quantize writes a mixture-of-experts' routed experts at low width");
  const HfTensor& first = experts.front();
  TIERMOE_CHECK(
      ck.contains(first.name),
      str_of("checkpoint lacks '", first.name, "' (its experts are not stored one by one)"),
      o.model,
      "quantize reads the per-expert layout save_pretrained writes (transformers 5: "
      "save_original_format=True); TierMoE's own checkpoints are in it");
  for (const HfTensor& t : experts) {
    TIERMOE_CHECK(t.shape[1] % o.group == 0,
                  str_of("--group ", o.group, " does not divide the input width ", t.shape[1],
                         " of '", t.name, "'"),
                  "--group",
                  "compressed-tensors' group strategy needs whole groups: pick a divisor "
                  "(32, 64 and 128 divide every released model's widths)");
    TIERMOE_CHECK(ck.contains(t.name) && ck.entry(t.name).shape == t.shape,
                  str_of("'", t.name, "' is ",
                         ck.contains(t.name) ? shape_str(ck.entry(t.name).shape) : "absent",
                         ", config.json implies ", shape_str(t.shape)),
                  o.model, "check config.json against the checkpoint");
  }
}

// Files of the model directory other than its config and tensors
// (tokenizer, generation config, chat template), copied beside the output.
void copy_side_files(const fs::path& from, const fs::path& to) {
  for (const auto& e : fs::directory_iterator(from)) {
    const std::string n = e.path().filename().string();
    if (!e.is_regular_file() || n == "config.json" || n.ends_with(".safetensors") ||
        n == "model.safetensors.index.json") {
      continue;
    }
    fs::copy_file(e.path(), to / n, fs::copy_options::overwrite_existing);
  }
}

void run_quantize(const QuantizeOptions& o) {
  const QuantFormat format = parse_quant_format(o.experts, "--experts");
  TIERMOE_CHECK(format == QuantFormat::int4 || format == QuantFormat::int8,
                str_of("--experts ", o.experts, " is not written by quantize"), "--experts",
                "int4 or int8 (compressed-tensors' W4A16 / W8A16)");
  const uint64_t max_shard = parse_bytes(o.max_shard_size, "--max-shard-size");
  TIERMOE_CHECK(max_shard > 0, "--max-shard-size must be positive", "--max-shard-size",
                "the default is 5GB");
  const fs::path src =
      fs::is_directory(o.model) ? fs::path(o.model) : fs::path(o.model).parent_path();
  const ModelConfig config = load_model_config(o.model);
  const CheckpointTensors ck = CheckpointTensors::open(o.model);
  std::vector<HfTensor> experts = hf_tensors(config);
  std::erase_if(experts, [](const HfTensor& t) { return t.role != HfRole::expert; });
  check_source(o, config, ck, experts);
  const std::set<std::string> expert_names = [&] {
    std::set<std::string> s;
    for (const HfTensor& t : experts) s.insert(t.name);
    return s;
  }();

  std::vector<Unit> units;
  uint64_t in_bytes = 0, out_bytes = 0;
  for (const std::string& name : ck.names()) {
    const SafetensorsEntry& e = ck.entry(name);
    const bool expert = expert_names.count(name) > 0;
    const uint64_t bytes =
        expert ? pack_quantized_bytes(format, e.shape[0], e.shape[1], o.group) : e.nbytes();
    units.push_back({name, expert, bytes});
    in_bytes += e.nbytes();
    out_bytes += bytes;
  }
  std::vector<uint64_t> sizes;
  for (const Unit& u : units) sizes.push_back(u.bytes);
  const auto shards = plan_checkpoint_shards(sizes, max_shard);

  const fs::path out(o.out);
  prepare_out_dir(out, o.force);
  std::error_code ec;
  const auto space = fs::space(out, ec);
  TIERMOE_CHECK(ec || space.available > out_bytes,
                str_of("not enough disk space: the checkpoint needs ", human_bytes(out_bytes), ", ",
                       human_bytes(space.available), " is free"),
                out.string(), "free space, or write somewhere else");

  ProgressMeter meter(stderr_progress(), "quantize " + out.string(), double(in_bytes));
  std::map<std::string, std::string> weight_map;
  for (size_t s = 0; s < shards.size(); ++s) {
    std::vector<PackedMatrix> packed;  // owns the expert tensors' bytes until written
    packed.reserve(shards[s].size());
    std::vector<TensorBytes> tensors;
    for (size_t i : shards[s]) {
      const Unit& u = units[i];
      const SafetensorsEntry& e = ck.entry(u.name);
      if (!u.expert) {
        tensors.push_back(
            {u.name, e.dtype, e.shape, ck.file_of(u.name).bytes(u.name).data(), e.nbytes()});
      } else {
        packed.push_back(pack_quantized(quantize_int(ck.view(u.name), format, o.group)));
        for (TensorBytes& t : packed.back().tensors(hf_module_of(u.name))) {
          tensors.push_back(std::move(t));
        }
      }
      meter.advance(double(e.nbytes()));
    }
    const std::string file = checkpoint_shard_name(s, shards.size());
    save_safetensors((out / file).string(), tensors);
    for (const TensorBytes& t : tensors) weight_map[t.name] = file;
  }
  if (shards.size() > 1) {
    uint64_t total = 0;
    for (const Unit& u : units) total += u.bytes;
    save_checkpoint_index(out.string(), weight_map, total);
  }
  meter.finish();
  copy_side_files(src, out);
  // config.json goes last: a directory with a config.json is a finished checkpoint.
  nlohmann::ordered_json cfg = nlohmann::ordered_json::parse(read_text(src / "config.json"));
  cfg["quantization_config"] =
      nlohmann::ordered_json::parse(pack_quantized_config(config, format, o.group).dump());
  write_file_atomic((out / "config.json").string(), cfg.dump(2) + "\n");

  std::cout << "wrote " << out.string() << ": " << experts.size() << " expert matrices at "
            << quant_format_name(format) << " (group " << o.group << ", bf16 scales), "
            << human_bytes(in_bytes) << " -> " << human_bytes(out_bytes) << " in "
            << (shards.size() == 1 ? std::string("model.safetensors")
                                   : std::to_string(shards.size()) + " shards")
            << " + config.json\n";
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "quantize",
      "Write a checkpoint with its routed experts at int4 or int8 (compressed-tensors' "
      "pack-quantized, as llm-compressor writes it; transformers, vLLM and TierMoE read it)");
  cmd->add_option("--model", o->model, "Checkpoint directory to read (bf16 or f32)")->required();
  cmd->add_option("--out", o->out, "Checkpoint directory to write")->required();
  cmd->add_option("--experts", o->experts, "int4|int8")->required();
  cmd->add_option("--group", o->group, "Input columns per scale (compressed-tensors' group_size)")
      ->capture_default_str()
      ->check(count_in(1, int64_t(1) << 20));
  cmd->add_option("--max-shard-size", o->max_shard_size,
                  "Largest safetensors file before sharding (bytes, or 500MB, 5GB, 2GiB)")
      ->capture_default_str();
  cmd->add_flag("--force", o->force, "Overwrite a checkpoint already in --out");
  cmd->callback([o] { run_quantize(*o); });
}

}  // namespace tiermoe::cli
