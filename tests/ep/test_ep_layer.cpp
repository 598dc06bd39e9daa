// One MoE layer with expert parallelism over the job's ranks against the
// same layer on one rank: rank r's micro-batch through the AllToAllDispatcher
// (its experts on the other ranks too) gives the output, dx and router
// gradient that one rank gets for micro-batch r, and each rank's experts'
// gradients equal one rank's summed over all micro-batches in order. Bitwise,
// absorbed and post-combine, with weight gradients or dx only, with and
// without remat. The same comparison fails on a score doubled in transit
// and on a row sent to the wrong rank. Under the `full` remat policy the
// dispatch's collective replays once per layer and the combine's never.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ep/ep_env.h"
#include "moe/moe_layer_rig.h"
#include "tiermoe/moe/alltoall.h"

namespace tiermoe {
namespace {

using testing::all_ranks;
using testing::ep_comm;
using testing::LayerRig;
using testing::Variant;

constexpr int64_t kE = 8;

// A copy of experts [e0, e0 + n) of `all` (weights only).
std::unique_ptr<GroupedExperts> expert_slice(const GroupedExperts& all, int64_t e0, int64_t n) {
  ExpertsConfig c = all.config();
  c.num_experts = n;
  auto out = std::make_unique<GroupedExperts>(c, all.dtype(), "experts.local");
  for (const std::string& name : all.param_names()) {
    out->param(name).copy_from(all.param(name).rows(e0, e0 + n));
  }
  return out;
}

// Dispatch faults for showing that the comparison catches them.
enum class Spoil { none, doubled_score, wrong_rank };

// An AllToAllDispatcher that, on rank 0, doubles the first score it sends
// or counts the last row of its rank-0 experts as rank 1's first expert's
// (so that row is computed by the wrong expert on the wrong rank).
class SpoiledDispatcher final : public Dispatcher {
 public:
  SpoiledDispatcher(Comm& comm, Spoil spoil) : inner_(comm), spoil_(spoil) {}
  std::string name() const override { return "spoiled " + inner_.name(); }
  DispatchPlan plan(const std::vector<int32_t>& ids, const Tensor& w, int64_t E) const override {
    return inner_.plan(ids, w, E);
  }
  int ranks() const override { return inner_.ranks(); }
  int rank() const override { return inner_.rank(); }
  ExpertExchange exchange(const DispatchPlan& plan, std::string_view what) const override {
    if (spoil_ != Spoil::wrong_rank || rank() != 0) return inner_.exchange(plan, what);
    DispatchPlan p = plan;
    const int64_t El = p.E / ranks();
    int64_t e = El - 1;
    while (e > 0 && p.count_E[size_t(e)] == 0) --e;
    if (p.count_E[size_t(e)] > 0) {
      --p.count_E[size_t(e)];
      ++p.count_E[size_t(El)];
      p.offset_E[size_t(El)] -= 1;
    }
    return inner_.exchange(p, what);
  }
  Tensor to_experts(const Tensor& rows, const ExpertExchange& ex, MemoryTracker& mem,
                    std::string_view what) const override {
    Tensor out = inner_.to_experts(rows, ex, mem, what);
    if (spoil_ == Spoil::doubled_score && rank() == 0 && rows.dim() == 1 && out.numel() > 0) {
      out.set(0, 2 * out.get(0));
    }
    return out;
  }
  Tensor from_experts(const Tensor& rows, const ExpertExchange& ex, MemoryTracker& mem,
                      std::string_view what) const override {
    return inner_.from_experts(rows, ex, mem, what);
  }

 private:
  AllToAllDispatcher inner_;
  Spoil spoil_;
};

struct Case {
  AbsorbScores absorb;
  bool weight_grads;
  Variant variant;
  bool remat_full;  // replay every region (the dispatch's collective included)
  DType dtype;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(c.absorb == AbsorbScores::on ? "absorbed" : "postcombine") +
         (c.weight_grads ? "_full" : "_dxonly") + "_" + testing::variant_name(c.variant) +
         (c.remat_full ? "_rematfull" : "") + "_" + std::string(dtype_name(c.dtype));
}

// What one rank checks: its micro-batch's results and its experts' gradients.
struct RankResults {
  std::map<std::string, Tensor> per_batch;  // out, dx, router grads
  std::map<std::string, Tensor> experts;    // this rank's experts' grads
  MoeRegionCounters counters;
  CommStats comm;
};

class EpLayer : public ::testing::TestWithParam<Case> {
 protected:
  // Micro-batch r of the job (the same on every rank): inputs and loss projection.
  static std::unique_ptr<LayerRig> rig(const Case& c, int r) {
    auto rig = std::make_unique<LayerRig>(RouterKind::softmax_topk, c.variant, c.dtype,
                                          /*seed=*/7, KernelSet::cpu, LayerRig::T + 3 * r);
    // Same weights for every micro-batch: only x and P differ.
    Rng rng(100 + uint64_t(r));
    rig->x_TD = testing::random_tensor({LayerRig::T + 3 * r, LayerRig::D}, c.dtype, rng);
    rig->P_TD = testing::random_tensor({LayerRig::T + 3 * r, LayerRig::D}, c.dtype, rng);
    return rig;
  }

  static MoeLayerConfig layer_config(const Case& c) {
    MoeLayerConfig lc;
    lc.absorb_scores = c.absorb;
    lc.keep = c.remat_full ? MoeRegionKeep::none() : MoeRegionKeep::all();
    return lc;
  }

  // One rank alone runs every micro-batch in order.
  static RankResults one_rank(const Case& c, int P, int me) {
    auto base = rig(c, 0);
    LocalDispatcher local;
    MoeLayer layer(layer_config(c), base->router.get(), local, *base->host);
    base->zero_grad();
    RankResults out;
    for (int r = 0; r < P; ++r) {
      auto mb = rig(c, r);
      base->router->zero_grad();
      MoeSaved saved;
      Tensor y = layer.forward(mb->x_TD, saved, c.weight_grads);
      Tensor dx = Tensor::empty(mb->x_TD.shape(), c.dtype);
      layer.backward(dx, mb->P_TD, saved);
      if (r != me) continue;
      out.per_batch["out"] = y;
      out.per_batch["dx"] = dx;
      out.per_batch["router.weight"] = base->router->grad("weight").clone();
    }
    if (c.weight_grads) {
      const int64_t El = kE / P;
      for (const auto& n : base->experts->param_names()) {
        out.experts[n] = base->experts->grad(n).rows(El * me, El * (me + 1)).clone();
      }
    }
    return out;
  }

  // The job's ranks together, each on its own micro-batch.
  static RankResults expert_parallel(const Case& c, Spoil spoil) {
    Comm& comm = ep_comm();
    const int P = comm.size(), me = comm.rank();
    const int64_t El = kE / P;
    auto mine = rig(c, me);
    auto local = expert_slice(*mine->experts, El * me, El);
    HostExperts host(*local);
    SpoiledDispatcher dispatcher(comm, spoil);
    MoeLayer layer(layer_config(c), mine->router.get(), dispatcher, host);
    mine->zero_grad();
    local->zero_grad();
    const CommStats before = comm.stats();
    MoeSaved saved;
    Tensor y = layer.forward(mine->x_TD, saved, c.weight_grads);
    Tensor dx = Tensor::empty(mine->x_TD.shape(), c.dtype);
    layer.backward(dx, mine->P_TD, saved);
    RankResults out;
    out.comm = comm.stats().since(before);
    out.counters = layer.counters();
    out.per_batch["out"] = y;
    out.per_batch["dx"] = dx;
    out.per_batch["router.weight"] = mine->router->grad("weight").clone();
    if (c.weight_grads) {
      for (const auto& n : local->param_names()) out.experts[n] = local->grad(n).clone();
    }
    return out;
  }

  static ::testing::AssertionResult same(const RankResults& got, const RankResults& want) {
    auto r = testing::all_results_bitwise(got.per_batch, want.per_batch);
    if (!r) return r;
    return testing::all_results_bitwise(got.experts, want.experts);
  }
};

TEST_P(EpLayer, EqualsOneRankBitwise) {
  const Case& c = GetParam();
  Comm& comm = ep_comm();
  ASSERT_EQ(kE % comm.size(), 0);
  const RankResults want = one_rank(c, comm.size(), comm.rank());
  const RankResults got = expert_parallel(c, Spoil::none);
  EXPECT_TRUE(same(got, want)) << "rank " << comm.rank();
  EXPECT_TRUE(all_ranks(bool(same(got, want))));
}

TEST_P(EpLayer, ReplaysTheDispatchCollectiveNeverTheCombine) {
  const Case& c = GetParam();
  const RankResults got = expert_parallel(c, Spoil::none);
  const MoeRegionCounters& k = got.counters;
  EXPECT_EQ(k.exchange_count(MoeRegion::combine), 1);
  EXPECT_EQ(k.exchange_replay_count(MoeRegion::combine), 0);
  EXPECT_EQ(k.backward_exchange_count(MoeRegion::combine), 1);
  EXPECT_EQ(k.backward_exchange_count(MoeRegion::dispatch), 1);
  // `full` replays the dispatch (its rows are not kept), so its collective
  // runs once more in backward, per layer; keeping everything never replays.
  const int64_t replays = c.remat_full ? 1 : 0;
  EXPECT_EQ(k.exchange_replay_count(MoeRegion::dispatch), replays);
  EXPECT_EQ(k.exchange_count(MoeRegion::dispatch), 1 + replays);
  EXPECT_EQ(k.replay_count(MoeRegion::dispatch), replays);
  EXPECT_EQ(k.replay_count(MoeRegion::combine), 0);
  // The transport saw exactly these all-to-alls: counts, rows, [scores], y
  // forward; dy, [replayed rows], dx, [d scores] backward.
  const int64_t scores = c.absorb == AbsorbScores::on ? 1 : 0;
  EXPECT_EQ(got.comm[CommOp::alltoallv].calls, 3 + scores + 2 + replays + scores);
}

TEST_P(EpLayer, TheCheckCatchesADoubledScoreAndARowOnTheWrongRank) {
  const Case& c = GetParam();
  Comm& comm = ep_comm();
  const RankResults want = one_rank(c, comm.size(), comm.rank());
  if (c.absorb == AbsorbScores::on) {
    // Scores travel only when absorbed (post-combine applies them at home).
    const RankResults doubled = expert_parallel(c, Spoil::doubled_score);
    EXPECT_FALSE(all_ranks(bool(same(doubled, want)))) << "a doubled score went unnoticed";
  }
  const RankResults misrouted = expert_parallel(c, Spoil::wrong_rank);
  EXPECT_FALSE(all_ranks(bool(same(misrouted, want)))) << "a misrouted row went unnoticed";
}

INSTANTIATE_TEST_SUITE_P(
    Ep, EpLayer,
    ::testing::Values(Case{AbsorbScores::on, true, Variant::swiglu, false, DType::f64},
                      Case{AbsorbScores::off, true, Variant::swiglu, false, DType::f64},
                      Case{AbsorbScores::on, false, Variant::swiglu, false, DType::f32},
                      Case{AbsorbScores::on, true, Variant::swiglu, true, DType::f32},
                      Case{AbsorbScores::off, true, Variant::swiglu, true, DType::f64},
                      Case{AbsorbScores::on, true, Variant::gpt_oss_bias, false, DType::f32},
                      Case{AbsorbScores::off, true, Variant::post_norm, true, DType::f64}),
    case_name);

}  // namespace
}  // namespace tiermoe
