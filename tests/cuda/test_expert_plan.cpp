// The expert plans the CUDA device captures, checked on the host: the slots
// are device.h's (the CPU device's very list), every GEMM's shape and
// leading dimensions fit its operands, and the plan run by a plain
// interpreter gives the host's expert math for every graph kind x dtype x
// absorbed or not x bias x activation, continues the weight-gradient sums
// launch by launch, and fails on a doubled score and on dirty padding. Also
// the argument block's layout and the launch binding's errors.
#include <gtest/gtest.h>

#include <cstring>

#include "../../src/tier/expert_graphs.h"
#include "../../src/tier/expert_plan.h"
#include "graph_cases.h"
#include "plan_interpreter.h"

namespace tiermoe {
namespace {

using testing::GraphCase;

constexpr int64_t kD = 32, kF = 48, kG = 16, kM = 11;

testing::GraphRunner interpreter() {
  return [](const GraphKey& key, testing::GraphSlots& slots, bool sum_started) {
    testing::PlanInterpreter run(plan_expert_graph(key));
    for (const auto& [name, t] : slots) run.bind(name, t);
    run.run(sum_started);
  };
}

std::vector<GraphKey> every_key() {
  std::vector<GraphKey> keys;
  for (const GraphCase& c : testing::all_graph_cases()) {
    for (GraphKind k :
         {GraphKind::expert_fwd, GraphKind::expert_bwd_dx, GraphKind::expert_bwd_dx_dw}) {
      keys.push_back(testing::graph_key(k, c, kD, kF, kG));
    }
  }
  return keys;
}

TEST(ExpertPlan, SlotsAreTheDeviceContractsInOrder) {
  for (const GraphKey& key : every_key()) {
    const ExpertPlan plan = plan_expert_graph(key);
    const ExpertGraph cpu(key, KernelSet::ref);
    ASSERT_EQ(size_t(plan.slots()), cpu.slots().size()) << key.str();
    for (size_t i = 0; i < cpu.slots().size(); ++i) {
      const PlanRef& r = plan.refs[i];
      const GraphSlot& s = cpu.slots()[i];
      EXPECT_EQ(r.name, s.name) << key.str();
      EXPECT_EQ(r.shape, s.shape) << key.str() << " " << r.name;
      EXPECT_EQ(r.dtype, s.dtype) << key.str() << " " << r.name;
    }
    for (size_t i = size_t(plan.slots()); i < plan.refs.size(); ++i) {
      EXPECT_FALSE(plan.refs[i].slot) << key.str() << ": slots come first";
      EXPECT_EQ(plan.refs[i].scratch_offset % 256, 0u) << key.str();
      EXPECT_LE(plan.refs[i].scratch_offset + plan.refs[i].bytes(), plan.scratch_bytes);
    }
  }
}

// Column-major: an r x c operand with leading dimension ld spans exactly its
// ref, ld >= r, and the three operands agree on m, n, k.
TEST(ExpertPlan, EveryGemmFitsItsOperands) {
  for (const GraphKey& key : every_key()) {
    const ExpertPlan plan = plan_expert_graph(key);
    int gemms = 0;
    for (const PlanStep& step : plan.steps) {
      const auto* g = std::get_if<GemmStep>(&step);
      if (!g) continue;
      ++gemms;
      auto fits = [&](int ref, int64_t rows, int64_t cols, int64_t ld, const char* what) {
        const PlanRef& r = plan.refs[size_t(ref)];
        EXPECT_GE(ld, rows) << key.str() << " " << what << " " << r.name;
        EXPECT_EQ(ld * cols, shape_numel(r.shape)) << key.str() << " " << what << " " << r.name;
      };
      fits(g->a, g->trans_a ? g->k : g->m, g->trans_a ? g->m : g->k, g->lda, "A");
      fits(g->b, g->trans_b ? g->n : g->k, g->trans_b ? g->k : g->n, g->ldb, "B");
      fits(g->c, g->m, g->n, g->ldc, "C");
      const PlanRef& c = plan.refs[size_t(g->c)];
      EXPECT_EQ(g->beta == GemmBeta::sum, c.name.starts_with("dw")) << key.str() << " " << c.name;
    }
    const int want = key.kind == GraphKind::expert_bwd_dx_dw ? 4 : 2;
    EXPECT_EQ(gemms, want) << key.str();
  }
}

class PlanParity : public ::testing::TestWithParam<GraphCase> {};

TEST_P(PlanParity, InterpretedPlanEqualsTheHostsExpertMath) {
  const GraphCase c = GetParam();
  const testing::GraphProblem p = testing::make_graph_problem(c, kD, kF, kG, kM, 17);
  const testing::GraphOutputs got = testing::run_graphs(p.in, interpreter());
  EXPECT_TRUE(testing::graphs_match(got, p.want, c));
}

INSTANTIATE_TEST_SUITE_P(Cuda, PlanParity, ::testing::ValuesIn(testing::all_graph_cases()),
                         testing::graph_case_name);

// The comparison has teeth: a doubled score fails it; junk in dy's padding
// fails it where the padding's activations are not zero (a bias, scores not
// absorbed) and not where the padding's zero score keeps it out of every sum.
TEST(PlanParityCheck, FailsOnADoubledScoreAndOnDirtyPadding) {
  for (DType t : {DType::f64, DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const GraphCase absorbed{t, true, true}, post{t, false, true};
    using testing::Spoil;
    const auto doubled =
        testing::make_graph_problem(absorbed, kD, kF, kG, kM, 17, Spoil::double_one_score);
    EXPECT_FALSE(testing::graphs_match(testing::run_graphs(doubled.in, interpreter()), doubled.want,
                                       absorbed));
    const auto dirty =
        testing::make_graph_problem(post, kD, kF, kG, kM, 17, Spoil::dirty_dy_padding);
    const testing::GraphOutputs dirty_out = testing::run_graphs(dirty.in, interpreter());
    EXPECT_FALSE(testing::graphs_match(dirty_out, dirty.want, post));
    EXPECT_TRUE(testing::close_rows(dirty_out.dx, dirty.want.dx, 1e-2, "dx of real rows"));
    const auto kept_out =
        testing::make_graph_problem(absorbed, kD, kF, kG, kM, 17, Spoil::dirty_dy_padding);
    EXPECT_TRUE(testing::graphs_match(testing::run_graphs(kept_out.in, interpreter()),
                                      kept_out.want, absorbed));
  }
}

// M = 40 rows as three launches of G = 16 (started, then continued twice;
// the last one half padding) equal the host summing its rows in blocks of 16.
TEST(PlanParity, ContinuedSumsEqualTheHostsBlockedSum) {
  constexpr int64_t M = 40, launches = 3;
  for (const GraphCase c : {GraphCase{DType::f64, true, true}, GraphCase{DType::f32, false, true},
                            GraphCase{DType::bf16, true, false}}) {
    SCOPED_TRACE(dtype_name(c.dtype));
    ExpertsConfig cfg = testing::graph_experts_config(c, kD, kF);
    cfg.dw_row_block = kG;
    GroupedExperts ex(cfg, c.dtype);
    Rng rng(3);
    testing::fill_experts(ex, rng, 0.3);
    const DType t = c.dtype, s = testing::score_dtype_of(t);
    const Tensor x = testing::random_tensor({M, kD}, t, rng);
    const Tensor dy = testing::random_tensor({M, kD}, t, rng);
    Tensor score;
    if (c.absorb) {
      score = Tensor::empty({M}, s);
      fill_uniform(score, rng, 0.1, 1.0);
    }
    ExpertRowsActs acts;
    acts.h_M2F = Tensor::zeros({M, 2 * kF}, t), acts.a_MF = Tensor::zeros({M, kF}, t);
    acts.x_MD = x;
    Tensor y = Tensor::zeros({M, kD}, t), dx = Tensor::zeros({M, kD}, t), dscore;
    if (c.absorb) dscore = Tensor::zeros({M}, s);
    ex.forward_rows(0, y, acts, x, score);
    ex.allocate_grads();
    ex.zero_grad();
    ex.backward_rows(0, dx, dscore, dy, acts, score, /*weight_grads=*/true);

    const ExpertWeights w = ex.weights(0);
    Tensor dw13 = Tensor::zeros({2 * kF, kD}, s), dw2 = Tensor::zeros({kD, kF}, s);
    Tensor db13 = Tensor::zeros({2 * kF}, s), db2 = Tensor::zeros({kD}, s);
    for (int64_t i = 0; i < launches; ++i) {
      const int64_t b = i * kG, e = std::min(M, b + kG);
      testing::GraphSlots slots = {{"dy_GD", testing::padded(dy.rows(b, e), kG)},
                                   {"h_G2F", testing::padded(acts.h_M2F.rows(b, e), kG)},
                                   {"x_GD", testing::padded(x.rows(b, e), kG)},
                                   {"a_GF", testing::padded(acts.a_MF.rows(b, e), kG)},
                                   {"w13_FD", w.w13_FD},
                                   {"w2_DF", w.w2_DF},
                                   {"dx_GD", Tensor::zeros({kG, kD}, t)},
                                   {"dw13_FD", dw13},
                                   {"dw2_DF", dw2}};
      if (c.absorb) {
        slots.emplace_back("score_G", testing::padded(score.rows(b, e), kG));
        slots.emplace_back("dscore_G", Tensor::zeros({kG}, s));
      }
      if (c.bias) {
        slots.emplace_back("b13_F", w.b13_F);
        slots.emplace_back("b2_D", w.b2_D);
        slots.emplace_back("db13_F", db13);
        slots.emplace_back("db2_D", db2);
      }
      interpreter()(testing::graph_key(GraphKind::expert_bwd_dx_dw, c, kD, kF, kG), slots, i > 0);
      EXPECT_TRUE(testing::close_rows(testing::slot_of(slots, "dx_GD"), dx.rows(b, e),
                                      testing::graph_tolerance(t), "dx"));
    }
    const double tol = testing::graph_tolerance(t);
    const ExpertGrads g = ex.grads(0);
    EXPECT_TRUE(testing::close(dw13, g.dw13_FD, tol, "dw13"));
    EXPECT_TRUE(testing::close(dw2, g.dw2_DF, tol, "dw2"));
    if (c.bias) {
      EXPECT_TRUE(testing::close(db13, g.db13_F, tol, "db13"));
      EXPECT_TRUE(testing::close(db2, g.db2_D, tol, "db2"));
    }
  }
}

TEST(ExpertPlan, ArgumentBlockHoldsAddressesScalarsAndTheSumFlag) {
  for (DType t : {DType::f64, DType::bf16}) {
    const GraphKey key =
        testing::graph_key(GraphKind::expert_bwd_dx_dw, GraphCase{t, true, true}, kD, kF, kG);
    const ExpertPlan plan = plan_expert_graph(key);
    std::vector<uint64_t> slots;
    for (int i = 0; i < plan.slots(); ++i) slots.push_back(0x1000 * uint64_t(i + 1));
    std::vector<char> block(plan.arg_bytes, 'x');
    for (bool started : {false, true}) {
      write_arg_block(plan, slots, 0x900000, started, block.data());
      for (size_t i = 0; i < plan.refs.size(); ++i) {
        uint64_t a = 0;
        std::memcpy(&a, block.data() + 8 * i, 8);
        const uint64_t want = plan.refs[i].slot ? slots[i] : 0x900000 + plan.refs[i].scratch_offset;
        EXPECT_EQ(a, want) << plan.refs[i].name;
      }
      auto scalar = [&](size_t off) {
        if (t == DType::f64) {
          double d;
          std::memcpy(&d, block.data() + off, 8);
          return d;
        }
        float f;
        std::memcpy(&f, block.data() + off, 4);
        return double(f);
      };
      EXPECT_EQ(scalar(plan.one_offset()), 1.0);
      EXPECT_EQ(scalar(plan.beta_offset(GemmBeta::zero)), 0.0);
      EXPECT_EQ(scalar(plan.beta_offset(GemmBeta::sum)), started ? 1.0 : 0.0);
      int32_t flag = -1;
      std::memcpy(&flag, block.data() + plan.sum_started_offset, 4);
      EXPECT_EQ(flag, started ? 1 : 0);
      EXPECT_EQ(plan.sum_started_offset + 8, plan.arg_bytes);
    }
  }
}

TEST(ExpertPlan, BindingChecksEverySlotAndListsWhatTheLaunchTouches) {
  const GraphCase c{DType::f32, true, false};
  const ExpertPlan plan =
      plan_expert_graph(testing::graph_key(GraphKind::expert_bwd_dx_dw, c, kD, kF, kG));
  const size_t big = size_t(1) << 20;
  auto sizes = [&](uint64_t id) -> std::optional<size_t> {
    if (id == 1 || id == 2) return big;
    return std::nullopt;
  };
  auto args_for = [&] {
    GraphArgs a;
    size_t off = 0;
    for (int i = 0; i < plan.slots(); ++i) {
      const PlanRef& r = plan.refs[size_t(i)];
      a.set(r.name, DeviceTensor{DeviceBuffer{r.name.starts_with("dw") ? 2u : 1u, big}, off,
                                 r.shape, r.dtype});
      off += (r.bytes() + 255) / 256 * 256;
    }
    a.ints["sum_started"] = 1;
    return a;
  };
  const BoundLaunch b = bind_launch(plan, args_for(), sizes, 16, "test");
  ASSERT_EQ(int(b.slots.size()), plan.slots());
  EXPECT_TRUE(b.sum_started);
  ASSERT_EQ(b.accesses.size(), b.slots.size());
  for (int i = 0; i < plan.slots(); ++i) {
    const PlanRef& r = plan.refs[size_t(i)];
    EXPECT_EQ(b.accesses[size_t(i)].write, r.written) << r.name;
    EXPECT_EQ(b.accesses[size_t(i)].end - b.accesses[size_t(i)].begin, r.bytes()) << r.name;
  }
  EXPECT_TRUE(b.accesses[size_t(plan.ref("dx_GD"))].write);
  EXPECT_FALSE(b.accesses[size_t(plan.ref("w13_FD"))].write);
  EXPECT_TRUE(b.accesses[size_t(plan.ref("dw2_DF"))].write);

  struct Bad {
    const char* says;
    std::function<void(GraphArgs&)> spoil;
  };
  const std::vector<Bad> bad = {
      {"missing slot 'x_GD'", [](GraphArgs& a) { a.tensors.erase(a.tensors.begin() + 4); }},
      {"no slot named 'z'", [](GraphArgs& a) { a.set("z", a.tensors[0].second); }},
      {"given twice", [](GraphArgs& a) { a.set("dy_GD", a.tensors[0].second); }},
      {"want f32[16, 32]",
       [](GraphArgs& a) {
         a.tensors[0].second.shape = {kG + 1, kD};
       }},
      {"not a multiple of 16", [](GraphArgs& a) { a.tensors[0].second.offset += 4; }},
      {"not a live buffer", [](GraphArgs& a) { a.tensors[0].second.buffer.id = 9; }},
      {"do not fit", [](GraphArgs& a) { a.tensors[0].second.offset = big - 16; }},
      {"want 0 or 1", [](GraphArgs& a) { a.ints["sum_started"] = 2; }},
      {"no integer argument named 'n'", [](GraphArgs& a) { a.ints["n"] = 0; }},
  };
  for (const Bad& x : bad) {
    GraphArgs a = args_for();
    x.spoil(a);
    try {
      bind_launch(plan, a, sizes, 16, "test");
      ADD_FAILURE() << "accepted: " << x.says;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(x.says), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tiermoe
