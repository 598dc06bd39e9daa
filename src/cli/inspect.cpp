// tiermoe inspect PATH: what a .safetensors file or a checkpoint directory
// holds (tensors, dtypes, shapes, bytes, metadata) and, for a directory with a
// config.json, the model it describes and its parameter counts, checked
// against the tensors actually present. A checkpoint that does not match its
// config is reported and exits 1; a malformed file exits 1 with the reader's
// error.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "commands.h"
#include "tiermoe/io/hf_names.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/io/stored_quant.h"

namespace tiermoe::cli {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using detail::str_of;

struct InspectOptions {
  std::string path;
  bool json = false;
  bool summary = false;
};

struct TensorRow {
  std::string name;
  std::string dtype;
  Shape shape;
  uint64_t bytes = 0;
  std::string file;  // file name within the checkpoint
};

struct FileInfo {
  std::string name;
  uint64_t bytes = 0;
  size_t tensors = 0;
  std::map<std::string, std::string> metadata;
};

struct Mismatches {
  std::vector<std::string> missing;     // expected by config.json, absent
  std::vector<std::string> unexpected;  // present, not expected
  std::vector<std::pair<std::string, std::pair<Shape, Shape>>> shape;  // name, (expected, got)
  bool empty() const { return missing.empty() && unexpected.empty() && shape.empty(); }
};

struct Report {
  std::string path;
  bool is_checkpoint = false;
  std::vector<FileInfo> files;
  std::vector<TensorRow> rows;
  std::optional<ModelConfig> config;
  int64_t tensor_params = 0;
  int64_t tensor_expert_params = 0;  // numel of tensors the config names as experts
  // numel of tensors the model skips (MTP layers, a multimodal release's vision tower)
  int64_t unread_params = 0;
  uint64_t tensor_bytes = 0;
  Mismatches mismatches;
  // Matrices stored at low width (io/stored_quant.h), by format: how many,
  // the parameters they hold and the bytes their tensors take.
  struct LowWidth {
    int64_t matrices = 0, params = 0;
    uint64_t bytes = 0;
    std::set<int64_t> groups;
  };
  std::map<std::string, LowWidth> low_width;
};

// "layers.2" before "layers.10": digit runs compare as numbers.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit((unsigned char)a[i]) && std::isdigit((unsigned char)b[j])) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && std::isdigit((unsigned char)a[i2])) ++i2;
      while (j2 < b.size() && std::isdigit((unsigned char)b[j2])) ++j2;
      std::string_view x(a.data() + i, i2 - i), y(b.data() + j, j2 - j);
      while (x.size() > 1 && x[0] == '0') x.remove_prefix(1);
      while (y.size() > 1 && y[0] == '0') y.remove_prefix(1);
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = i2, j = j2;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i, ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

void add_file(Report& r, const SafetensorsFile& f) {
  FileInfo info{fs::path(f.path()).filename().string(), f.file_size(), f.entries().size(),
                f.metadata()};
  for (const auto& e : f.entries()) {
    r.rows.push_back({e.name, e.dtype, e.shape, e.nbytes(), info.name});
  }
  r.files.push_back(std::move(info));
}

// The config's tensors against the files'; a matrix stored at low width
// counts as its parameters (its codes' and scales' tensors as its parts).
void cross_check(Report& r, const CheckpointTensors* ck) {
  const ModelConfig& c = *r.config;
  std::map<std::string, const TensorRow*> present;
  for (const auto& row : r.rows) present[row.name] = &row;
  std::map<std::string, bool> expected;
  auto stored = [&](const std::string& name) { return present.contains(name); };
  for (const HfTensor& t : hf_checkpoint_tensors(c, stored)) {
    expected[t.name] = true;
    auto it = present.find(t.name);
    const std::optional<StoredQuant> q =
        ck && !c.quant_method.empty() ? find_stored_quant(*ck, c, t.name) : std::nullopt;
    if (q && q->shape == t.shape) {
      Report::LowWidth& w = r.low_width[std::string(quant_format_name(q->format))];
      ++w.matrices;
      w.params += shape_numel(t.shape);
      w.groups.insert(q->group);
      for (const std::string& part : q->tensors) {
        expected[part] = true;
        w.bytes += present.at(part)->bytes;
        r.tensor_params -= shape_numel(present.at(part)->shape);
      }
      r.tensor_params += shape_numel(t.shape);
      if (t.role == HfRole::expert) r.tensor_expert_params += shape_numel(t.shape);
    } else if (it == present.end()) {
      r.mismatches.missing.push_back(t.name);
    } else if (it->second->shape != t.shape) {
      r.mismatches.shape.push_back({t.name, {t.shape, it->second->shape}});
    } else if (t.role == HfRole::expert) {
      r.tensor_expert_params += shape_numel(t.shape);
    }
  }
  for (const auto& row : r.rows) {
    if (expected.count(row.name)) continue;
    if (is_ignored_checkpoint_tensor(c, row.name)) {
      r.unread_params += shape_numel(row.shape);
    } else {
      r.mismatches.unexpected.push_back(row.name);
    }
  }
}

Report build_report(const std::string& path) {
  Report r;
  r.path = path;
  std::error_code ec;
  std::optional<CheckpointTensors> ckpt;
  if (fs::is_directory(path, ec)) {
    r.is_checkpoint = true;
    if (fs::exists(fs::path(path) / "config.json")) r.config = load_model_config(path);
    ckpt = CheckpointTensors::open(path);
    for (const auto& f : ckpt->files()) add_file(r, f);
  } else {
    TIERMOE_CHECK(fs::exists(path, ec), "no such file or directory", path,
                  "pass a .safetensors file or a checkpoint directory");
    add_file(r, SafetensorsFile::open(path));
  }
  // Module order (the config's tensor list) when there is a config, then
  // whatever it does not name; layers.2 before layers.10 either way.
  std::map<std::string, size_t> rank;
  if (r.config) {
    std::set<std::string> names;
    for (const auto& row : r.rows) names.insert(row.name);
    auto stored = [&](const std::string& name) { return names.contains(name); };
    for (const HfTensor& t : hf_checkpoint_tensors(*r.config, stored)) {
      rank.emplace(t.name, rank.size());
    }
  }
  auto rank_of = [&](const std::string& name) {
    auto it = rank.find(name);
    return it == rank.end() ? rank.size() : it->second;
  };
  std::sort(r.rows.begin(), r.rows.end(), [&](const TensorRow& a, const TensorRow& b) {
    size_t ra = rank_of(a.name), rb = rank_of(b.name);
    return ra != rb ? ra < rb : natural_less(a.name, b.name);
  });
  for (const auto& row : r.rows) {
    r.tensor_params += shape_numel(row.shape);
    r.tensor_bytes += row.bytes;
  }
  if (r.config) cross_check(r, ckpt ? &*ckpt : nullptr);
  return r;
}

std::string moe_layer_list(const ModelConfig& c) {
  std::vector<int64_t> moe;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.is_moe_layer(l)) moe.push_back(l);
  }
  if (int64_t(moe.size()) == c.num_hidden_layers) return "all";
  if (moe.empty()) return "none";
  std::string s;
  for (int64_t l : moe) s += (s.empty() ? "" : ",") + std::to_string(l);
  return s;
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

void print_text(const Report& r, bool summary) {
  std::ostream& os = std::cout;
  os << (r.is_checkpoint ? "checkpoint " : "safetensors file ") << r.path << ": "
     << r.rows.size() << " tensors, " << with_commas(r.tensor_params) << " parameters, "
     << human_bytes(r.tensor_bytes) << " of data in " << r.files.size() << " file"
     << (r.files.size() == 1 ? "" : "s") << "\n";
  for (const auto& f : r.files) {
    os << "  " << f.name << ": " << f.tensors << " tensors, " << human_bytes(f.bytes);
    if (!f.metadata.empty()) {
      os << ", metadata";
      for (const auto& [k, v] : f.metadata) os << " " << k << "=" << v;
    }
    os << "\n";
  }
  if (r.config) {
    const ModelConfig& c = *r.config;
    const ParamCounts n = param_counts(c);
    os << "config: " << c.model_type << ", " << c.num_hidden_layers
       << " layers (MoE layers: " << moe_layer_list(c) << "), vocab " << c.vocab_size << ", D "
       << c.hidden_size << ", heads " << c.num_attention_heads;
    if (c.mla()) {
      os << " of latent attention (q latent " << c.q_lora_rank << ", kv latent " << c.kv_lora_rank
         << ", q/k head " << c.qk_nope_head_dim << " + " << c.qk_rope_head_dim << " rope, v head "
         << c.v_head_dim << ")";
    } else {
      os << " q / " << c.num_key_value_heads << " kv x head_dim " << c.head_dim;
    }
    os << ", E " << c.num_experts << ", K " << c.num_experts_per_tok
       << (c.renormalize_topk() ? " (renormalised)" : "") << ", F " << c.moe_intermediate_size;
    if (c.num_moe_layers() < c.num_hidden_layers) os << ", dense I " << c.intermediate_size;
    os << ", " << c.torch_dtype << (c.tie_word_embeddings ? ", tied embeddings" : "") << "\n";
    os << "parameters: total " << with_commas(n.total) << " (" << human_count(n.total)
       << "), per expert " << with_commas(n.per_expert) << ", active per token "
       << with_commas(n.active_per_token) << " (" << human_count(n.active_per_token) << ")\n";
    for (const auto& [format, w] : r.low_width) {
      std::string groups;
      for (int64_t g : w.groups) groups += (groups.empty() ? "" : ",") + std::to_string(g);
      char bits[32];
      std::snprintf(bits, sizeof bits, "%.2f", double(w.bytes) * 8 / double(w.params));
      os << "stored at " << format << " (" << c.quant_method << ", group " << groups
         << "): " << w.matrices << " matrices, " << with_commas(w.params) << " parameters in "
         << human_bytes(w.bytes) << " (" << bits << " bits each, scales included)\n";
    }
    if (r.mismatches.empty()) {
      os << "tensors match config.json: " << with_commas(r.tensor_params) << " parameters, "
         << with_commas(r.tensor_expert_params) << " in experts";
      if (r.unread_params > 0) {
        os << "; " << with_commas(r.unread_params)
           << " of them in tensors the model does not read (MTP layers, a vision tower)";
      }
      os << "\n";
    } else {
      os << "MISMATCH with config.json: " << r.mismatches.missing.size() << " missing, "
         << r.mismatches.unexpected.size() << " unexpected, " << r.mismatches.shape.size()
         << " with another shape; tensors hold " << with_commas(r.tensor_params)
         << " parameters, config.json implies " << with_commas(n.total) << "\n";
      for (const auto& name : r.mismatches.missing) os << "  missing     " << name << "\n";
      for (const auto& name : r.mismatches.unexpected) os << "  unexpected  " << name << "\n";
      for (const auto& [name, shapes] : r.mismatches.shape) {
        os << "  shape       " << name << ": expected " << shape_str(shapes.first) << ", got "
           << shape_str(shapes.second) << "\n";
      }
    }
  } else if (r.is_checkpoint) {
    os << "config: none (no config.json in the directory)\n";
  }
  if (summary) return;
  size_t name_w = 4, shape_w = 5;
  for (const auto& row : r.rows) {
    name_w = std::max(name_w, row.name.size());
    shape_w = std::max(shape_w, shape_str(row.shape).size());
  }
  const bool show_file = r.files.size() > 1;
  os << "\n" << std::left << std::setw(int(name_w)) << "name" << "  " << std::setw(5) << "dtype"
     << "  " << std::setw(int(shape_w)) << "shape" << "  " << std::right << std::setw(12)
     << "bytes" << (show_file ? "  file" : "") << "\n";
  for (const auto& row : r.rows) {
    os << std::left << std::setw(int(name_w)) << row.name << "  " << std::setw(5) << row.dtype
       << "  " << std::setw(int(shape_w)) << shape_str(row.shape) << "  " << std::right
       << std::setw(12) << row.bytes << (show_file ? "  " + row.file : "") << "\n";
  }
}

void print_json(const Report& r, bool summary) {
  Json j;
  j["path"] = r.path;
  j["kind"] = r.is_checkpoint ? "checkpoint" : "safetensors";
  j["files"] = Json::array();
  for (const auto& f : r.files) {
    j["files"].push_back(
        {{"name", f.name}, {"bytes", f.bytes}, {"tensors", f.tensors}, {"metadata", f.metadata}});
  }
  j["tensor_count"] = r.rows.size();
  j["tensor_params"] = r.tensor_params;
  j["tensor_bytes"] = r.tensor_bytes;
  if (!summary) {
    j["tensors"] = Json::array();
    for (const auto& row : r.rows) {
      j["tensors"].push_back({{"name", row.name},
                              {"dtype", row.dtype},
                              {"shape", row.shape},
                              {"bytes", row.bytes},
                              {"file", row.file}});
    }
  }
  if (r.config) {
    const ModelConfig& c = *r.config;
    std::vector<int64_t> moe;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      if (c.is_moe_layer(l)) moe.push_back(l);
    }
    j["config"] = {{"model_type", c.model_type},
                   {"num_hidden_layers", c.num_hidden_layers},
                   {"hidden_size", c.hidden_size},
                   {"num_attention_heads", c.num_attention_heads},
                   {"num_key_value_heads", c.num_key_value_heads},
                   {"head_dim", c.head_dim},
                   {"num_experts", c.num_experts},
                   {"num_experts_per_tok", c.num_experts_per_tok},
                   {"moe_intermediate_size", c.moe_intermediate_size},
                   {"intermediate_size", c.intermediate_size},
                   {"vocab_size", c.vocab_size},
                   {"moe_layers", moe},
                   {"renormalize_topk", c.renormalize_topk()},
                   {"tie_word_embeddings", c.tie_word_embeddings},
                   {"torch_dtype", c.torch_dtype}};
    if (c.mla()) {
      j["config"]["q_lora_rank"] = c.q_lora_rank;
      j["config"]["kv_lora_rank"] = c.kv_lora_rank;
      j["config"]["qk_nope_head_dim"] = c.qk_nope_head_dim;
      j["config"]["qk_rope_head_dim"] = c.qk_rope_head_dim;
      j["config"]["v_head_dim"] = c.v_head_dim;
    }
    const ParamCounts n = param_counts(c);
    j["params"] = {{"total", n.total},
                   {"per_expert", n.per_expert},
                   {"active_per_token", n.active_per_token},
                   {"experts", n.experts},
                   {"embedding", n.embedding},
                   {"tensors_total", r.tensor_params},
                   {"tensors_experts", r.tensor_expert_params},
                   {"tensors_unread", r.unread_params}};
    Json shape = Json::array();
    for (const auto& [name, shapes] : r.mismatches.shape) {
      shape.push_back({{"name", name}, {"expected", shapes.first}, {"got", shapes.second}});
    }
    j["mismatches"] = {{"missing", r.mismatches.missing},
                       {"unexpected", r.mismatches.unexpected},
                       {"shape", shape}};
    j["consistent"] = r.mismatches.empty();
    j["stored_at_low_width"] = Json::object();
    for (const auto& [format, w] : r.low_width) {
      j["stored_at_low_width"][format] = {{"matrices", w.matrices},
                                          {"params", w.params},
                                          {"bytes", w.bytes},
                                          {"groups", w.groups},
                                          {"quant_method", c.quant_method}};
    }
  }
  std::cout << j.dump() << "\n";
}

void run_inspect(const InspectOptions& o) {
  const Report r = build_report(o.path);
  if (o.json) print_json(r, o.summary);
  else print_text(r, o.summary);
  std::cout.flush();
  const Mismatches& m = r.mismatches;
  TIERMOE_CHECK(m.empty(),
                str_of("the checkpoint does not match its config.json: ", m.missing.size(),
                       " tensors missing, ", m.unexpected.size(), " unexpected, ", m.shape.size(),
                       " with another shape"),
                o.path, "the listing above names them; was config.json written for these weights?");
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto opts = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "Show the tensors of a .safetensors file or checkpoint directory, its config "
                 "and parameter counts");
  cmd->add_option("path", opts->path, "A .safetensors file or a checkpoint directory")
      ->required();
  cmd->add_flag("--json", opts->json, "Print one JSON object instead of text");
  cmd->add_flag("--summary", opts->summary, "Leave out the per-tensor listing");
  cmd->callback([opts] { run_inspect(*opts); });
}

}  // namespace tiermoe::cli
