// LoRA: PEFT target matching, init, the adapter forward against the merged
// weight, f64 finite differences of every gradient, the documented bf16
// rounding points, per-expert adapters, and PEFT export/import.
#include <cmath>

#include "common/testing.h"
#include "io/test_safetensors_util.h"
#include "tiermoe/kernels/matmul.h"
#include "tiermoe/model/lora.h"

namespace tiermoe {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::fd_check;
using testing::random_tensor;
using testing::TempDir;
using testing::throws_error_with;

constexpr int64_t kM = 5, kIn = 12, kOut = 10, kR = 3;

LoraConfig config_with(std::set<std::string> targets, int64_t rank = kR, double alpha = 6,
                       bool rslora = false) {
  LoraConfig c;
  c.rank = rank;
  c.alpha = alpha;
  c.rslora = rslora;
  c.targets = std::move(targets);
  return c;
}

// An adapter with random A and B (a trained one, not a fresh no-op).
LoraAdapter trained_adapter(DType compute, Rng& rng, int64_t in = kIn, int64_t out = kOut) {
  LoraAdapter a(in, out, config_with({"q_proj"}), compute, "model.layers.0.self_attn.q_proj");
  a.init(rng);
  fill_normal(a.B_OR, rng, 0.0, 0.5);
  return a;
}

Tensor base_forward(const Tensor& x_MI, const Tensor& w_OI, DType out_dtype) {
  Tensor y = Tensor::empty({x_MI.size(0), w_OI.size(0)}, out_dtype);
  cpu::matmul_forward(y, x_MI, w_OI);
  return y;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(t.get(i)));
  return m;
}

// ---- configuration and target matching ----

TEST(LoraConfig, ScalingFollowsPeft) {
  EXPECT_EQ(config_with({"q_proj"}, 4, 16).scaling(), 16.0 / 4);
  EXPECT_EQ(config_with({"q_proj"}, 4, 16, true).scaling(), 16.0 / std::sqrt(4.0));
}

TEST(LoraConfig, DefaultTargetsAreAttention) {
  std::set<std::string> want = {"q_proj", "k_proj", "v_proj", "o_proj"};
  EXPECT_EQ(lora_default_targets(preset("tiny")), want);
  EXPECT_EQ(LoraConfig{}.targets, want);
  // Latent attention's projections, with and without the q latent.
  ModelConfig mla = preset("tiny-deepseek-v3");
  EXPECT_EQ(
      lora_default_targets(mla),
      (std::set<std::string>{"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"}));
  mla.q_lora_rank = 0;
  EXPECT_EQ(lora_default_targets(mla),
            (std::set<std::string>{"q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"}));
  LoraConfig c;
  EXPECT_TRUE(lora_targets_module(c, "model.layers.3.self_attn.q_proj"));
  EXPECT_TRUE(lora_targets_module(c, "model.layers.3.self_attn.o_proj"));
  EXPECT_FALSE(lora_targets_module(c, "model.layers.3.mlp.experts.0.gate_proj"));
  EXPECT_FALSE(lora_targets_module(c, "model.layers.0.mlp.down_proj"));
  EXPECT_FALSE(lora_targets_module(c, "model.layers.3.mlp.gate"));
}

TEST(LoraConfig, PeftListMatching) {
  LoraConfig c = config_with({"q_proj", "gate_proj", "down_proj"});
  EXPECT_TRUE(lora_targets_module(c, "model.layers.3.self_attn.q_proj"));
  EXPECT_TRUE(lora_targets_module(c, "q_proj"));  // key == name
  EXPECT_FALSE(lora_targets_module(c, "model.layers.3.self_attn.k_proj"));
  // gate_proj matches experts and dense MLPs, never the router mlp.gate.
  EXPECT_TRUE(lora_targets_module(c, "model.layers.3.mlp.experts.17.gate_proj"));
  EXPECT_TRUE(lora_targets_module(c, "model.layers.0.mlp.gate_proj"));
  EXPECT_FALSE(lora_targets_module(c, "model.layers.3.mlp.gate"));
  EXPECT_FALSE(lora_targets_module(c, "model.layers.3.mlp.experts.17.up_proj"));
  // A suffix must start at a path component.
  EXPECT_FALSE(lora_targets_module(c, "model.layers.3.self_attn.xq_proj"));
  EXPECT_TRUE(lora_targets_module(c, "model.layers.3.mlp.experts.0.down_proj"));
  // A path tail matches only modules under it: the shared expert, not the
  // routed experts or a dense MLP.
  LoraConfig shared = config_with({"shared_expert.gate_proj"});
  EXPECT_TRUE(lora_targets_module(shared, "model.layers.0.mlp.shared_expert.gate_proj"));
  EXPECT_FALSE(lora_targets_module(shared, "model.layers.0.mlp.gate_proj"));
  EXPECT_FALSE(lora_targets_module(shared, "model.layers.0.mlp.experts.3.gate_proj"));
}

TEST(LoraConfig, ParseTargets) {
  std::set<std::string> want = {"q_proj", "v_proj", "gate_proj"};
  EXPECT_EQ(parse_lora_targets("q_proj,v_proj, gate_proj"), want);
  EXPECT_EQ(parse_lora_targets("q_proj,q_proj"), std::set<std::string>{"q_proj"});
  EXPECT_TRUE(throws_error_with(
      [] { parse_lora_targets("q_proj,w1"); },
      {"unknown LoRA target 'w1'", "--lora-targets", "q_proj, k_proj", "down_proj"}));
  // A module path's tail, as PEFT matches it; its parts must be names.
  EXPECT_EQ(parse_lora_targets("shared_expert.gate_proj,self_attn.q_proj"),
            (std::set<std::string>{"shared_expert.gate_proj", "self_attn.q_proj"}));
  for (const char* bad : {".q_proj", "shared_expert..up_proj", "a b.q_proj", "shared_expert.w1"}) {
    EXPECT_TRUE(throws_error_with([&] { parse_lora_targets(bad); },
                                  {"unknown LoRA target", "shared_expert.gate_proj"}))
        << bad;
  }
  for (const char* router : {"gate", "mlp.gate", "q_proj,gate", "mlp.shared_expert_gate"}) {
    EXPECT_TRUE(throws_error_with([&] { parse_lora_targets(router); }, {"router", "never adapted"}))
        << router;
  }
  EXPECT_TRUE(throws_error_with([] { parse_lora_targets("q_proj,,v_proj"); }, {"empty name"}));
  EXPECT_TRUE(throws_error_with([] { parse_lora_targets(""); }, {"empty name"}));
}

TEST(LoraConfig, ValidateRejectsBadValues) {
  LoraConfig c;
  c.rank = 0;
  EXPECT_TRUE(throws_error_with([&] { c.validate("cfg"); }, {"rank must be positive", "cfg"}));
  c = LoraConfig{};
  c.dropout = 0.05;
  EXPECT_TRUE(throws_error_with([&] { c.validate("cfg"); }, {"dropout", "not supported"}));
  c = LoraConfig{};
  c.targets = {"gate"};
  EXPECT_TRUE(throws_error_with([&] { c.validate("cfg"); }, {"never adapted"}));
  c = LoraConfig{};
  c.targets.clear();
  EXPECT_TRUE(throws_error_with([&] { c.validate("cfg"); }, {"no LoRA targets"}));
}

// ---- init ----

TEST(Lora, InitIsKaimingUniformAndZeroB) {
  Rng rng(3);
  LoraAdapter a(64, kOut, config_with({"q_proj"}, 8), DType::bf16, "q");
  a.init(rng);
  EXPECT_EQ(a.A_RI.dtype(), DType::f32);  // fp32 masters in bf16 runs
  double bound = 1.0 / std::sqrt(64.0), lo = 0, hi = 0;
  for (int64_t i = 0; i < a.A_RI.numel(); ++i) {
    double v = a.A_RI.get(i);
    ASSERT_LE(std::abs(v), bound);
    lo = std::min(lo, v), hi = std::max(hi, v);
  }
  // 512 uniform draws reach close to both ends of the interval.
  EXPECT_LT(lo, -0.9 * bound);
  EXPECT_GT(hi, 0.9 * bound);
  EXPECT_EQ(max_abs(a.B_OR), 0.0);
}

TEST(Lora, FreshAdapterIsABitwiseNoOp) {
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Rng rng(5);
    LoraAdapter a(kIn, kOut, config_with({"q_proj"}), dt, "q");
    a.init(rng);
    Tensor x = random_tensor({kM, kIn}, dt, rng);
    Tensor y = random_tensor({kM, kOut}, dt, rng);
    Tensor y0 = y.clone(), u = Tensor::empty({kM, kR}, lora_master_dtype(dt));
    a.forward(y, u, x);
    EXPECT_TRUE(bitwise_equal(y, y0, "y"));

    Tensor dy = random_tensor({kM, kOut}, dt, rng), dx = random_tensor({kM, kIn}, dt, rng);
    Tensor dx0 = dx.clone();
    a.backward(dx, dy, x, u);
    EXPECT_TRUE(bitwise_equal(dx, dx0, "dx"));
    EXPECT_EQ(max_abs(a.dA_RI), 0.0);  // dA = (dy B)^T x vanishes with B = 0
    EXPECT_GT(max_abs(a.dB_OR), 0.0);  // dB does not: that is how B leaves zero
  }
}

// ---- merged weight == adapter ----

// The adapter forward on top of x W^T against x (W + s B A)^T.
void expect_merged_equals_adapter(DType dt, double rtol, double atol_of_max) {
  SCOPED_TRACE(std::string(dtype_name(dt)));
  Rng rng(11);
  LoraAdapter a = trained_adapter(dt, rng);
  Tensor x = random_tensor({kM, kIn}, dt, rng);
  Tensor w = random_tensor({kOut, kIn}, dt, rng, 0.3);

  Tensor y_adapter = base_forward(x, w, dt);
  Tensor u = Tensor::empty({kM, kR}, lora_master_dtype(dt));
  a.forward(y_adapter, u, x);

  Tensor merged = w.clone();
  a.merge(merged);
  Tensor y_merged = base_forward(x, merged, dt);
  // The branch must matter, or the comparison proves nothing.
  Tensor base = base_forward(x, w, dt);
  double branch = 0;
  for (int64_t i = 0; i < base.numel(); ++i) {
    branch = std::max(branch, std::abs(y_adapter.get(i) - base.get(i)));
  }
  ASSERT_GT(branch, 0.1 * max_abs(y_adapter));
  EXPECT_TRUE(all_close(y_merged, y_adapter, rtol, atol_of_max * max_abs(y_adapter), "y"));
}

TEST(Lora, MergedForwardEqualsAdapterForward) {
  expect_merged_equals_adapter(DType::f64, 1e-12, 1e-13);
  // f32: W + s B A rounds to f32 once per element; a dot of 12 products then
  // differs by a few ulps of the largest term.
  expect_merged_equals_adapter(DType::f32, 1e-5, 1e-6);
  // bf16: the merged weight rounds to bf16 (relative 2^-9) and both outputs
  // round to bf16; 1/32 of the largest |y| is ~8 bf16 ulps there.
  expect_merged_equals_adapter(DType::bf16, 0, 1.0 / 32);
}

TEST(Lora, Bf16MergeRoundsTheFp32SumOnce) {
  Rng rng(13);
  LoraAdapter a = trained_adapter(DType::bf16, rng);
  Tensor w = random_tensor({kOut, kIn}, DType::bf16, rng, 0.3);
  Tensor w32 = w.to(DType::f32);
  a.merge(w);
  lora_merge(w32, a.A_RI, a.B_OR, a.scaling());
  EXPECT_TRUE(bitwise_equal(w, w32.to(DType::bf16), "merged w"));
}

// bf16 forward is the f32 forward on the upcast tensors, rounded once; bf16
// dx adds the bf16-rounded branch gradient (PEFT's fp32 adapters under
// autograd).
TEST(Lora, Bf16RunsTheBranchInFp32) {
  Rng rng(17);
  LoraAdapter a = trained_adapter(DType::bf16, rng);
  LoraAdapter a32(kIn, kOut, config_with({"q_proj"}), DType::f32, "q");
  a32.A_RI.copy_from(a.A_RI);
  a32.B_OR.copy_from(a.B_OR);

  Tensor x = random_tensor({kM, kIn}, DType::bf16, rng),
         y = random_tensor({kM, kOut}, DType::bf16, rng);
  Tensor x32 = x.to(DType::f32), y32 = y.to(DType::f32);
  Tensor u = Tensor::empty({kM, kR}, DType::f32), u32 = Tensor::empty({kM, kR}, DType::f32);
  a.forward(y, u, x);
  a32.forward(y32, u32, x32);
  EXPECT_TRUE(bitwise_equal(y, y32.to(DType::bf16), "y"));
  EXPECT_TRUE(bitwise_equal(u, u32, "u"));

  Tensor dy = random_tensor({kM, kOut}, DType::bf16, rng),
         dx = random_tensor({kM, kIn}, DType::bf16, rng);
  Tensor branch_dx = Tensor::zeros({kM, kIn}, DType::f32);
  Tensor want_dx = dx.to(DType::f32);
  a.backward(dx, dy, x, u);
  a32.backward(branch_dx, dy.to(DType::f32), x32, u32);
  Tensor branch_dx_bf16 = branch_dx.to(DType::bf16);
  for (int64_t i = 0; i < want_dx.numel(); ++i) {
    want_dx.set(i, want_dx.get(i) + branch_dx_bf16.get(i));
  }
  EXPECT_TRUE(bitwise_equal(dx, want_dx.to(DType::bf16), "dx"));
  EXPECT_TRUE(bitwise_equal(a.dA_RI, a32.dA_RI, "dA"));
  EXPECT_TRUE(bitwise_equal(a.dB_OR, a32.dB_OR, "dB"));
}

// ---- finite differences (f64) ----

// loss = sum(y * r) over a wider output whose columns `cols` the adapter owns.
void check_gradients(LoraColumns cols, int64_t width) {
  Rng rng(23);
  LoraAdapter a = trained_adapter(DType::f64, rng);
  Tensor x = random_tensor({kM, kIn}, DType::f64, rng);
  Tensor y0 = random_tensor({kM, width}, DType::f64, rng);
  Tensor r = random_tensor({kM, width}, DType::f64, rng);
  Tensor u = Tensor::empty({kM, kR}, DType::f64);
  auto loss = [&] {
    Tensor y = y0.clone();
    a.forward(y, u, x, cols);
    double l = 0;
    for (int64_t i = 0; i < y.numel(); ++i) l += y.get(i) * r.get(i);
    return l;
  };
  loss();
  Tensor dx = Tensor::zeros({kM, kIn}, DType::f64);
  a.backward(dx, r, x, u, cols);
  EXPECT_TRUE(fd_check(loss, x, dx, "dx", 1e-6, 1e-7));
  EXPECT_TRUE(fd_check(loss, a.A_RI, a.dA_RI, "dA", 1e-6, 1e-7));
  EXPECT_TRUE(fd_check(loss, a.B_OR, a.dB_OR, "dB", 1e-6, 1e-7));

  // Gradients accumulate: a second backward doubles them exactly.
  Tensor dA1 = a.dA_RI.clone(), dx1 = dx.clone();
  a.backward(dx, r, x, u, cols);
  for (int64_t i = 0; i < dA1.numel(); ++i) ASSERT_EQ(a.dA_RI.get(i), 2 * dA1.get(i));
  for (int64_t i = 0; i < dx1.numel(); ++i) ASSERT_EQ(dx.get(i), 2 * dx1.get(i));
}

TEST(Lora, FiniteDifferencesWholeRow) { check_gradients({}, kOut); }
TEST(Lora, FiniteDifferencesColumnSlice) { check_gradients({kOut, 1}, 2 * kOut); }
TEST(Lora, FiniteDifferencesInterleavedColumns) { check_gradients({1, 2}, 2 * kOut); }

TEST(Lora, RejectsBadOperands) {
  Rng rng(29);
  LoraAdapter a = trained_adapter(DType::f32, rng);
  Tensor x = random_tensor({kM, kIn}, DType::f32, rng), u = Tensor::empty({kM, kR}, DType::f32);
  Tensor y_short = Tensor::zeros({kM, kOut - 1}, DType::f32);
  EXPECT_TRUE(throws_error_with([&] { a.forward(y_short, u, x); }, {"do not fit"}));
  Tensor y_wide = Tensor::zeros({kM, 2 * kOut}, DType::f32);
  EXPECT_TRUE(throws_error_with([&] { a.forward(y_wide, u, x, {kOut + 1, 1}); }, {"do not fit"}));
  Tensor x_bad = random_tensor({kM, kIn + 1}, DType::f32, rng);
  Tensor y = Tensor::zeros({kM, kOut}, DType::f32);
  EXPECT_TRUE(throws_error_with([&] { a.forward(y, u, x_bad); }, {"x_MI"}));
  Tensor y_bf16 = Tensor::zeros({kM, kOut}, DType::bf16);
  EXPECT_TRUE(throws_error_with([&] { a.forward(y_bf16, u, x); }, {"y_MY"}));
}

// ---- per-expert adapters ----

constexpr int64_t kE = 3, kD = 8, kF = 6;

ExpertLora trained_experts(DType dt, Rng& rng, std::set<std::string> targets) {
  ExpertLora ex(kE, kD, kF, config_with(std::move(targets)), dt, "model.layers.2.mlp.experts");
  ex.init(rng);
  for (ExpertProj p : ex.projections()) fill_normal(ex.B(p), rng, 0.0, 0.5);
  return ex;
}

TEST(ExpertLora, AdaptsOnlyNamedProjections) {
  Rng rng(31);
  ExpertLora attn_only(kE, kD, kF, LoraConfig{}, DType::f32, "model.layers.2.mlp.experts");
  EXPECT_TRUE(attn_only.empty());
  ExpertLora ex = trained_experts(DType::f32, rng, {"q_proj", "up_proj", "down_proj"});
  EXPECT_FALSE(ex.has(ExpertProj::gate));
  EXPECT_TRUE(ex.has(ExpertProj::up));
  EXPECT_EQ(ex.A(ExpertProj::up).shape(), (Shape{kE, kR, kD}));
  EXPECT_EQ(ex.B(ExpertProj::up).shape(), (Shape{kE, kF, kR}));
  EXPECT_EQ(ex.A(ExpertProj::down).shape(), (Shape{kE, kR, kF}));
  EXPECT_EQ(ex.B(ExpertProj::down).shape(), (Shape{kE, kD, kR}));
  EXPECT_EQ(ex.module_path(ExpertProj::down, 2), "model.layers.2.mlp.experts.2.down_proj");
  EXPECT_TRUE(
      throws_error_with([&] { ex.A(ExpertProj::gate); }, {"gate_proj", "not a LoRA target"}));
}

// Expert e's gate and up adapters on the fused [M, 2F] w13 output equal the
// merged w13_e; down_proj likewise on [M, D].
void expect_expert_merge_matches(DType dt, double rtol, double atol_of_max) {
  SCOPED_TRACE(std::string(dtype_name(dt)));
  Rng rng(37);
  ExpertLora ex = trained_experts(dt, rng, {"gate_proj", "up_proj", "down_proj"});
  DType md = lora_master_dtype(dt);
  for (int64_t e = 0; e < kE; ++e) {
    Tensor w13 = random_tensor({2 * kF, kD}, dt, rng, 0.3),
           w2 = random_tensor({kD, kF}, dt, rng, 0.3);
    Tensor x = random_tensor({kM, kD}, dt, rng), a = random_tensor({kM, kF}, dt, rng);

    Tensor h = base_forward(x, w13, dt), y = base_forward(a, w2, dt);
    Tensor ug = Tensor::empty({kM, kR}, md), uu = Tensor::empty({kM, kR}, md),
           ud = Tensor::empty({kM, kR}, md);
    ex.forward_rows(ExpertProj::gate, e, h, ug, x, {0, 1});
    ex.forward_rows(ExpertProj::up, e, h, uu, x, {kF, 1});
    ex.forward_rows(ExpertProj::down, e, y, ud, a);

    Tensor gate = w13.rows(0, kF), up = w13.rows(kF, 2 * kF);
    ex.merge(ExpertProj::gate, e, gate);
    ex.merge(ExpertProj::up, e, up);
    ex.merge(ExpertProj::down, e, w2);
    EXPECT_TRUE(all_close(base_forward(x, w13, dt), h, rtol, atol_of_max * max_abs(h), "h"));
    EXPECT_TRUE(all_close(base_forward(a, w2, dt), y, rtol, atol_of_max * max_abs(y), "y"));
  }
}

TEST(ExpertLora, MergedForwardEqualsAdapterForward) {
  expect_expert_merge_matches(DType::f64, 1e-12, 1e-13);
  expect_expert_merge_matches(DType::bf16, 0, 1.0 / 32);  // as for one linear
}

TEST(ExpertLora, FiniteDifferencesTouchOnlyTheExpert) {
  Rng rng(41);
  ExpertLora ex = trained_experts(DType::f64, rng, {"gate_proj", "up_proj"});
  const int64_t e = 1;
  Tensor x = random_tensor({kM, kD}, DType::f64, rng);
  Tensor h0 = random_tensor({kM, 2 * kF}, DType::f64, rng),
         r = random_tensor({kM, 2 * kF}, DType::f64, rng);
  Tensor ug = Tensor::empty({kM, kR}, DType::f64), uu = Tensor::empty({kM, kR}, DType::f64);
  auto loss = [&] {
    Tensor h = h0.clone();
    ex.forward_rows(ExpertProj::gate, e, h, ug, x, {0, 1});
    ex.forward_rows(ExpertProj::up, e, h, uu, x, {kF, 1});
    double l = 0;
    for (int64_t i = 0; i < h.numel(); ++i) l += h.get(i) * r.get(i);
    return l;
  };
  loss();
  Tensor dx = Tensor::zeros({kM, kD}, DType::f64);
  ex.backward_rows(ExpertProj::up, e, dx, r, x, uu, {kF, 1});
  ex.backward_rows(ExpertProj::gate, e, dx, r, x, ug, {0, 1});
  EXPECT_TRUE(fd_check(loss, x, dx, "dx", 1e-6, 1e-7));
  for (ExpertProj p : {ExpertProj::gate, ExpertProj::up}) {
    Tensor A = ex.A(p).select(e), B = ex.B(p).select(e);
    EXPECT_TRUE(fd_check(loss, A, ex.dA(p).select(e), "dA", 1e-6, 1e-7));
    EXPECT_TRUE(fd_check(loss, B, ex.dB(p).select(e), "dB", 1e-6, 1e-7));
    for (int64_t other : {int64_t(0), int64_t(2)}) {
      EXPECT_EQ(max_abs(ex.dA(p).select(other)), 0.0);
      EXPECT_EQ(max_abs(ex.dB(p).select(other)), 0.0);
    }
  }
}

// ---- PEFT export and import ----

TEST(LoraPeft, ExportImportRoundTripsExactly) {
  Rng rng(43);
  LoraConfig cfg = config_with({"q_proj", "gate_proj", "down_proj"}, kR, 12, true);
  LoraAdapter q(kD, kOut, cfg, DType::bf16, "model.layers.2.self_attn.q_proj");
  q.init(rng);
  fill_normal(q.B_OR, rng, 0, 1);
  ExpertLora ex = trained_experts(DType::bf16, rng, cfg.targets);

  PeftLoraModules modules;
  modules[q.name()] = q.to_peft();
  ex.to_peft(modules);
  EXPECT_EQ(modules.size(), size_t(1 + 2 * kE));
  TempDir dir;
  save_peft_adapter(dir.path().string(), to_peft_config(cfg, "tiny"), modules);

  PeftAdapter back = load_peft_adapter(dir.path().string());
  LoraConfig cfg_back = from_peft_config(back.config, dir.path().string());
  EXPECT_EQ(cfg_back.rank, cfg.rank);
  EXPECT_EQ(cfg_back.alpha, cfg.alpha);
  EXPECT_EQ(cfg_back.rslora, cfg.rslora);
  EXPECT_EQ(cfg_back.targets, cfg.targets);
  EXPECT_EQ(back.config.base_model_name_or_path, "tiny");

  LoraAdapter q2(kD, kOut, cfg_back, DType::bf16, q.name());
  ExpertLora ex2(kE, kD, kF, cfg_back, DType::bf16, "model.layers.2.mlp.experts");
  q2.load_peft(back.modules.at(q.name()));
  ex2.load_peft(back.modules);
  EXPECT_TRUE(bitwise_equal(q2.A_RI, q.A_RI, "q A"));
  EXPECT_TRUE(bitwise_equal(q2.B_OR, q.B_OR, "q B"));
  for (ExpertProj p : {ExpertProj::gate, ExpertProj::down}) {
    EXPECT_TRUE(bitwise_equal(ex2.A(p), ex.A(p), std::string(expert_proj_name(p)) + " A"));
    EXPECT_TRUE(bitwise_equal(ex2.B(p), ex.B(p), std::string(expert_proj_name(p)) + " B"));
  }

  // An adapter lacking one expert cannot be imported.
  back.modules.erase("model.layers.2.mlp.experts.1.down_proj");
  EXPECT_TRUE(throws_error_with([&] { ex2.load_peft(back.modules); },
                                {"no weights for model.layers.2.mlp.experts.1.down_proj"}));
  PeftLoraWeights wrong = {Tensor::zeros({kR, kD + 1}, DType::f32), q.B_OR};
  EXPECT_TRUE(throws_error_with([&] { q2.load_peft(wrong); }, {"q_proj.lora_A.weight"}));
}

TEST(LoraPeft, ImportRejectsDropoutAndRouterTargets) {
  PeftLoraConfig p = to_peft_config(LoraConfig{}, "m");
  p.lora_dropout = 0.05;
  EXPECT_TRUE(throws_error_with([&] { from_peft_config(p, "adapter"); }, {"dropout", "adapter"}));
  p = to_peft_config(LoraConfig{}, "m");
  p.target_modules.push_back("gate");
  EXPECT_TRUE(throws_error_with([&] { from_peft_config(p, "adapter"); }, {"never adapted"}));
}

}  // namespace
}  // namespace tiermoe
