#include "tiermoe/model/checkpoint.h"

#include <filesystem>
#include <set>

#include "param_slot.h"
#include "tiermoe/io/safetensors.h"

namespace tiermoe {

bool is_ignored_checkpoint_tensor(const std::string& name) {
  return name.ends_with("rotary_emb.inv_freq");
}

int64_t hf_expert_index(std::string_view name) {
  static constexpr std::string_view kExperts = ".experts.";
  const size_t at = name.find(kExperts);
  if (at == std::string_view::npos) return -1;
  const size_t begin = at + kExperts.size();
  size_t end = begin;
  while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
  if (end == begin || end - begin > 9 || end >= name.size() || name[end] != '.') return -1;
  return std::stoll(std::string(name.substr(begin, end - begin)));
}

namespace {

using detail::str_of;

// One on-disk tensor and where its values go: all of it, or (a fused
// expert tensor under expert parallelism) its rows [row0, row0 + dest rows).
struct LoadItem {
  std::string name;
  Tensor dest;
  int64_t row0 = -1;
};

class LoadPlan {
 public:
  LoadPlan(const CheckpointTensors& ck, const ModelConfig& c) : ck_(ck), c_(c) {}

  bool has(const std::string& name) const { return ck_.contains(name); }

  void add(const std::string& name, const Tensor& dest) {
    check(name, dest.shape());
    items_.push_back({name, dest});
    used_.insert(name);
  }

  // Rows [row0, row0 + dest.size(0)) of a stacked tensor of `rows` rows.
  void add_rows(const std::string& name, const Tensor& dest, int64_t row0, int64_t rows) {
    Shape whole = dest.shape();
    whole[0] = rows;
    check(name, whole);
    items_.push_back({name, dest, row0});
    used_.insert(name);
  }

  // Another rank's expert: its owner loads it.
  void skip(const std::string& name) { used_.insert(name); }

  void check(const std::string& name, const Shape& want) const {
    TIERMOE_CHECK(ck_.contains(name), "checkpoint lacks tensor '" + name + "'", ck_.dir(),
                  str_of("config.json (", family_name(c_.family), ", ", c_.num_hidden_layers,
                         " layers, ", c_.num_experts, " experts) implies it; is config.json from "
                         "another checkpoint, or a tensor missing from the index?"));
    const Shape& got = ck_.entry(name).shape;
    TIERMOE_CHECK(got == want,
                  str_of("tensor '", name, "' has shape ", shape_str(got),
                         " but config.json implies ", shape_str(want)),
                  ck_.dir(), shape_hint(name));
  }

  // Every checkpoint tensor must be used (or a skipped buffer).
  void check_no_extra() const {
    std::vector<std::string> extra;
    for (const std::string& n : ck_.names()) {
      if (!used_.count(n) && !is_ignored_checkpoint_tensor(n)) extra.push_back(n);
    }
    if (extra.empty()) return;
    std::string list;
    for (size_t i = 0; i < extra.size() && i < 5; ++i) list += (i ? ", '" : "'") + extra[i] + "'";
    if (extra.size() > 5) list += str_of(" and ", extra.size() - 5, " more");
    throw Error(str_of("checkpoint has ", extra.size(), " tensor(s) the config does not use: ", list),
                ck_.dir(),
                "check num_hidden_layers, num_experts, mlp_only_layers and attention_bias in "
                "config.json against the checkpoint");
  }

  // Progress counts the bytes read from the files (a fused tensor's whole
  // size for each slice of it a rank takes).
  void load(DType compute, ProgressSink progress) const {
    double total = 0;
    for (const LoadItem& it : items_) total += double(ck_.entry(it.name).nbytes());
    ProgressMeter meter(progress, "load " + ck_.dir(), total);
    for (const LoadItem& it : items_) {
      Tensor dest = it.dest;
      Tensor src = ck_.load(it.name, compute, MemTag::activations);
      dest.copy_from(it.row0 < 0 ? src : src.rows(it.row0, it.row0 + dest.size(0)));
      meter.advance(double(ck_.entry(it.name).nbytes()));
    }
    meter.finish();
  }

 private:
  std::string shape_hint(const std::string& name) const {
    if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
      return str_of("the shape is [vocab_size, hidden_size] = [", c_.vocab_size, ", ",
                    c_.hidden_size, "]; check vocab_size and hidden_size in config.json");
    }
    return "check config.json (hidden_size, head_dim, heads, intermediate sizes, num_experts) "
           "against the checkpoint";
  }

  const CheckpointTensors& ck_;
  const ModelConfig& c_;
  std::vector<LoadItem> items_;
  std::set<std::string> used_;
};

}  // namespace

namespace {

constexpr const char* kEmbed = "model.embed_tokens.weight";
constexpr const char* kLmHead = "lm_head.weight";

// Whether two stored tensors hold equal values once loaded in `compute`
// (torch.equal on the loaded parameters: -0 equals 0, NaN equals nothing).
bool same_values(const CheckpointTensors& ck, const std::string& a, const std::string& b,
                 DType compute) {
  if (ck.entry(a).shape != ck.entry(b).shape) return false;
  Tensor x = ck.load(a, compute, MemTag::activations).to(DType::f64, MemTag::activations);
  Tensor y = ck.load(b, compute, MemTag::activations).to(DType::f64, MemTag::activations);
  const double* px = x.data<double>();
  const double* py = y.data<double>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (!(px[i] == py[i])) return false;
  }
  return true;
}

// A tied config whose checkpoint also stores lm_head.weight, read as
// transformers 5 reads it (PreTrainedModel.tie_weights during from_pretrained):
// with values equal to the embedding's the two stay tied; with other values
// the config does not describe the checkpoint and the model is untied, each
// weight its own. The name of the embedding the tied model reads: its own,
// or lm_head.weight when the checkpoint stores only that (transformers ties
// the pair the other way round then).
std::string resolve_tied_head(ModelConfig& config, const CheckpointTensors& ck, DType compute) {
  if (!config.tie_word_embeddings || !ck.contains(kLmHead)) return kEmbed;
  if (!ck.contains(kEmbed)) return kLmHead;
  if (!same_values(ck, kEmbed, kLmHead, compute)) config.tie_word_embeddings = false;
  return kEmbed;
}

}  // namespace

CausalLM CausalLM::from_checkpoint(const std::string& dir, DType compute, Comm* comm,
                                   ProgressSink progress) {
  ModelConfig config = load_model_config(dir);
  check_model_supported(config, (std::filesystem::path(dir) / "config.json").string());
  CheckpointTensors ck = CheckpointTensors::open(dir);
  const std::string embed_source = resolve_tied_head(config, ck, compute);
  CausalLM model(config, compute, comm);
  LoadPlan plan(ck, config);
  // A tied model reads one of the pair; the other holds the same values.
  if (config.tie_word_embeddings && ck.contains(kLmHead)) plan.skip(kLmHead);
  for (const std::string& name : ck.names()) {
    const int64_t e = hf_expert_index(name);
    if (e >= 0 && e < config.num_experts && !model.holds_expert(e)) plan.skip(name);
  }

  std::set<int64_t> fused_layers;
  for (Slot& s : model.slots(/*with_grads=*/false)) {
    const ModelParam& p = s.param;
    if (p.role == HfRole::router && config.family == ModelFamily::mixtral) {
      // transformers v5 renames block_sparse_moe.gate to mlp.gate
      std::string v5 = p.name;
      v5.replace(v5.find("block_sparse_moe."), 17, "mlp.");
      plan.add(plan.has(p.name) || !plan.has(v5) ? p.name : v5, p.value);
      continue;
    }
    if (p.role == HfRole::embedding) {
      plan.add(embed_source, p.value);
      continue;
    }
    if (p.role != HfRole::expert) {
      plan.add(p.name, p.value);
      continue;
    }
    // The layer index from "model.layers.{l}."
    const int64_t l = std::stoll(p.name.substr(13, p.name.find('.', 13) - 13));
    const std::string fused = "model.layers." + std::to_string(l) + ".mlp.experts.";
    if (plan.has(fused + "gate_up_proj") || plan.has(fused + "down_proj")) {
      if (fused_layers.insert(l).second) {
        GroupedExperts& ex = model.layer(l).moe()->experts();
        const int64_t e0 = model.first_expert(), E = config.num_experts;
        plan.add_rows(fused + "gate_up_proj", ex.param("w13"), e0, E);
        plan.add_rows(fused + "down_proj", ex.param("w2"), e0, E);
      }
      continue;
    }
    plan.add(p.name, p.value);
  }
  plan.check_no_extra();
  plan.load(compute, progress);
  return model;
}

NamedTensors CausalLM::checkpoint_tensors(DType storage, bool experts_only) const {
  // slots() only builds views here (no grads), so it does not change the model.
  auto& self = const_cast<CausalLM&>(*this);
  NamedTensors tensors;
  for (Slot& s : self.slots(/*with_grads=*/false)) {
    if (experts_only && s.param.expert < 0) continue;
    Tensor t = s.param.value;
    tensors.emplace_back(s.param.name,
                         t.dtype() == storage ? t : t.to(storage, MemTag::activations));
  }
  return tensors;
}

void CausalLM::save_checkpoint(const std::string& dir, std::optional<DType> storage,
                               uint64_t max_shard_bytes) const {
  TIERMOE_CHECK(ep_ranks() == 1, "save_checkpoint of an expert-parallel model", "CausalLM",
                "every rank holds part of the experts: write the ranks' parts together "
                "(tiermoe train's checkpoints do)");
  const DType dt = storage.value_or(dtype_);
  save_checkpoint_tensors(dir, checkpoint_tensors(dt, /*experts_only=*/false), max_shard_bytes);
  ModelConfig c = config_;
  c.torch_dtype = torch_dtype_name(dt);
  save_model_config(c, (std::filesystem::path(dir) / "config.json").string());
}

}  // namespace tiermoe
