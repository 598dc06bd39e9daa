// Sharded checkpoints as huggingface_hub writes them: model.safetensors, or
// model-0000i-of-0000n.safetensors plus model.safetensors.index.json.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>

#include "safetensors_common.h"
#include "tiermoe/core/files.h"
#include "tiermoe/io/safetensors.h"

namespace tiermoe {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr uint64_t kMaxIndexBytes = 1'000'000'000;

// Built step by step: GCC 12 warns falsely (-Wrestrict) on "'" + string&&.
std::string quoted(const std::string& name) {
  std::string s = "'";
  s += detail::printable(name);
  s += "'";
  return s;
}

// Shard names come from a file we did not write: keep them inside the dir.
void check_shard_name(const std::string& shard, const std::string& where) {
  TIERMOE_CHECK(!shard.empty() && shard != "." && shard != ".." &&
                    shard.find('/') == std::string::npos && shard.find('\0') == std::string::npos,
                "weight_map names shard \"" + detail::printable(shard) +
                    "\", which is not a plain file name",
                where, "shards must be files directly inside the checkpoint directory");
}

// name -> shard file name, from model.safetensors.index.json.
std::map<std::string, std::string> read_weight_map(const std::string& index_path) {
  std::string text = detail::read_small_file(index_path, kMaxIndexBytes);
  // Depth: root > weight_map or metadata > (unknown metadata values, kept shallow).
  nlohmann::json index = detail::parse_json_strict(text, 8, index_path, "index");
  const std::string hint = "expected {\"metadata\": {...}, \"weight_map\": {\"tensor\": \"shard\"}}";
  TIERMOE_CHECK(index.is_object() && index.contains("weight_map"),
                "index has no \"weight_map\" object", index_path, hint);
  const nlohmann::json& map = index["weight_map"];
  TIERMOE_CHECK(map.is_object(), "\"weight_map\" is not an object", index_path, hint);
  TIERMOE_CHECK(!map.empty(), "\"weight_map\" is empty", index_path, hint);
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, shard] : map.items()) {
    TIERMOE_CHECK(shard.is_string(),
                  "weight_map entry for tensor " + quoted(name) + " is not a file name string",
                  index_path, hint);
    check_shard_name(shard.get<std::string>(), index_path);
    weight_map[name] = shard.get<std::string>();
  }
  return weight_map;
}

// model-DDDDD-of-DDDDD.safetensors
bool is_shard_name(const std::string& name) {
  const std::string pattern = "model-#####-of-#####.safetensors";
  if (name.size() != pattern.size()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    bool ok = pattern[i] == '#' ? (name[i] >= '0' && name[i] <= '9') : name[i] == pattern[i];
    if (!ok) return false;
  }
  return true;
}

// Removes files of an earlier save that the new one did not rewrite, so a
// reader never mixes the two (e.g. a stale index over a new single file).
void remove_stale_files(const fs::path& dir, const std::set<std::string>& written) {
  for (const auto& item : fs::directory_iterator(dir)) {
    std::string name = item.path().filename().string();
    bool ours = name == kSingleFile || name == kIndexFile ||
                is_shard_name(name);
    if (ours && !written.count(name)) fs::remove(item.path());
  }
}

}  // namespace

CheckpointTensors CheckpointTensors::open(const std::string& dir) {
  CheckpointTensors ckpt;
  ckpt.dir_ = dir;
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) {
    // A lone .safetensors file is a one-file checkpoint.
    ckpt.files_.push_back(SafetensorsFile::open(dir));
    for (const auto& e : ckpt.files_[0].entries()) ckpt.shard_of_[e.name] = 0;
    ckpt.read_language_model();
    return ckpt;
  }
  TIERMOE_CHECK(fs::is_directory(dir, ec), "checkpoint directory does not exist", dir,
                "pass a Hugging Face checkpoint directory (with model.safetensors or "
                "model.safetensors.index.json)");
  const fs::path index_path = fs::path(dir) / kIndexFile;
  const fs::path single_path = fs::path(dir) / kSingleFile;

  // transformers' order: model.safetensors when it is there, even beside
  // an index (from_pretrained looks for it first), else the index.
  if (fs::exists(single_path, ec) || !fs::exists(index_path, ec)) {
    TIERMOE_CHECK(fs::exists(single_path, ec),
                  std::string("no ") + kSingleFile + " or " + kIndexFile + " in the directory",
                  dir, "pass a Hugging Face checkpoint directory, or a .safetensors file");
    ckpt.files_.push_back(SafetensorsFile::open(single_path.string()));
    for (const auto& e : ckpt.files_[0].entries()) ckpt.shard_of_[e.name] = 0;
    ckpt.read_language_model();
    return ckpt;
  }

  const std::string where = index_path.string();
  std::map<std::string, std::string> weight_map = read_weight_map(where);
  std::set<std::string> shards;
  for (const auto& [name, shard] : weight_map) shards.insert(shard);
  std::map<std::string, size_t> file_index;  // shard name -> index in files_
  for (const std::string& shard : shards) {
    fs::path shard_path = fs::path(dir) / shard;
    TIERMOE_CHECK(fs::exists(shard_path, ec),
                  "shard \"" + detail::printable(shard) + "\" listed in the index does not exist",
                  where, "the checkpoint is incomplete; re-download the missing shard");
    // A link to /dev/zero or to a directory: say what stands there.
    require_regular_file(shard_path.string(),
                         "shard \"" + detail::printable(shard) + "\" listed in " + where,
                         "a shard is a .safetensors file; re-download it");
    file_index[shard] = ckpt.files_.size();
    ckpt.files_.push_back(SafetensorsFile::open(shard_path.string()));
  }
  for (size_t i = 0; i < ckpt.files_.size(); ++i) {
    for (const SafetensorsEntry& e : ckpt.files_[i].entries()) {
      auto [it, fresh] = ckpt.shard_of_.emplace(e.name, i);
      TIERMOE_CHECK(fresh,
                    "tensor " + quoted(e.name) + " is in two shards: " +
                        fs::path(ckpt.files_[it->second].path()).filename().string() + " and " +
                        fs::path(ckpt.files_[i].path()).filename().string(),
                    where, "the checkpoint is inconsistent; re-export it");
      TIERMOE_CHECK(weight_map.count(e.name),
                    "tensor " + quoted(e.name) + " in shard " +
                        fs::path(ckpt.files_[i].path()).filename().string() +
                        " is not listed in the index's weight_map",
                    where, "the index is stale; re-export the checkpoint");
    }
  }
  for (const auto& [name, shard] : weight_map) {
    TIERMOE_CHECK(ckpt.files_[file_index[shard]].contains(name),
                  "tensor " + quoted(name) + " is mapped to shard \"" +
                      detail::printable(shard) + "\" but is missing from it",
                  where, "the index does not match the shards; re-export the checkpoint");
  }
  ckpt.read_language_model();
  return ckpt;
}

void CheckpointTensors::read_language_model() {
  static const std::string kStored = "model.language_model.", kAs = "model.";
  const bool wrapped = std::any_of(shard_of_.begin(), shard_of_.end(),
                                   [](const auto& kv) { return kv.first.starts_with(kStored); });
  if (!wrapped) return;
  std::map<std::string, size_t> renamed;
  for (size_t i = 0; i < files_.size(); ++i) {
    files_[i].read_prefix_as(kStored, kAs);
    for (const SafetensorsEntry& e : files_[i].entries()) {
      TIERMOE_CHECK(renamed.emplace(e.name, i).second,
                    "tensor " + quoted(e.name) +
                        " is in two shards once model.language_model. "
                        "is read as model.",
                    dir_, "a checkpoint holds a model under one of the two names, not both");
    }
  }
  shard_of_ = std::move(renamed);
}

std::vector<std::string> CheckpointTensors::names() const {
  std::vector<std::string> out;
  out.reserve(shard_of_.size());
  for (const auto& [name, shard] : shard_of_) out.push_back(name);
  return out;
}

bool CheckpointTensors::contains(const std::string& name) const {
  return shard_of_.count(name) > 0;
}

const SafetensorsFile& CheckpointTensors::file_of(const std::string& name) const {
  auto it = shard_of_.find(name);
  TIERMOE_CHECK(it != shard_of_.end(), "no tensor " + quoted(name) + " in the checkpoint", dir_,
                "list the checkpoint's tensors with `tiermoe inspect " + dir_ + "`");
  return files_[it->second];
}

const SafetensorsEntry& CheckpointTensors::entry(const std::string& name) const {
  return file_of(name).entry(name);
}

Tensor CheckpointTensors::view(const std::string& name) const { return file_of(name).view(name); }

Tensor CheckpointTensors::load(const std::string& name, DType dtype, MemTag tag) const {
  return file_of(name).load(name, dtype, tag);
}

std::vector<std::vector<size_t>> plan_checkpoint_shards(const std::vector<uint64_t>& bytes,
                                                        uint64_t max_shard_bytes) {
  TIERMOE_CHECK(max_shard_bytes > 0, "max_shard_bytes must be positive", "checkpoint sharding",
                "the default is 5 GB");
  // huggingface_hub's split: fill shards greedily in the given order; a
  // tensor over the limit becomes a shard of its own while the current shard
  // keeps filling.
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_bytes = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] > max_shard_bytes) {
      shards.push_back({i});
      continue;
    }
    if (current_bytes + bytes[i] > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += bytes[i];
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));
  return shards;
}

std::string checkpoint_shard_name(size_t i, size_t n) {
  if (n == 1) return kSingleFile;
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

void save_checkpoint_index(const std::string& dir,
                           const std::map<std::string, std::string>& weight_map,
                           uint64_t total_size) {
  // transformers writes the index with sorted keys, indent 2 and a newline.
  nlohmann::json index = {{"metadata", {{"total_size", total_size}}},
                          {"weight_map", weight_map}};
  std::string text = index.dump(2) + "\n";
  AtomicFile file((fs::path(dir) / kIndexFile).string());
  file.write(text.data(), text.size());
  file.commit();
}

std::vector<std::string> save_checkpoint_tensors(const std::string& dir,
                                                 const NamedTensors& tensors,
                                                 uint64_t max_shard_bytes) {
  std::set<std::string> names;
  std::vector<uint64_t> bytes;
  uint64_t total_size = 0;
  for (const auto& [name, t] : tensors) {
    TIERMOE_CHECK(names.insert(name).second, "duplicate tensor name " + quoted(name), dir,
                  "each tensor name may appear once in a checkpoint");
    TIERMOE_CHECK(t.defined(), "tensor " + quoted(name) + " is undefined", dir,
                  "this is a bug in the caller");
    bytes.push_back(t.nbytes());
    total_size += t.nbytes();
  }
  const std::vector<std::vector<size_t>> plan = plan_checkpoint_shards(bytes, max_shard_bytes);

  std::error_code ec;
  fs::create_directories(dir, ec);
  TIERMOE_CHECK(fs::is_directory(dir), "cannot create the checkpoint directory: " + ec.message(),
                dir, "check the path and permissions");

  std::vector<std::string> written;
  std::set<std::string> written_names;
  std::map<std::string, std::string> weight_map;
  for (size_t s = 0; s < plan.size(); ++s) {
    std::string name = checkpoint_shard_name(s, plan.size());
    NamedTensors shard;
    for (size_t i : plan[s]) {
      shard.push_back(tensors[i]);
      weight_map[tensors[i].first] = name;
    }
    written.push_back((fs::path(dir) / name).string());
    save_safetensors(written.back(), shard);
    written_names.insert(name);
  }
  if (plan.size() > 1) {
    // The index goes last: until it lands, readers see the previous save.
    save_checkpoint_index(dir, weight_map, total_size);
    written.push_back((fs::path(dir) / kIndexFile).string());
    written_names.insert(kIndexFile);
  }
  remove_stale_files(dir, written_names);
  return written;
}

}  // namespace tiermoe
