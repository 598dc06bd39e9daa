#include "tiermoe/core/allocator.h"
#include "tiermoe/model/checkpoint.h"

#include <filesystem>
#include <set>

#include "param_slot.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/io/mxfp4.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/io/stored_quant.h"
#include "tiermoe/kernels/matmul_mixed.h"

namespace tiermoe {

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

Tensor swap_last_two_dims(const Tensor& x, MemTag tag) {
  const int64_t E = x.size(0), A = x.size(1), Bn = x.size(2);
  Tensor out = Tensor::empty({E, Bn, A}, x.dtype(), tag);
  visit_dtype(x.dtype(), [&]<class T>() {
    const T* src = x.data<T>();
    T* dst = out.data<T>();
    parallel_for(E * Bn, 64, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t e = r / Bn, b = r % Bn;
        for (int64_t a = 0; a < A; ++a) dst[r * A + a] = src[(e * A + a) * Bn + b];
      }
    });
  });
  return out;
}

namespace {

using detail::str_of;

// The weight matrices WeightBinding::mapped keeps at their stored width.
bool is_matrix_role(HfRole r) {
  return r == HfRole::embedding || r == HfRole::lm_head || r == HfRole::attention ||
         r == HfRole::dense_mlp || r == HfRole::expert;
}

// One on-disk tensor and where its values go: all of it, or (a fused
// expert tensor under expert parallelism) its rows [row0, row0 + dest rows).
struct LoadItem {
  std::string name;
  Tensor dest;
  int64_t row0 = -1;
  bool transposed = false;  // the file holds dest's last two dims swapped
  bool mxfp4 = false;       // the file holds name_blocks and name_scales (io/mxfp4.h)
  std::optional<StoredQuant> quant;  // the file holds it at low width (io/stored_quant.h)
};

Shape swap_last2(Shape s) {
  std::swap(s[s.size() - 1], s[s.size() - 2]);
  return s;
}

class LoadPlan {
 public:
  LoadPlan(const CheckpointTensors& ck, const ModelConfig& c) : ck_(ck), c_(c) {}

  bool has(const std::string& name) const { return ck_.contains(name); }

  // A matrix stored at low width (io/stored_quant.h) is dequantized into dest.
  void add(const std::string& name, const Tensor& dest) {
    if (auto q = find_stored_quant(ck_, c_, name)) {
      check_quant(*q, dest.shape());
      items_.push_back({name, dest, -1, false, false, std::move(q)});
      return;
    }
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

  // A tensor the file stores as dest's transpose (ModelParam::hf_transposed).
  void add_transposed(const std::string& name, const Tensor& dest) {
    check(name, swap_last2(dest.shape()));
    items_.push_back({name, dest, -1, true});
    used_.insert(name);
  }

  // An MXFP4 matrix (io/mxfp4.h), decoded into dest.
  void add_mxfp4(const std::string& name, const Tensor& dest) {
    check_mxfp4(name, dest.shape());
    items_.push_back({name, dest, -1, false, true});
  }
  void check_mxfp4(const std::string& name, const Shape& want) {
    TIERMOE_CHECK(c_.quant_method == "mxfp4",
                  str_of("checkpoint stores '", name,
                         "_blocks' (MXFP4), but config.json's "
                         "quantization_config ",
                         c_.quant_method.empty() ? "is absent" : "says " + c_.quant_method),
                  ck_.dir(),
                  "gpt-oss's releases say {\"quant_method\": \"mxfp4\"}; transformers refuses the "
                  "blocks without it too");
    const Shape got = mxfp4_shape(ck_, name);
    TIERMOE_CHECK(got == want,
                  str_of("MXFP4 tensor '", name, "_blocks' decodes to ", shape_str(got),
                         " but config.json implies ", shape_str(want)),
                  ck_.dir(), shape_hint(name));
    used_.insert(name + "_blocks");
    used_.insert(name + "_scales");
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
      if (!used_.count(n) && !is_ignored_checkpoint_tensor(c_, n)) extra.push_back(n);
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

  // Checks `name` against `want` and marks it used; a mapped load binds it
  // afterwards (bind below).
  void check_only(const std::string& name, const Shape& want) {
    if (auto q = find_stored_quant(ck_, c_, name)) return check_quant(*q, want);
    check(name, want);
    used_.insert(name);
  }

  void check_quant(const StoredQuant& q, const Shape& want) {
    TIERMOE_CHECK(q.shape == want,
                  str_of(quant_format_name(q.format), " matrix '", q.weight, "' is ",
                         shape_str(q.shape), " but config.json implies ", shape_str(want)),
                  ck_.dir(), shape_hint(q.weight));
    used_.insert(q.tensors.begin(), q.tensors.end());
  }

  // Progress counts the bytes read from the files (a fused tensor's whole
  // size for each slice of it a rank takes).
  void load(DType compute, ProgressSink progress) const {
    auto bytes = [&](const LoadItem& it) {
      if (it.quant) {
        double n = 0;
        for (const std::string& t : it.quant->tensors) n += double(ck_.entry(t).nbytes());
        return n;
      }
      if (!it.mxfp4) return double(ck_.entry(it.name).nbytes());
      return double(ck_.entry(it.name + "_blocks").nbytes() +
                    ck_.entry(it.name + "_scales").nbytes());
    };
    double total = 0;
    for (const LoadItem& it : items_) total += bytes(it);
    ProgressMeter meter(progress, "load " + ck_.dir(), total);
    for (const LoadItem& it : items_) {
      Tensor dest = it.dest;
      if (it.mxfp4 || it.quant) {
        dest.copy_from(it.quant ? load_stored_quant(ck_, *it.quant, compute)
                                : load_mxfp4(ck_, it.name, compute, MemTag::activations));
        meter.advance(bytes(it));
        continue;
      }
      Tensor src = ck_.load(it.name, compute, MemTag::activations);
      if (it.transposed) src = swap_last_two_dims(src, MemTag::activations);
      dest.copy_from(it.row0 < 0 ? src : src.rows(it.row0, it.row0 + dest.size(0)));
      meter.advance(bytes(it));
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

// Keeps a mapping alive for the tensors bound to it and counts their bytes
// under MemTag::mapped while any of them lives.
struct MappedBytes {
  MappedBytes(Tensor keep, size_t bytes) : keep_(std::move(keep)), bytes_(bytes) {
    MemoryTracker::process().on_alloc(MemTag::mapped, bytes_);
  }
  ~MappedBytes() { MemoryTracker::process().on_free(MemTag::mapped, bytes_); }
  MappedBytes(const MappedBytes&) = delete;
  MappedBytes& operator=(const MappedBytes&) = delete;

 private:
  Tensor keep_;
  size_t bytes_;
};

// The weight a bound model reads for on-disk tensors `names` stacked along
// dimension 0 into `shape` (rows [row0, row0 + shape[0]) of a single tensor
// when row0 >= 0): one view of the mapped shard when the parts lie back to
// back at a width no wider than `compute`, else a copy (see checkpoint.h).
// How on-disk parts stacked into one matrix are bound: at their stored width
// when they share one no wider than `compute`, and as one view of the mapped
// shard when they also lie back to back in it.
struct PartsBinding {
  bool keep_width = false, in_place = false;
};
PartsBinding parts_binding(const std::vector<Tensor>& parts, DType compute) {
  const DType stored = parts[0].dtype();
  bool same_width = true, contiguous = true;
  const char* next = static_cast<const char*>(parts[0].raw());
  for (const Tensor& p : parts) {
    same_width = same_width && p.dtype() == stored;
    contiguous = contiguous && static_cast<const char*>(p.raw()) == next;
    next = static_cast<const char*>(p.raw()) + p.nbytes();
  }
  const bool keep_width = same_width && is_narrower_or_same(stored, compute);
  return {keep_width, keep_width && contiguous};
}

// Where layer l's fused expert stacks (gate_up_proj, down_proj) are named.
std::string fused_experts_prefix(int64_t l) {
  return "model.layers." + std::to_string(l) + ".mlp.experts.";
}

std::vector<Tensor> views_of(const CheckpointTensors& ck, const std::vector<std::string>& names) {
  std::vector<Tensor> parts;
  for (const std::string& n : names) parts.push_back(ck.view(n));
  return parts;
}

// The on-disk parts of a dense MLP's (under `module`: "model.layers.0.mlp.",
// or a shared expert's "...mlp.shared_expert(s).") and of expert e's W13, gate then up.
std::vector<std::string> dense_w13_names(const std::string& module) {
  return {module + "gate_proj.weight", module + "up_proj.weight"};
}
std::vector<std::string> expert_w13_names(const ModelConfig& c, int64_t layer, int64_t e) {
  return {expert_weight_name(c, layer, e, 0), expert_weight_name(c, layer, e, 1)};
}

Tensor bound_matrix(const CheckpointTensors& ck, const std::vector<std::string>& names,
                    const Shape& shape, DType compute, int64_t row0 = -1) {
  std::vector<Tensor> parts = views_of(ck, names);
  if (row0 >= 0) {
    const int64_t rows = shape[0];
    parts[0] = parts[0].rows(row0, row0 + rows);
  }
  const DType stored = parts[0].dtype();
  const auto [keep_width, in_place] = parts_binding(parts, compute);
  if (in_place) {
    const size_t bytes = size_t(shape_numel(shape)) * dtype_size(stored);
    auto owner = std::make_shared<MappedBytes>(parts[0], bytes);
    return Tensor::from_external(const_cast<void*>(parts[0].raw()), shape, stored,
                                 std::move(owner));
  }
  Tensor out = Tensor::empty(shape, keep_width ? stored : compute, MemTag::weights);
  int64_t r = 0;
  for (const Tensor& p : parts) {
    const int64_t rows = p.numel() / (shape_numel(shape) / shape[0]);
    out.rows(r, r + rows).copy_from(p);
    r += rows;
  }
  return out;
}

// An x-major stacked matrix [E, in, out] as [E, out, in], kept at its
// stored width when that is no wider than `compute`; an MXFP4 one decoded
// to bf16 (f64 in f64 runs).
Tensor transposed_matrix(const CheckpointTensors& ck, const std::string& name, DType compute) {
  if (stores_mxfp4(ck, name)) {  // decoded rows are [E, out, in] already; exact in bf16
    return load_mxfp4(ck, name, compute == DType::f64 ? DType::f64 : DType::bf16);
  }
  const DType stored = ck.view(name).dtype();
  const DType dt = is_narrower_or_same(stored, compute) ? stored : compute;
  return swap_last_two_dims(ck.load(name, dt, MemTag::activations), MemTag::weights);
}

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

void CausalLM::bind_checkpoint_matrices(const CheckpointTensors& ck,
                                        const std::string& embed_source) {
  const DType c = dtype_;
  const int64_t V = config_.vocab_size, D = config_.hidden_size;
  // A matrix in the compute dtype: mapped in place where it can be, else
  // a copy; dequantized when stored at low width.
  auto matrix = [&](const std::vector<std::string>& names, const Shape& shape) {
    const std::vector<StoredQuant> parts = find_stored_parts(ck, config_, names);
    if (parts.empty()) return bound_matrix(ck, names, shape, c);
    stored_quant_.widened += int64_t(parts.size());
    return load_stored_parts(ck, parts, c).view(shape);
  };
  embed_.value = matrix({embed_source}, {V, D});
  for (auto& layer : layers_) {
    const std::string& p = layer->prefix();
    for (auto& [suffix, w] : layer->attention().weights()) {
      if (w->value.dim() == 2) {  // the projections (kv_a_proj_with_mqa too), not norms or biases
        w->value = matrix({layer->attention_name() + "." + suffix}, w->value.shape());
      }
    }
    auto bind_dense = [&](const std::string& module, DenseMlp& mlp) {
      mlp.w13().value = matrix(dense_w13_names(module), mlp.w13().value.shape());
      mlp.down().value = matrix({module + "down_proj.weight"}, mlp.down().value.shape());
    };
    if (DenseMlp* mlp = layer->dense_mlp()) {
      bind_dense(p + "mlp.", *mlp);
      continue;
    }
    if (SharedExpert* shared = layer->shared_expert()) {
      bind_dense(layer->shared_expert_name() + ".", shared->mlp());
    }
    GroupedExperts& ex = layer->moe()->experts();
    const int64_t El = local_experts(), F = config_.moe_intermediate_size;
    const int64_t l = layer->index();
    const std::string fused = fused_experts_prefix(l);
    if (config_.spec().expert_layout == ExpertLayout::fused_x_major) {
      // MXFP4 experts stay as stored, read in place by the f32 and bf16
      // kernels ([E, out, in] rows already); f64 runs decode them.
      if (stores_mxfp4(ck, fused + "gate_up_proj") && c != DType::f64) {
        ex.bind_quantized_weights(mxfp4_matrices(ck, fused + "gate_up_proj", first_expert(), El),
                                  mxfp4_matrices(ck, fused + "down_proj", first_expert(), El));
        trim_malloc_heap();  // the transient parts' holes, layer by layer
        continue;
      }
      // x-major on disk: transposed copies, at the stored width.
      ex.bind_weights(transposed_matrix(ck, fused + "gate_up_proj", c),
                      transposed_matrix(ck, fused + "down_proj", c));
      continue;
    }
    if (ck.contains(fused + "gate_up_proj")) {
      ex.bind_weights(bound_matrix(ck, {fused + "gate_up_proj"}, {El, 2 * F, D}, c, first_expert()),
                      bound_matrix(ck, {fused + "down_proj"}, {El, D, F}, c, first_expert()));
      continue;
    }
    auto w2_name = [&](int64_t e) { return expert_weight_name(config_, l, first_expert() + e, 2); };
    if (c != DType::f64 && find_stored_quant(ck, config_, w2_name(0))) {
      // Kept at their stored width for the f32 and bf16 kernels (gate over
      // up stacked into one matrix); f64 runs dequantize them.
      std::vector<QuantMatrix> w13, w2;
      for (int64_t e = 0; e < El; ++e) {
        const auto gate_up =
            find_stored_parts(ck, config_, expert_w13_names(config_, l, first_expert() + e));
        const auto down = find_stored_parts(ck, config_, {w2_name(e)});
        TIERMOE_CHECK(!gate_up.empty() && !down.empty(),
                      str_of("expert ", first_expert() + e, " of ", moe_block_prefix(config_, l),
                             " is stored at low width in part"),
                      ck.dir(), "a checkpoint quantizes all of an expert's projections or none");
        w13.push_back(read_stored_parts(ck, gate_up));
        w2.push_back(read_stored_parts(ck, down));
      }
      stored_quant_.kept += 3 * El;
      ex.bind_quantized_weights(std::move(w13), std::move(w2));
      trim_malloc_heap();  // the gate and up parts' holes, layer by layer
      continue;
    }
    for (int64_t e = 0; e < El; ++e) {
      ex.bind_expert_weights(e,
                             matrix(expert_w13_names(config_, l, first_expert() + e), {2 * F, D}),
                             matrix({w2_name(e)}, {D, F}));
    }
  }
  if (lm_head_.value.defined()) lm_head_.value = matrix({"lm_head.weight"}, {V, D});
  bound_ = true;
}

int64_t copied_w13_elements(const CheckpointTensors& ck, const ModelConfig& c, DType compute,
                            int64_t first_expert, int64_t experts) {
  int64_t n = 0;
  auto count = [&](const std::vector<std::string>& names) {
    if (find_stored_quant(ck, c, names[0])) return;  // dequantized or kept quantized
    const std::vector<Tensor> parts = views_of(ck, names);
    const PartsBinding b = parts_binding(parts, compute);
    if (b.keep_width && !b.in_place) {
      for (const Tensor& t : parts) n += t.numel();
    }
  };
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    if (!c.is_moe_layer(l)) {
      count(dense_w13_names(p + "mlp."));
      continue;
    }
    if (c.has_shared_expert()) {
      count(dense_w13_names(moe_block_prefix(c, l) + std::string(c.spec().shared_expert) + "."));
    }
    if (c.spec().expert_layout == ExpertLayout::fused_x_major) {
      // Both matrices are transposed copies at the stored width, unless they
      // ship as MXFP4 (then kept at it, or decoded in f64 runs: no copy).
      for (const char* m : {"gate_up_proj", "down_proj"}) {
        const std::string name = fused_experts_prefix(l) + m;
        if (!stores_mxfp4(ck, name)) n += shape_numel(ck.entry(name).shape);
      }
      continue;
    }
    if (ck.contains(fused_experts_prefix(l) + "gate_up_proj")) continue;  // one tensor: in place
    for (int64_t e = first_expert; e < first_expert + experts; ++e) {
      count(expert_w13_names(c, l, e));
    }
  }
  return n;
}

bool stores_fused_experts(const CheckpointTensors& ck, const ModelConfig& c) {
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.num_experts > 0 && c.is_moe_layer(l)) {
      return ck.contains(fused_experts_prefix(l) + "gate_up_proj");
    }
  }
  return false;
}

CausalLM CausalLM::from_checkpoint(const std::string& dir, DType compute, Comm* comm,
                                   WeightBinding binding, ProgressSink progress) {
  ModelConfig config = load_model_config(dir);
  check_model_supported(config, (std::filesystem::path(dir) / "config.json").string());
  CheckpointTensors ck = CheckpointTensors::open(dir);
  const std::string embed_source = resolve_tied_head(config, ck, compute);
  const bool mapped = binding == WeightBinding::mapped;
  CausalLM model(config, compute, comm, mapped ? MatrixAlloc::unbound : MatrixAlloc::zeroed);
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
    if (p.hf_transposed && stores_mxfp4(ck, p.name)) {
      if (mapped)
        plan.check_mxfp4(p.name, p.value.shape());
      else
        plan.add_mxfp4(p.name, p.value);
      continue;
    }
    if (p.hf_transposed) {
      if (mapped)
        plan.check_only(p.name, swap_last2(p.value.shape()));
      else
        plan.add_transposed(p.name, p.value);
      continue;
    }
    if (mapped && is_matrix_role(p.role)) {
      // Checked here, bound below (bind_checkpoint_matrices) from the same names.
      const int64_t l = p.role == HfRole::expert ? std::stoll(p.name.substr(13)) : -1;
      const std::string fused = fused_experts_prefix(l);
      if (l >= 0 && (plan.has(fused + "gate_up_proj") || plan.has(fused + "down_proj"))) {
        if (fused_layers.insert(l).second) {
          const int64_t E = config.num_experts, F = config.moe_intermediate_size,
                        D = config.hidden_size;
          plan.check_only(fused + "gate_up_proj", {E, 2 * F, D});
          plan.check_only(fused + "down_proj", {E, D, F});
        }
        continue;
      }
      plan.check_only(p.role == HfRole::embedding ? embed_source : p.name, p.value.shape());
      continue;
    }
    if (p.role == HfRole::router) {
      const std::string v5 = v5_router_name(config, p.name);
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
    const std::string fused = fused_experts_prefix(l);
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
  if (mapped) {
    // Stored-width weights are frozen (nothing may train them; check_trainable).
    model.set_requires_grad_all(false);
    model.bind_checkpoint_matrices(ck, embed_source);
  }
  return model;
}

NamedTensors CausalLM::checkpoint_tensors(DType storage, bool experts_only) const {
  // slots() only builds views here (no grads), so it does not change the model.
  auto& self = const_cast<CausalLM&>(*this);
  NamedTensors tensors;
  for (Slot& s : self.slots(/*with_grads=*/false)) {
    if (experts_only && s.param.expert < 0) continue;
    Tensor t = s.param.value;
    if (t.dtype() != storage) t = t.to(storage, MemTag::activations);
    tensors.emplace_back(s.param.name,
                         s.param.hf_transposed ? swap_last_two_dims(t, MemTag::activations) : t);
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
