#include "tiermoe/model/lora.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <utility>

#include "tiermoe/core/error.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/kernels/matmul.h"

namespace tiermoe {

namespace {

using detail::str_of;

constexpr int64_t kRowGrain = 16;

std::string valid_targets_text() {
  std::string s;
  for (std::string_view n : kLoraTargetNames) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A target is a projection name, or a module path's tail ending in one
// ("shared_expert.gate_proj", "self_attn.q_proj"): PEFT matches either as a
// suffix of the module path. Only a bare name adapts the routed experts.
void check_target_name(std::string_view name, std::string_view where) {
  const size_t dot = name.rfind('.');
  const std::string_view leaf = dot == std::string_view::npos ? name : name.substr(dot + 1);
  TIERMOE_CHECK(leaf != "gate" && leaf != "router" && leaf != "shared_expert_gate",
                "'" + std::string(name) +
                    "' names a router (mlp.gate, shared_expert_gate), which is never "
                    "adapted",
                std::string(where),
                "LoRA adapts the experts through gate_proj, up_proj and down_proj");
  bool path_ok = true;  // the parts before the leaf: non-empty names
  for (size_t i = 0, start = 0; dot != std::string_view::npos && i <= dot; ++i) {
    const char ch = name[i];
    if (ch == '.') {
      path_ok &= i > start;
      start = i + 1;
    } else {
      path_ok &= std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
    }
  }
  for (std::string_view n : kLoraTargetNames) {
    if (leaf == n && path_ok) return;
  }
  throw Error("unknown LoRA target '" + std::string(name) + "'", std::string(where),
              "valid targets: " + valid_targets_text() +
                  ", or a module path ending in one (shared_expert.gate_proj)");
}

// The column of output element (i, o) in a row of a wider tensor.
int64_t column(const LoraColumns& cols, int64_t o) { return cols.begin + o * cols.stride; }

void check_columns(const LoraColumns& cols, int64_t out, int64_t width, std::string_view what) {
  TIERMOE_CHECK(cols.begin >= 0 && cols.stride >= 1 && column(cols, out - 1) < width,
                str_of(what, ": columns {begin ", cols.begin, ", stride ", cols.stride, "} of ",
                       out, " outputs do not fit a row of ", width),
                "lora", "the adapted columns must lie inside the output row");
}

// Checks the shapes and dtypes of one LoRA application; returns M.
int64_t check_operands(const Tensor& y_MY, const Tensor& x_MI, const Tensor& A_RI,
                       const Tensor& B_OR, const LoraColumns& cols, std::string_view y_name) {
  TIERMOE_CHECK(A_RI.dim() == 2 && B_OR.dim() == 2 && A_RI.size(0) == B_OR.size(1),
                str_of("A ", A_RI.str(), " and B ", B_OR.str(), " are not [R, in] and [out, R]"),
                "lora", "lora_A is [r, in] and lora_B is [out, r]");
  DType md = lora_master_dtype(x_MI.dtype());
  check_dtype(A_RI, md, "lora A_RI");
  check_dtype(B_OR, md, "lora B_OR");
  TIERMOE_CHECK(x_MI.dim() == 2, "lora x_MI must be 2-D, got " + x_MI.str(), "lora",
                "pass the rows of the adapted linear's input");
  int64_t M = x_MI.size(0);
  check_shape(x_MI, {M, A_RI.size(1)}, "lora x_MI");
  TIERMOE_CHECK(y_MY.dim() == 2 && y_MY.size(0) == M,
                str_of("lora ", y_name, " is ", y_MY.str(), " for ", M, " input rows"), "lora",
                "the output needs one row per input row");
  check_same_dtype(y_MY, x_MI, y_name, "lora x_MI");
  check_columns(cols, B_OR.size(0), y_MY.size(1), y_name);
  return M;
}

Tensor as_master(const Tensor& t) {
  DType md = lora_master_dtype(t.dtype());
  return t.dtype() == md ? t : t.to(md);
}

}  // namespace

double LoraConfig::scaling() const {
  return rslora ? alpha / std::sqrt(double(rank)) : alpha / double(rank);
}

void LoraConfig::validate(std::string_view where) const {
  std::string w(where);
  TIERMOE_CHECK(rank > 0, str_of("LoRA rank must be positive, got ", rank), w,
                "pass --lora-rank R with R >= 1");
  TIERMOE_CHECK(std::isfinite(alpha) && alpha > 0,
                str_of("LoRA alpha must be positive, got ", alpha), w,
                "pass --lora-alpha A with A > 0 (PEFT's default is 8)");
  TIERMOE_CHECK(dropout == 0.0, str_of("LoRA dropout ", dropout, " is not supported"), w,
                "TierMoE trains LoRA with lora_dropout 0");
  TIERMOE_CHECK(!targets.empty(), "no LoRA targets", w,
                "name modules with --lora-targets, e.g. q_proj,v_proj");
  for (const std::string& t : targets) check_target_name(t, where);
}

std::set<std::string> lora_default_targets(const ModelConfig& config) {
  if (config.spec().attention == AttentionKind::hybrid_linear) {
    std::set<std::string> out = LoraConfig{}.targets;
    out.insert({"in_proj_qkv", "in_proj_z", "out_proj"});
    return out;
  }
  if (!config.mla()) return LoraConfig{}.targets;
  std::set<std::string> out = {"kv_a_proj_with_mqa", "kv_b_proj", "o_proj"};
  if (config.q_lora_rank > 0) {
    out.insert({"q_a_proj", "q_b_proj"});
  } else {
    out.insert("q_proj");
  }
  return out;
}

std::set<std::string> parse_lora_targets(std::string_view list, std::string_view where) {
  std::set<std::string> out;
  while (true) {
    size_t comma = list.find(',');
    std::string_view name = trim(list.substr(0, comma));
    TIERMOE_CHECK(!name.empty(), "empty name in the LoRA target list", std::string(where),
                  "pass comma-separated names, e.g. q_proj,v_proj; valid: " + valid_targets_text());
    check_target_name(name, where);
    out.emplace(name);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return out;
}

bool lora_targets_module(const LoraConfig& config, std::string_view path) {
  if (!config.layers.empty()) {
    // "model.layers.N." as PEFT's layers_pattern "layers" finds it.
    const size_t at = path.find("layers.");
    if (at == std::string_view::npos) return false;
    int64_t layer = -1;
    const char* first = path.data() + at + 7;
    const auto [end, ec] = std::from_chars(first, path.data() + path.size(), layer);
    if (ec != std::errc() || end == first || !config.layers.contains(layer)) return false;
  }
  for (const std::string& t : config.targets) {
    if (path == t) return true;
    if (path.size() > t.size() && path.substr(path.size() - t.size()) == t &&
        path[path.size() - t.size() - 1] == '.') {
      return true;
    }
  }
  return false;
}

PeftLoraConfig to_peft_config(const LoraConfig& config, std::string base_model_name) {
  PeftLoraConfig p;
  p.r = config.rank;
  p.lora_alpha = config.alpha;
  p.lora_dropout = config.dropout;
  p.use_rslora = config.rslora;
  p.target_modules.assign(config.targets.begin(), config.targets.end());
  p.layers_to_transform.assign(config.layers.begin(), config.layers.end());
  p.base_model_name_or_path = std::move(base_model_name);
  return p;
}

LoraConfig from_peft_config(const PeftLoraConfig& peft, std::string_view where) {
  LoraConfig c;
  c.rank = peft.r;
  c.alpha = peft.lora_alpha;
  c.rslora = peft.use_rslora;
  c.dropout = peft.lora_dropout;
  c.targets = std::set<std::string>(peft.target_modules.begin(), peft.target_modules.end());
  c.layers = std::set<int64_t>(peft.layers_to_transform.begin(), peft.layers_to_transform.end());
  c.validate(where);
  return c;
}

DType lora_master_dtype(DType compute) { return compute == DType::f64 ? DType::f64 : DType::f32; }

void lora_init(Tensor& A_RI, Tensor& B_OR, Rng& rng) {
  TIERMOE_ASSERT(A_RI.dim() == 2 && A_RI.size(1) > 0, A_RI.str());
  // kaiming_uniform_(a = sqrt(5)) on [r, in]: gain sqrt(2 / 6), bound
  // gain * sqrt(3 / fan_in) = 1 / sqrt(in).
  double bound = 1.0 / std::sqrt(double(A_RI.size(1)));
  fill_uniform(A_RI, rng, -bound, bound);
  B_OR.zero();
}

void lora_forward(Tensor& y_MY, Tensor& u_MR, const Tensor& x_MI, const Tensor& A_RI,
                  const Tensor& B_OR, double scaling, LoraColumns cols) {
  int64_t M = check_operands(y_MY, x_MI, A_RI, B_OR, cols, "y_MY");
  int64_t R = A_RI.size(0), O = B_OR.size(0), Y = y_MY.size(1);
  check_shape(u_MR, {M, R}, "lora u_MR");
  check_dtype(u_MR, A_RI.dtype(), "lora u_MR");
  if (M == 0) return;
  cpu::matmul_forward(u_MR, as_master(x_MI), A_RI);
  Tensor v_MO = Tensor::empty({M, O}, A_RI.dtype());
  cpu::matmul_forward(v_MO, u_MR, B_OR);
  visit_dtype(y_MY.dtype(), [&]<class T>() {
    using Acc = acc_t<T>;
    const Acc s = Acc(scaling);
    const Acc* v = v_MO.data<Acc>();
    T* y = y_MY.data<T>();
    parallel_for(M, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        for (int64_t o = 0; o < O; ++o) {
          T& out = y[i * Y + column(cols, o)];
          Acc branch = v[i * O + o] * s;
          out = store<T>(load<T>(out) + branch);
        }
      }
    });
  });
}

void lora_backward(Tensor& dx_MI, Tensor& dA_RI, Tensor& dB_OR, const Tensor& dy_MY,
                   const Tensor& x_MI, const Tensor& u_MR, const Tensor& A_RI, const Tensor& B_OR,
                   double scaling, LoraColumns cols) {
  int64_t M = check_operands(dy_MY, x_MI, A_RI, B_OR, cols, "dy_MY");
  int64_t R = A_RI.size(0), O = B_OR.size(0), Y = dy_MY.size(1);
  check_shape(u_MR, {M, R}, "lora u_MR");
  check_dtype(u_MR, A_RI.dtype(), "lora u_MR");
  check_shape(dA_RI, A_RI.shape(), "lora dA_RI");
  check_dtype(dA_RI, A_RI.dtype(), "lora dA_RI");
  check_shape(dB_OR, B_OR.shape(), "lora dB_OR");
  check_dtype(dB_OR, B_OR.dtype(), "lora dB_OR");
  if (dx_MI.defined()) {
    check_shape(dx_MI, x_MI.shape(), "lora dx_MI");
    check_same_dtype(dx_MI, x_MI, "lora dx_MI", "lora x_MI");
  }
  if (M == 0) return;

  const DType md = A_RI.dtype();
  Tensor g_MO = Tensor::empty({M, O}, md);  // d(branch before scaling) = dy * scaling
  visit_dtype(dy_MY.dtype(), [&]<class T>() {
    using Acc = acc_t<T>;
    const Acc s = Acc(scaling);
    const T* dy = dy_MY.data<T>();
    Acc* g = g_MO.data<Acc>();
    parallel_for(M, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        for (int64_t o = 0; o < O; ++o) g[i * O + o] = load<T>(dy[i * Y + column(cols, o)]) * s;
      }
    });
  });
  cpu::matmul_backward_dw(dB_OR, g_MO, u_MR, /*accumulate=*/true);
  Tensor du_MR = Tensor::empty({M, R}, md);
  cpu::matmul_backward_dx(du_MR, g_MO, B_OR);
  cpu::matmul_backward_dw(dA_RI, du_MR, as_master(x_MI), /*accumulate=*/true);
  if (!dx_MI.defined()) return;
  if (dx_MI.dtype() == md) {
    cpu::matmul_backward_dx(dx_MI, du_MR, A_RI, /*accumulate=*/true);
    return;
  }
  // bf16: autograd casts the fp32 branch gradient to bf16, then sums.
  Tensor dxl_MI = Tensor::empty(x_MI.shape(), md);
  cpu::matmul_backward_dx(dxl_MI, du_MR, A_RI);
  const float* src = dxl_MI.data<float>();
  bf16* dst = dx_MI.data<bf16>();
  parallel_for(dx_MI.numel(), 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      dst[i] = float_to_bf16(bf16_to_float(dst[i]) + round_to<bf16>(src[i]));
    }
  });
}

void lora_merge(Tensor& w_OI, const Tensor& A_RI, const Tensor& B_OR, double scaling) {
  DType md = lora_master_dtype(w_OI.dtype());
  check_dtype(A_RI, md, "lora A_RI");
  check_dtype(B_OR, md, "lora B_OR");
  TIERMOE_CHECK(A_RI.dim() == 2 && B_OR.dim() == 2 && A_RI.size(0) == B_OR.size(1),
                str_of("A ", A_RI.str(), " and B ", B_OR.str(), " are not [R, in] and [out, R]"),
                "lora merge", "lora_A is [r, in] and lora_B is [out, r]");
  check_shape(w_OI, {B_OR.size(0), A_RI.size(1)}, "lora merge w_OI");
  Tensor delta_OI = Tensor::empty(w_OI.shape(), md);
  cpu::matmul_backward_dx(delta_OI, B_OR, A_RI);  // B . A
  visit_dtype(w_OI.dtype(), [&]<class T>() {
    using Acc = acc_t<T>;
    const Acc s = Acc(scaling);
    const Acc* d = delta_OI.data<Acc>();
    T* w = w_OI.data<T>();
    parallel_for(w_OI.numel(), 4096, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) w[i] = store<T>(load<T>(w[i]) + d[i] * s);
    });
  });
}

// ---- LoraAdapter ----

LoraAdapter::LoraAdapter(int64_t in, int64_t out, const LoraConfig& config, DType compute,
                         std::string name)
    : name_(std::move(name)), scaling_(config.scaling()), compute_(compute) {
  config.validate(name_);
  TIERMOE_CHECK(in > 0 && out > 0, str_of("LoRA on a [", out, ", ", in, "] linear"), name_,
                "in and out features must be positive");
  DType md = lora_master_dtype(compute);
  A_RI = Tensor::zeros({config.rank, in}, md, MemTag::weights);
  B_OR = Tensor::zeros({out, config.rank}, md, MemTag::weights);
  dA_RI = Tensor::zeros(A_RI.shape(), md, MemTag::grads);
  dB_OR = Tensor::zeros(B_OR.shape(), md, MemTag::grads);
}

void LoraAdapter::init(Rng& rng) { lora_init(A_RI, B_OR, rng); }

void LoraAdapter::forward(Tensor& y_MY, Tensor& u_MR, const Tensor& x_MI, LoraColumns cols) const {
  lora_forward(y_MY, u_MR, x_MI, A_RI, B_OR, scaling_, cols);
}

void LoraAdapter::backward(Tensor& dx_MI, const Tensor& dy_MY, const Tensor& x_MI,
                           const Tensor& u_MR, LoraColumns cols) {
  lora_backward(dx_MI, dA_RI, dB_OR, dy_MY, x_MI, u_MR, A_RI, B_OR, scaling_, cols);
}

void LoraAdapter::merge(Tensor& w_OI) const { lora_merge(w_OI, A_RI, B_OR, scaling_); }

void LoraAdapter::zero_grad() {
  dA_RI.zero();
  dB_OR.zero();
}

void LoraAdapter::load_peft(const PeftLoraWeights& w) {
  TIERMOE_CHECK(w.A_RI.defined() && w.B_OR.defined(), "the adapter lacks lora_A or lora_B", name_,
                "the imported adapter must hold both for this module");
  check_shape(w.A_RI, A_RI.shape(), name_ + ".lora_A.weight");
  check_shape(w.B_OR, B_OR.shape(), name_ + ".lora_B.weight");
  A_RI.copy_from(w.A_RI);
  B_OR.copy_from(w.B_OR);
}

// ---- ExpertLora ----

std::string_view expert_proj_name(ExpertProj p) {
  switch (p) {
    case ExpertProj::gate:
      return "gate_proj";
    case ExpertProj::up:
      return "up_proj";
    case ExpertProj::down:
      return "down_proj";
  }
  __builtin_unreachable();
}

ExpertLora::ExpertLora(int64_t num_experts, int64_t hidden, int64_t ffn, const LoraConfig& config,
                       DType compute, std::string prefix, int64_t first_expert,
                       int64_t total_experts)
    : num_experts_(num_experts),
      first_expert_(first_expert),
      total_experts_(total_experts > 0 ? total_experts : num_experts),
      rank_(config.rank),
      scaling_(config.scaling()),
      prefix_(std::move(prefix)) {
  config.validate(prefix_);
  TIERMOE_CHECK(num_experts > 0 && hidden > 0 && ffn > 0,
                str_of("expert LoRA for E=", num_experts, " D=", hidden, " F=", ffn), prefix_,
                "experts, hidden and ffn sizes must be positive");
  TIERMOE_CHECK(first_expert_ >= 0 && first_expert_ + num_experts_ <= total_experts_,
                str_of("experts [", first_expert_, ", ", first_expert_ + num_experts_, ") of ",
                       total_experts_),
                prefix_, "the held experts must be a range of the layer's");
  DType md = lora_master_dtype(compute);
  for (ExpertProj p : {ExpertProj::gate, ExpertProj::up, ExpertProj::down}) {
    if (!config.targets.contains(std::string(expert_proj_name(p)))) continue;
    int64_t in = p == ExpertProj::down ? ffn : hidden;
    int64_t out = p == ExpertProj::down ? hidden : ffn;
    Proj w{p, Tensor::zeros({num_experts, rank_, in}, md, MemTag::weights),
           Tensor::zeros({num_experts, out, rank_}, md, MemTag::weights),
           Tensor::zeros({num_experts, rank_, in}, md, MemTag::grads),
           Tensor::zeros({num_experts, out, rank_}, md, MemTag::grads)};
    projs_.push_back(p);
    weights_.push_back(std::move(w));
  }
}

bool ExpertLora::has(ExpertProj p) const {
  for (ExpertProj q : projs_) {
    if (q == p) return true;
  }
  return false;
}

const ExpertLora::Proj& ExpertLora::proj(ExpertProj p) const {
  for (const Proj& w : weights_) {
    if (w.which == p) return w;
  }
  throw Error(std::string(expert_proj_name(p)) + " is not a LoRA target", prefix_,
              "add it to --lora-targets to adapt the experts' " + std::string(expert_proj_name(p)));
}

ExpertLora::Proj& ExpertLora::proj(ExpertProj p) {
  return const_cast<Proj&>(std::as_const(*this).proj(p));
}

Tensor& ExpertLora::A(ExpertProj p) { return proj(p).A_ERI; }
Tensor& ExpertLora::B(ExpertProj p) { return proj(p).B_EOR; }
Tensor& ExpertLora::dA(ExpertProj p) { return proj(p).dA_ERI; }
Tensor& ExpertLora::dB(ExpertProj p) { return proj(p).dB_EOR; }
const Tensor& ExpertLora::A(ExpertProj p) const { return proj(p).A_ERI; }
const Tensor& ExpertLora::B(ExpertProj p) const { return proj(p).B_EOR; }

std::string ExpertLora::module_path(ExpertProj p, int64_t e) const {
  return str_of(prefix_, ".", first_expert_ + e, ".", expert_proj_name(p));
}

void ExpertLora::init(Rng& rng) {
  for (int64_t g = 0; g < total_experts_; ++g) {
    const int64_t e = g - first_expert_;
    const bool held = e >= 0 && e < num_experts_;
    for (Proj& w : weights_) {
      // Another rank's expert: draw its values anyway, so ours come out the same.
      Tensor A = held ? w.A_ERI.select(e) : w.A_ERI.select(0).clone();
      Tensor B = held ? w.B_EOR.select(e) : w.B_EOR.select(0).clone();
      lora_init(A, B, rng);
    }
  }
}

void ExpertLora::forward_rows(ExpertProj p, int64_t e, Tensor& y_MY, Tensor& u_MR,
                              const Tensor& x_MI, LoraColumns cols) const {
  TIERMOE_ASSERT(e >= 0 && e < num_experts_, e);
  const Proj& w = proj(p);
  lora_forward(y_MY, u_MR, x_MI, w.A_ERI.select(e), w.B_EOR.select(e), scaling_, cols);
}

void ExpertLora::backward_rows(ExpertProj p, int64_t e, Tensor& dx_MI, const Tensor& dy_MY,
                               const Tensor& x_MI, const Tensor& u_MR, LoraColumns cols) {
  TIERMOE_ASSERT(e >= 0 && e < num_experts_, e);
  Proj& w = proj(p);
  Tensor dA = w.dA_ERI.select(e), dB = w.dB_EOR.select(e);
  lora_backward(dx_MI, dA, dB, dy_MY, x_MI, u_MR, w.A_ERI.select(e), w.B_EOR.select(e), scaling_,
                cols);
}

void ExpertLora::merge(ExpertProj p, int64_t e, Tensor& w_OI) const {
  TIERMOE_ASSERT(e >= 0 && e < num_experts_, e);
  const Proj& w = proj(p);
  lora_merge(w_OI, w.A_ERI.select(e), w.B_EOR.select(e), scaling_);
}

void ExpertLora::zero_grad() {
  for (Proj& w : weights_) {
    w.dA_ERI.zero();
    w.dB_EOR.zero();
  }
}

void ExpertLora::to_peft(PeftLoraModules& out) const {
  for (const Proj& w : weights_) {
    for (int64_t e = 0; e < num_experts_; ++e) {
      out[module_path(w.which, e)] = {w.A_ERI.select(e), w.B_EOR.select(e)};
    }
  }
}

void ExpertLora::load_peft(const PeftLoraModules& modules) {
  for (Proj& w : weights_) {
    for (int64_t e = 0; e < num_experts_; ++e) {
      std::string path = module_path(w.which, e);
      auto it = modules.find(path);
      TIERMOE_CHECK(it != modules.end(), "the adapter has no weights for " + path, prefix_,
                    "an adapter targeting " + std::string(expert_proj_name(w.which)) +
                        " must hold every expert's lora_A and lora_B");
      Tensor A = w.A_ERI.select(e), B = w.B_EOR.select(e);
      check_shape(it->second.A_RI, A.shape(), path + ".lora_A.weight");
      check_shape(it->second.B_OR, B.shape(), path + ".lora_B.weight");
      A.copy_from(it->second.A_RI);
      B.copy_from(it->second.B_OR);
    }
  }
}

}  // namespace tiermoe
