// HostExperts on the grouped kernels (moe/expert_kernels.h) against the
// per-expert path (GroupedExperts::forward_rows / backward_rows, which the
// device tier's graphs run): the same bits for every output, saved
// activation and gradient, on every ISA this machine can run; and the packed
// weights follow the weights.
#include <gtest/gtest.h>

#include <utility>
#include <string>
#include <vector>

#include "kernels/isa_test_util.h"
#include "moe/moe_test_util.h"
#include "tiermoe/moe/executor.h"
#include "tiermoe/moe/expert_kernels.h"

namespace tiermoe {
namespace {

using testing::bitwise_equal;
using testing::random_tensor;
using testing::ScopedIsa;
using testing::Variant;

struct Case {
  CpuIsa isa;
  DType dtype;
  Variant variant;
  bool absorbed;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string isa(cpu_isa_name(info.param.isa));
  for (char& c : isa) c = c == '-' ? '_' : c;
  return isa + "_" + std::string(dtype_name(info.param.dtype)) + "_" +
         testing::variant_name(info.param.variant) + (info.param.absorbed ? "_absorbed" : "");
}

std::vector<Case> all_cases() {
  std::vector<Case> v;
  for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512bf16, CpuIsa::amx,
                     CpuIsa::avx512_emu, CpuIsa::avx512bf16_emu, CpuIsa::amx_emu}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      for (Variant var : {Variant::swiglu, Variant::gpt_oss_bias}) {
        for (bool absorbed : {false, true}) v.push_back({isa, dt, var, absorbed});
      }
    }
  }
  return v;
}

// Rows per expert: none, one, around the 16- and 32-row tiles, many.
const std::vector<int64_t> kRows = {0, 1, 15, 17, 33, 130};
constexpr int64_t kD = 70, kF = 150;

struct Outputs {
  Tensor y, h, a, dx, dscore;
  std::vector<Tensor> grads;
};

using ExpertKernels = testing::IsaTest<Case>;

INSTANTIATE_TEST_SUITE_P(Isa, ExpertKernels, ::testing::ValuesIn(all_cases()), case_name);

std::vector<int64_t> offsets() {
  std::vector<int64_t> o{0};
  for (int64_t r : kRows) o.push_back(o.back() + r);
  return o;
}

// Forward and backward (dx, dscore, weight grads) through HostExperts.
Outputs host_run(GroupedExperts& ex, const Tensor& x, const Tensor& dy, const Tensor& score,
             bool weight_grads, bool adapter_grads = false) {
  const std::vector<int64_t> off = offsets();
  const int64_t N = x.size(0);
  HostExperts host(ex);
  Outputs r;
  r.y = Tensor::empty({N, kD}, ex.dtype());
  SavedTensors saved("experts");
  host.forward(r.y, x, off, score, saved, ExpertSaves{});
  r.h = saved.get("h_N2F").clone();
  r.a = saved.get("a_NF").clone();
  ex.zero_grad();
  r.dx = Tensor::empty({N, kD}, ex.dtype());
  r.dscore = Tensor::zeros({N}, DType::f32);
  host.backward(r.dx, r.dscore, dy, off, score, saved, weight_grads, adapter_grads);
  if (weight_grads) {
    for (const auto& n : ex.param_names()) r.grads.push_back(ex.grad(n).clone());
  }
  return r;
}

// The same through the per-expert functions, one expert at a time.
Outputs per_expert_run(GroupedExperts& ex, const Tensor& x, const Tensor& dy, const Tensor& score,
                   bool weight_grads) {
  const std::vector<int64_t> off = offsets();
  const int64_t N = x.size(0);
  Outputs r;
  r.y = Tensor::empty({N, kD}, ex.dtype());
  r.h = Tensor::empty({N, 2 * kF}, ex.dtype());
  r.a = Tensor::empty({N, kF}, ex.dtype());
  r.dx = Tensor::empty({N, kD}, ex.dtype());
  r.dscore = Tensor::zeros({N}, DType::f32);
  ex.zero_grad();
  if (weight_grads) ex.allocate_grads();
  for (size_t e = 0; e + 1 < off.size(); ++e) {
    const int64_t b = off[e], end = off[e + 1];
    if (b == end) continue;
    ExpertRowsActs acts;
    acts.x_MD = x.rows(b, end);
    acts.h_M2F = r.h.rows(b, end);
    acts.a_MF = r.a.rows(b, end);
    Tensor y = r.y.rows(b, end), dx = r.dx.rows(b, end);
    Tensor s = score.defined() ? score.rows(b, end) : Tensor();
    Tensor ds = score.defined() ? r.dscore.rows(b, end) : Tensor();
    ex.forward_rows(int64_t(e), y, acts, x.rows(b, end), s);
    ex.backward_rows(int64_t(e), dx, ds, dy.rows(b, end), acts, s, weight_grads);
  }
  if (weight_grads) {
    for (const auto& n : ex.param_names()) r.grads.push_back(ex.grad(n).clone());
  }
  return r;
}

// Router scores in [0.05, 1), f32, for absorbed runs.
Tensor random_scores(int64_t N, Rng& rng) {
  Tensor score = Tensor::empty({N}, DType::f32);
  for (int64_t n = 0; n < N; ++n) score.set(n, rng.uniform(0.05, 1.0));
  return score;
}

void expect_same(const Outputs& got, const Outputs& want, const std::vector<std::string>& names,
                 const std::string& what) {
  EXPECT_TRUE(bitwise_equal(got.y, want.y, what + " y"));
  EXPECT_TRUE(bitwise_equal(got.h, want.h, what + " h"));
  EXPECT_TRUE(bitwise_equal(got.a, want.a, what + " a"));
  EXPECT_TRUE(bitwise_equal(got.dx, want.dx, what + " dx"));
  EXPECT_TRUE(bitwise_equal(got.dscore, want.dscore, what + " dscore"));
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < got.grads.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(got.grads[i], want.grads[i], what + " d" + names[i]));
  }
}

TEST_P(ExpertKernels, EqualPerExpertPathBitwise) {
  const auto [isa, dt, variant, absorbed] = GetParam();
  Rng rng(81);
  GroupedExperts ex(testing::experts_config(variant, int64_t(kRows.size()), kD, kF), dt);
  testing::fill_experts(ex, rng, 0.3);
  ASSERT_TRUE(ExpertPacks::applies(ex));
  const int64_t N = offsets().back();
  const Tensor x = random_tensor({N, kD}, dt, rng), dy = random_tensor({N, kD}, dt, rng);
  const Tensor score = absorbed ? random_scores(N, rng) : Tensor();
  for (bool weight_grads : {true, false}) {
    const Outputs got = host_run(ex, x, dy, score, weight_grads);
    EXPECT_EQ(ex.packs().stats().packs, 4) << "the grouped kernels did not run, or re-packed";
    const Outputs want = per_expert_run(ex, x, dy, score, weight_grads);
    expect_same(got, want, ex.param_names(), weight_grads ? "full" : "dx only");
  }
}

// A checkpoint's per-expert tensors, mapped one expert at a time, and bf16
// weights in an f32 run (widened while packing) run on the grouped kernels
// too, with the per-expert path's bits (which reads the same bound weights
// through its mixed-width products). Dx only: such weights are frozen.
TEST_P(ExpertKernels, BoundPerExpertAndNarrowerWeightsEqualPerExpertPath) {
  const auto [isa, dt, variant, absorbed] = GetParam();
  Rng rng(85);
  const ExpertsConfig cfg = testing::experts_config(variant, int64_t(kRows.size()), kD, kF);
  GroupedExperts stacked(cfg, dt);
  testing::fill_experts(stacked, rng, 0.3);
  // f32 runs read bf16 weights; bf16 runs their own width.
  const DType stored = DType::bf16;
  GroupedExperts ex(cfg, dt, "experts", /*unbound_weights=*/true);
  const Tensor w13 = std::as_const(stacked).param("w13").to(stored);
  const Tensor w2 = std::as_const(stacked).param("w2").to(stored);
  for (int64_t e = 0; e < cfg.num_experts; ++e) {
    ex.bind_expert_weights(e, w13.select(e).clone(), w2.select(e).clone());
  }
  if (cfg.bias) {
    ex.param("b13").copy_from(std::as_const(stacked).param("b13"));
    ex.param("b2").copy_from(std::as_const(stacked).param("b2"));
  }
  ASSERT_TRUE(ex.weights_per_expert());
  ASSERT_TRUE(ExpertPacks::applies(ex)) << "bound or narrower weights left the grouped kernels";
  const int64_t N = offsets().back();
  const Tensor x = random_tensor({N, kD}, dt, rng), dy = random_tensor({N, kD}, dt, rng);
  const Tensor score = absorbed ? random_scores(N, rng) : Tensor();
  const Outputs got = host_run(ex, x, dy, score, false);
  EXPECT_EQ(ex.packs().stats().packs, 4) << "the grouped kernels did not run";
  const Outputs want = per_expert_run(ex, x, dy, score, false);
  expect_same(got, want, {}, "bound one expert at a time");
  // And the stacked experts holding the same (bf16-rounded) values at the
  // run's width give those bits again: the widened weights are the ones
  // computed with.
  stacked.param("w13").copy_from(w13);
  stacked.param("w2").copy_from(w2);
  expect_same(got, host_run(stacked, x, dy, score, false), {}, "stacked at the run's width");
}

// Experts stored quantized (int4, group 32) run on the grouped kernels
// with no packed copy and give the bits of the same experts bound with
// their dequantized weights; the per-expert path (which an adapter takes)
// reads those dequantized weights through weights(e) and agrees too. Dx
// only: quantized experts are frozen, and their widened params refused.
TEST_P(ExpertKernels, QuantizedExpertsEqualTheirDequantizedWeights) {
  const auto [isa, dt, variant, absorbed] = GetParam();
  Rng rng(87);
  const ExpertsConfig cfg = testing::experts_config(variant, int64_t(kRows.size()), kD, kF);
  GroupedExperts stacked(cfg, dt);
  testing::fill_experts(stacked, rng, 0.3);
  GroupedExperts quant(cfg, dt, "experts.q", /*unbound_weights=*/true);
  GroupedExperts widened(cfg, dt, "experts.d", /*unbound_weights=*/true);
  std::vector<QuantMatrix> q13, q2;
  for (int64_t e = 0; e < cfg.num_experts; ++e) {
    q13.push_back(quantize_int(std::as_const(stacked).param("w13").select(e), QuantFormat::int4, 32));
    q2.push_back(quantize_int(std::as_const(stacked).param("w2").select(e), QuantFormat::int4, 32));
    widened.bind_expert_weights(e, dequantize(q13.back(), dt), dequantize(q2.back(), dt));
  }
  quant.bind_quantized_weights(q13, q2);
  if (cfg.bias) {
    for (GroupedExperts* ex : {&quant, &widened}) {
      ex->param("b13").copy_from(std::as_const(stacked).param("b13"));
      ex->param("b2").copy_from(std::as_const(stacked).param("b2"));
    }
  }
  ASSERT_TRUE(ExpertPacks::applies(quant));
  const int64_t N = offsets().back();
  const Tensor x = random_tensor({N, kD}, dt, rng), dy = random_tensor({N, kD}, dt, rng);
  const Tensor score = absorbed ? random_scores(N, rng) : Tensor();
  const Outputs got = host_run(quant, x, dy, score, false);
  EXPECT_EQ(quant.packs().stats().packs, 4) << "the grouped kernels did not run";
  EXPECT_EQ(quant.packs().stats().bytes, 0) << "a widened copy of quantized experts was kept";
  expect_same(got, host_run(widened, x, dy, score, false), {}, "bound dequantized");
  expect_same(got, per_expert_run(quant, x, dy, score, false), {}, "per expert");
  EXPECT_THROW(std::as_const(quant).param("w13"), Error);
  // Codes and f32 scales only: 4 bits a value, 32 bits a group of 32, the
  // rows padded to whole words.
  EXPECT_EQ(quant.weight_bytes(), cfg.num_experts * (quant_bytes(QuantFormat::int4, 2 * kF, kD, 32) +
                                                     quant_bytes(QuantFormat::int4, kD, kF, 32)));
  EXPECT_LT(quant.weight_bytes(), widened.weight_bytes() / (dt == DType::bf16 ? 2 : 5));
}

// A plain per-expert LoRA (u = x A^T, y's columns += u B^T; backward adds
// dx, and accumulates dA and dB), in f64 arithmetic: both paths call it with
// the same rows, so their bits can only differ where the paths do.
class PlainAdapter final : public ExpertAdapter {
 public:
  // gate_proj takes W13's output columns {gate, 2}..., up_proj {up, 2}...
  // (gpt-oss's interleaving) or [0, F) and [F, 2F): whichever the experts use.
  PlainAdapter(int64_t E, int64_t D, int64_t F, bool interleaved, Rng& rng)
      : F_(F), interleaved_(interleaved) {
    for (int p = 0; p < 3; ++p) {
      const int64_t in = p == 2 ? F : D, out = p == 2 ? D : F;
      A_[p] = random_tensor({E, kR, in}, DType::f32, rng);
      B_[p] = random_tensor({E, out, kR}, DType::f32, rng);
      dA_[p] = Tensor::zeros(A_[p].shape(), DType::f32);
      dB_[p] = Tensor::zeros(B_[p].shape(), DType::f32);
    }
  }
  bool adapts(ExpertLinear) const override { return true; }
  int64_t rank() const override { return kR; }
  DType dtype() const override { return DType::f32; }
  void forward_rows(ExpertLinear p, int64_t e, Tensor& y, Tensor& u,
                    const Tensor& x) const override {
    const int i = int(p);
    const int64_t M = x.size(0), I = x.size(1), O = B_[i].size(1);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t r = 0; r < kR; ++r) {
        double s = 0;
        for (int64_t k = 0; k < I; ++k) s += x.get(m * I + k) * A_[i].get((e * kR + r) * I + k);
        u.set(m * kR + r, s);
      }
      for (int64_t o = 0; o < O; ++o) {
        double s = 0;
        for (int64_t r = 0; r < kR; ++r) s += u.get(m * kR + r) * B_[i].get((e * O + o) * kR + r);
        const int64_t at = m * y.size(1) + column(p, o);
        y.set(at, y.get(at) + s);
      }
    }
  }
  void backward_rows(ExpertLinear p, int64_t e, Tensor& dx, const Tensor& dy, const Tensor& x,
                     const Tensor& u) override {
    const int i = int(p);
    const int64_t M = x.size(0), I = x.size(1), O = B_[i].size(1);
    for (int64_t m = 0; m < M; ++m) {
      std::vector<double> du(kR, 0.0);
      for (int64_t o = 0; o < O; ++o) {
        const double g = dy.get(m * dy.size(1) + column(p, o));
        for (int64_t r = 0; r < kR; ++r) {
          du[size_t(r)] += g * B_[i].get((e * O + o) * kR + r);
          const int64_t at = (e * O + o) * kR + r;
          dB_[i].set(at, dB_[i].get(at) + g * u.get(m * kR + r));
        }
      }
      for (int64_t r = 0; r < kR; ++r) {
        for (int64_t k = 0; k < I; ++k) {
          const int64_t at = (e * kR + r) * I + k;
          dA_[i].set(at, dA_[i].get(at) + du[size_t(r)] * x.get(m * I + k));
          dx.set(m * I + k, dx.get(m * I + k) + du[size_t(r)] * A_[i].get(at));
        }
      }
    }
  }
  std::vector<Tensor> grads() const {
    return {dA_[0].clone(), dB_[0].clone(), dA_[1].clone(),
            dB_[1].clone(), dA_[2].clone(), dB_[2].clone()};
  }
  void zero_grad() {
    for (int p = 0; p < 3; ++p) dA_[p].zero(), dB_[p].zero();
  }

 private:
  static constexpr int64_t kR = 3;
  int64_t column(ExpertLinear p, int64_t o) const {
    if (p == ExpertLinear::down) return o;
    const int64_t first = p == ExpertLinear::gate ? 0 : 1;
    return interleaved_ ? 2 * o + first : first * F_ + o;
  }
  int64_t F_;
  bool interleaved_;
  Tensor A_[3], B_[3], dA_[3], dB_[3];
};

// Experts carrying an adapter run on the grouped kernels (the adapter's
// branches beside them) with the bits of the per-expert path they took
// before: outputs, saves, dx, dscore, the experts' and the adapter's grads.
TEST_P(ExpertKernels, AnAdapterOnTheGroupedKernelsGivesThePerExpertBits) {
  const auto [isa, dt, variant, absorbed] = GetParam();
  Rng rng(89);
  const ExpertsConfig cfg = testing::experts_config(variant, int64_t(kRows.size()), kD, kF);
  GroupedExperts ex(cfg, dt);
  testing::fill_experts(ex, rng, 0.3);
  PlainAdapter adapter(cfg.num_experts, kD, kF, cfg.activation == ExpertActivation::gpt_oss, rng);
  ex.set_adapter(&adapter);
  const int64_t N = offsets().back();
  const Tensor x = random_tensor({N, kD}, dt, rng), dy = random_tensor({N, kD}, dt, rng);
  const Tensor score = absorbed ? random_scores(N, rng) : Tensor();
  for (bool weight_grads : {true, false}) {
    auto run = [&](bool grouped) {
      ex.packs().set_enabled(grouped);
      EXPECT_EQ(ExpertPacks::applies(ex), grouped);
      adapter.zero_grad();
      Outputs r = host_run(ex, x, dy, score, weight_grads, /*adapter_grads=*/true);
      for (Tensor& g : adapter.grads()) r.grads.push_back(std::move(g));
      return r;
    };
    const Outputs got = run(true);
    const Outputs want = run(false);
    std::vector<std::string> names = weight_grads ? ex.param_names() : std::vector<std::string>{};
    for (const char* n : {"gate.A", "gate.B", "up.A", "up.B", "down.A", "down.B"}) {
      names.push_back(std::string("lora.") + n);
    }
    expect_same(got, want, names, weight_grads ? "full" : "dx only");
    // The adapter changed the output: the comparison is not of the base alone.
    ex.set_adapter(nullptr);
    const Outputs base = host_run(ex, x, dy, score, false);
    ex.set_adapter(&adapter);
    EXPECT_FALSE(bitwise_equal(base.y, got.y, "y without the adapter"));
  }
}

// Packed once: a second step with unchanged weights packs nothing; after an
// in-place change announced by weights_changed() (the optimizer step's
// path) the results follow the new weights.
TEST(ExpertPacks, RepackAfterWeightsChange) {
  Rng rng(83);
  GroupedExperts ex(testing::experts_config(Variant::swiglu, int64_t(kRows.size()), kD, kF),
                    DType::bf16);
  testing::fill_experts(ex, rng, 0.3);
  const int64_t N = offsets().back();
  const Tensor x = random_tensor({N, kD}, DType::bf16, rng);
  const Tensor dy = random_tensor({N, kD}, DType::bf16, rng);
  host_run(ex, x, dy, Tensor(), true);
  const ExpertPackStats first = ex.packs().stats();
  EXPECT_EQ(first.packs, 4);  // W13 and W2, each for forward and dx
  const Tensor w13 = std::as_const(ex).param("w13"), w2 = std::as_const(ex).param("w2");
  // Two copies of each (forward and dx layouts), panels padded.
  EXPECT_GE(first.bytes, int64_t(2 * (w13.nbytes() + w2.nbytes())));
  host_run(ex, x, dy, Tensor(), true);
  EXPECT_EQ(ex.packs().stats().packs, 4) << "unchanged weights were re-packed";
  const int64_t after_access = 4;

  // An optimizer-like update through held tensors, then the announcement.
  Tensor held13 = w13, held2 = w2;
  fill_normal(held13, rng, 0.0, 0.3);
  fill_normal(held2, rng, 0.0, 0.3);
  ex.weights_changed();
  const Outputs got = host_run(ex, x, dy, Tensor(), true);
  EXPECT_EQ(ex.packs().stats().packs, after_access + 4);
  const Outputs want = per_expert_run(ex, x, dy, Tensor(), true);
  expect_same(got, want, ex.param_names(), "after the update");
}

// Unbound weights (a placeholder shape with no memory) are never packed: the
// packs refuse them naming the experts, and a stack bound one expert at a
// time is bound for the experts given only.
TEST(ExpertPacks, UnboundWeightsAreRefusedNotRead) {
  const ExpertsConfig cfg = testing::experts_config(Variant::swiglu, 2, kD, kF);
  GroupedExperts stacked(cfg, DType::bf16, "model.layers.0.mlp.experts", /*unbound_weights=*/true);
  EXPECT_FALSE(stacked.weights_bound(0));
  try {
    stacked.packs().get(stacked, ExpertPack::w13_glu);
    FAIL() << "an unbound stack was packed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("before they were bound"), std::string::npos) << e.what();
    EXPECT_EQ(e.where(), "model.layers.0.mlp.experts");
  }
  GroupedExperts one(cfg, DType::bf16, "experts", /*unbound_weights=*/true);
  one.bind_expert_weights(0, Tensor::zeros({2 * kF, kD}, DType::bf16),
                          Tensor::zeros({kD, kF}, DType::bf16));
  EXPECT_TRUE(one.weights_bound(0));
  EXPECT_FALSE(one.weights_bound(1));
  EXPECT_THROW(one.packs().get(one, ExpertPack::w2), Error);
}

}  // namespace
}  // namespace tiermoe
