#include "fuzz/fuzz_entries.h"

#include <algorithm>
#include <fstream>

#include "tiermoe/core/error.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/io/peft.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/io/sft_jsonl.h"
#include "tiermoe/io/tokens.h"
#include "tiermoe/report/report_data.h"
#include "tiermoe/tier/routing_profile.h"

namespace tiermoe::fuzz {

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kNames[] = {"safetensors", "shard_index", "config", "tokens",
                                       "peft",        "profile",     "sft",    "metrics"};

void write_file(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) throw std::runtime_error("fuzz harness: cannot write " + path.string());
}

// Reads every tensor's bytes, so offsets the header let through are touched.
double touch(const Tensor& t) {
  double sum = 0;
  for (int64_t i = 0; i < t.numel(); ++i) sum += t.get(i);
  return sum;
}

bool readable_dtype(const std::string& dtype) {
  return dtype == "F64" || dtype == "F32" || dtype == "BF16";
}

void read_safetensors(const fs::path& path) {
  SafetensorsFile f = SafetensorsFile::open(path.string());
  for (const SafetensorsEntry& e : f.entries()) {
    (void)f.bytes(e.name);
    if (readable_dtype(e.dtype)) {
      touch(f.view(e.name));
      (void)f.load(e.name, DType::bf16);
    }
  }
}

// Parts: the index, then up to two shards named as the seeds' index names them.
void read_checkpoint(std::string_view data, const fs::path& dir) {
  std::vector<std::string_view> parts = split_fuzz_parts(data, 3);
  write_file(dir / "model.safetensors.index.json", parts[0]);
  const char* shards[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
  for (size_t i = 1; i < parts.size(); ++i) write_file(dir / shards[i - 1], parts[i]);
  CheckpointTensors ck = CheckpointTensors::open(dir.string());
  for (const std::string& name : ck.names()) {
    if (readable_dtype(ck.entry(name).dtype)) touch(ck.view(name));
  }
}

void read_config(std::string_view data, const fs::path& dir) {
  write_file(dir / "config.json", data);
  ModelConfig c = load_model_config((dir / "config.json").string());
  (void)param_counts(c);
  // What TierMoE writes it reads back as the same config.
  ModelConfig back = parse_model_config(c.to_json(), "fuzz: to_json");
  if (back.to_json() != c.to_json()) throw std::logic_error("config.json does not round-trip");
}

void read_tokens_file(std::string_view data, const fs::path& dir) {
  write_file(dir / "tokens", data);
  std::vector<int32_t> tokens = read_tokens((dir / "tokens").string());
  validate_tokens(tokens, 1 << 20, (dir / "tokens").string());
}

// Parts: adapter_config.json, then adapter_model.safetensors.
void read_peft(std::string_view data, const fs::path& dir) {
  std::vector<std::string_view> parts = split_fuzz_parts(data, 2);
  write_file(dir / kPeftConfigFile, parts[0]);
  if (parts.size() > 1) write_file(dir / kPeftWeightsFile, parts[1]);
  PeftAdapter a = load_peft_adapter(dir.string());
  for (const auto& [path, w] : a.modules) {
    touch(w.A_RI);
    touch(w.B_OR);
  }
}

void read_profile(std::string_view data) {
  RoutingProfile p = RoutingProfile::from_json(data, "fuzz: profile");
  RoutingProfile back = RoutingProfile::from_json(p.to_json(), "fuzz: to_json");
  if (back.layers() != p.layers() || back.experts() != p.experts()) {
    throw std::logic_error("routing profile does not round-trip");
  }
}

// SFT JSON Lines, read whole and kept to a few tokens an example, as a run
// of a short --seq-len reads them.
void read_sft(std::string_view data, const fs::path& dir) {
  write_file(dir / "data.jsonl", data);
  const std::vector<SftExample> whole = read_sft_jsonl((dir / "data.jsonl").string());
  const std::vector<SftExample> cut = read_sft_jsonl((dir / "data.jsonl").string(), 4);
  if (cut.size() != whole.size()) throw std::logic_error("max_tokens changed the examples read");
  for (size_t i = 0; i < whole.size(); ++i) {
    const size_t n = std::min<size_t>(4, whole[i].input_ids.size());
    if (cut[i].input_ids.size() != n || cut[i].labels.size() != n ||
        !std::equal(cut[i].labels.begin(), cut[i].labels.end(), whole[i].labels.begin())) {
      throw std::logic_error("max_tokens did not keep the example's prefix");
    }
  }
}

// The report's metrics (--metrics JSON Lines) and a plan --json.
void read_metrics_and_plan(std::string_view data) {
  (void)parse_metrics(std::string(data), "fuzz: metrics");
  try {
    (void)parse_plan(std::string(data), "fuzz: plan");
  } catch (const Error&) {
  }
}

}  // namespace

std::string_view fuzz_target_name(FuzzTarget target) { return kNames[size_t(target)]; }

std::optional<FuzzTarget> fuzz_target_from_name(std::string_view name) {
  for (FuzzTarget t : kFuzzTargets) {
    if (fuzz_target_name(t) == name) return t;
  }
  return std::nullopt;
}

std::vector<std::string_view> split_fuzz_parts(std::string_view data, size_t max_parts) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t at = data.find(kFuzzPartSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(data.substr(0, at));
    data.remove_prefix(at + kFuzzPartSeparator.size());
  }
  parts.push_back(data);
  return parts;
}

void run_fuzz_input(FuzzTarget target, std::span<const uint8_t> data, const fs::path& scratch) {
  fs::remove_all(scratch);
  fs::create_directories(scratch);
  const std::string_view bytes(reinterpret_cast<const char*>(data.data()), data.size());
  try {
    switch (target) {
      case FuzzTarget::safetensors:
        write_file(scratch / "x.safetensors", bytes);
        read_safetensors(scratch / "x.safetensors");
        break;
      case FuzzTarget::shard_index:
        read_checkpoint(bytes, scratch);
        break;
      case FuzzTarget::config:
        read_config(bytes, scratch);
        break;
      case FuzzTarget::tokens:
        read_tokens_file(bytes, scratch);
        break;
      case FuzzTarget::peft:
        read_peft(bytes, scratch);
        break;
      case FuzzTarget::profile:
        read_profile(bytes);
        break;
      case FuzzTarget::sft:
        read_sft(bytes, scratch);
        break;
      case FuzzTarget::metrics:
        read_metrics_and_plan(bytes);
        break;
    }
  } catch (const Error&) {
    // A rejection with what, where and a hint: the reader did its job.
  }
}

}  // namespace tiermoe::fuzz
