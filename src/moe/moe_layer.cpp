#include "tiermoe/moe/moe_layer.h"

#include <algorithm>
#include <optional>

namespace tiermoe {

std::string_view absorb_scores_name(AbsorbScores a) {
  switch (a) {
    case AbsorbScores::automatic: return "auto";
    case AbsorbScores::on: return "on";
    case AbsorbScores::off: return "off";
  }
  __builtin_unreachable();
}

AbsorbScores parse_absorb_scores(std::string_view s, std::string_view where) {
  if (s == "auto") return AbsorbScores::automatic;
  if (s == "on") return AbsorbScores::on;
  if (s == "off") return AbsorbScores::off;
  throw Error("unknown absorb-scores mode '" + std::string(s) + "'", std::string(where),
              "use auto, on or off");
}

bool resolve_absorb_scores(AbsorbScores mode, bool has_output_postprocess, std::string_view where) {
  TIERMOE_CHECK(!(mode == AbsorbScores::on && has_output_postprocess),
                "absorb_router_scores = on, but the experts carry an output postprocess",
                std::string(where),
                "the postprocess (e.g. a post-expert RMSNorm) is scale-invariant and runs after "
                "W2, so it would erase a score absorbed before W2; use auto or off");
  if (mode == AbsorbScores::automatic) return !has_output_postprocess;
  return mode == AbsorbScores::on;
}

namespace {

// The region a record's tensor belongs to (the table in moe_layer.h).
MoeRegion region_of(const SavedTensors& record, const MoeSaved& saved, const std::string& name) {
  if (&record != &saved.layer) {  // a routed segment's
    if (name == "x_ND") return MoeRegion::dispatch;
    if (name == "h_N2F" || name == "lora_gate_NR" || name == "lora_up_NR") return MoeRegion::w13;
    if (name == "a_NF") return MoeRegion::act;
    return MoeRegion::w2;  // ypre_ND, rstd_N
  }
  if (name == "y_ND") return MoeRegion::combine;
  if (name == "score_N") return saved.absorbed ? MoeRegion::w2 : MoeRegion::combine;
  if (name == "score_S") return MoeRegion::w2;
  return MoeRegion::router;
}

template <class I>
MoeSavedItem index_item(MoeRegion region, std::string name, const std::vector<I>& v) {
  return {region,         std::move(name), sizeof(I) == 4 ? "i32" : "i64", {int64_t(v.size())},
          v.size() * sizeof(I), false};
}

}  // namespace

std::vector<MoeSavedItem> MoeSaved::items() const {
  std::vector<MoeSavedItem> out;
  std::vector<Tensor> seen;
  std::vector<const SavedTensors*> records = {&layer};
  for (const SavedTensors& r : routed) records.push_back(&r);
  for (const SavedTensors* record : records) {
    for (const auto& [name, t] : record->entries()) {
      // The same tensor saved twice counts once; the routed segments' rows
      // are distinct views of one received buffer and count each.
      bool dup = std::any_of(seen.begin(), seen.end(), [&](const Tensor& o) {
        return o.same_storage(t) && o.raw() == t.raw() && o.nbytes() == t.nbytes();
      });
      if (dup) continue;
      seen.push_back(t);
      out.push_back({region_of(*record, *this, name), name, std::string(dtype_name(t.dtype())),
                     t.shape(), t.nbytes(), true});
    }
  }
  if (!layer.entries().empty()) {
    out.push_back(index_item(MoeRegion::dispatch, "token_N", plan.token_N));
    out.push_back(index_item(MoeRegion::dispatch, "slot_N", plan.slot_N));
    out.push_back(index_item(MoeRegion::dispatch, "count_E", plan.count_E));
    out.push_back(index_item(MoeRegion::dispatch, "offset_E", plan.offset_E));
    out.push_back(index_item(MoeRegion::combine, "row_TK", plan.row_TK));
  }
  std::stable_sort(out.begin(), out.end(), [](const MoeSavedItem& a, const MoeSavedItem& b) {
    return a.region < b.region;
  });
  return out;
}

size_t MoeSaved::bytes() const {
  size_t total = 0;
  for (const auto& item : items()) total += item.tracked ? item.bytes : 0;
  return total;
}

void MoeSaved::clear() {
  layer.clear();
  routed.clear();
  routing = Routing();
  plan = DispatchPlan();
  exchange = ExpertExchange();
  remat = MoeRematPlan();
  absorbed = weight_grads = adapter_grads = false;
}

MoeLayer::MoeLayer(MoeLayerConfig cfg, Router* router, const Dispatcher& dispatcher,
                   ExpertExecutor& experts)
    : cfg_(std::move(cfg)), router_(router), dispatcher_(&dispatcher), experts_(&experts) {
  const std::string& where = cfg_.name;
  absorbed_ = resolve_absorb_scores(cfg_.absorb_scores, experts.has_output_postprocess(), where);
  if (router_) {
    const RouterConfig& rc = router_->config();
    rc.validate(where + ".router");
    const int P = dispatcher.ranks();
    TIERMOE_CHECK(rc.num_experts == experts.num_experts() * P && rc.hidden == experts.hidden(),
                  detail::str_of("router has E ", rc.num_experts, ", D ", rc.hidden,
                                 " but the experts have E ", experts.num_experts(),
                                 P > 1 ? detail::str_of(" on each of ", P, " ranks") : "", ", D ",
                                 experts.hidden()),
                  where, "build the router and the experts from the same model config");
    TIERMOE_CHECK(router_->dtype() == experts.dtype(),
                  "router dtype " + std::string(dtype_name(router_->dtype())) +
                      " differs from the experts' " + std::string(dtype_name(experts.dtype())),
                  where, "one compute dtype per run");
  }
}

void MoeLayer::set_options(AbsorbScores absorb, const MoeRegionKeep& keep) {
  absorbed_ = resolve_absorb_scores(absorb, experts_->has_output_postprocess(), cfg_.name);
  cfg_.absorb_scores = absorb;
  cfg_.keep = keep;
}

void MoeLayer::set_experts(ExpertExecutor& experts) {
  TIERMOE_CHECK(experts.num_experts() == experts_->num_experts() &&
                    experts.hidden() == experts_->hidden() && experts.dtype() == experts_->dtype() &&
                    experts.has_output_postprocess() == experts_->has_output_postprocess(),
                "the new expert executor " + experts.name() + " does not match " + experts_->name(),
                cfg_.name, "swap in an executor over the same experts");
  experts_ = &experts;
}

std::string MoeLayer::segment_record_name(int source) const {
  return source == 0 ? cfg_.name + ".experts"
                     : cfg_.name + ".experts.from" + std::to_string(source);
}

Tensor MoeLayer::received_scores(const MoeSaved& saved) const {
  if (!saved.absorbed) return Tensor();
  return saved.layer.has("score_S") ? saved.layer.get("score_S") : saved.layer.get("score_N");
}

MemoryTracker& MoeLayer::tracker() const {
  return cfg_.tracker ? *cfg_.tracker : MemoryTracker::process();
}

Tensor MoeLayer::forward(const Tensor& x_TD, MoeSaved& saved, bool weight_grads,
                         bool adapter_grads) {
  TIERMOE_CHECK(router_ != nullptr, "this layer has no router", cfg_.name,
                "pass the routing to forward(x_TD, routing, saved)");
  Routing routing = timed(times_, StepPart::router, [&] { return router_->forward(x_TD); });
  counters_.count_run(MoeRegion::router);
  return forward(x_TD, std::move(routing), saved, weight_grads, adapter_grads);
}

Tensor MoeLayer::forward(const Tensor& x_TD, Routing routing, MoeSaved& saved, bool weight_grads,
                         bool adapter_grads) {
  const int64_t E = experts_->num_experts() * dispatcher_->ranks(), D = experts_->hidden();
  const DType dt = experts_->dtype();
  TIERMOE_CHECK(x_TD.defined() && x_TD.dim() == 2 && x_TD.size(1) == D,
                "x_TD: expected [T, " + std::to_string(D) + "], got " + x_TD.str(), cfg_.name,
                "the layer input is [tokens, hidden]");
  check_dtype(x_TD, dt, cfg_.name + ": x_TD");
  const int64_t T = x_TD.size(0);
  TIERMOE_CHECK(routing.T == T && routing.K >= 1 && routing.K <= E,
                detail::str_of("routing for T ", routing.T, ", K ", routing.K, " with T ", T,
                               " tokens and E ", E, " experts"),
                cfg_.name, "top_k must be in [1, num_experts] and the routing must be for x_TD");

  MemoryTracker& mem = tracker();
  saved.clear();
  saved.layer = SavedTensors(cfg_.name, mem);
  saved.absorbed = absorbed_;
  saved.weight_grads = weight_grads;
  const ExpertAdapted adapted = adapter_grads ? experts_->adapted() : ExpertAdapted{};
  saved.adapter_grads = adapted.any();
  saved.remat = MoeRematPlan::make(cfg_.keep, absorbed_, weight_grads,
                                   experts_->has_output_postprocess(), adapted);
  std::optional<TimedPart> part(std::in_place, times_, StepPart::dispatch);
  saved.plan = dispatcher_->plan(routing.ids_TK, routing.weights_TK, E);
  const DispatchPlan& plan = saved.plan;

  // dispatch: gather the rows, and with expert parallelism send them (and
  // absorbed scores) to their experts' owners
  Tensor x_ND = Tensor::empty({plan.N, D}, dt, MemTag::activations, mem);
  permute_forward(x_ND, x_TD, plan);
  saved.exchange = dispatcher_->exchange(plan, cfg_.name);
  const ExpertExchange& ex = saved.exchange;
  const bool exchanges = ex.ranks > 1;
  Tensor x_SD = dispatcher_->to_experts(x_ND, ex, mem, cfg_.name + " dispatch");
  Tensor score_S =
      absorbed_ ? dispatcher_->to_experts(plan.score_N, ex, mem, cfg_.name + " dispatch scores")
                : Tensor();
  counters_.count_run(MoeRegion::dispatch);
  if (exchanges) counters_.count_exchange(MoeRegion::dispatch, /*replay=*/false);
  // w13, act, w2: each source rank's rows on their own, in rank order
  Tensor y_SD = Tensor::empty({ex.received_rows(), D}, dt, MemTag::activations, mem);
  part.emplace(times_, StepPart::experts);
  for (int s = 0; s < ex.ranks; ++s) {
    saved.routed.emplace_back(segment_record_name(s), mem);
    const int64_t b = ex.segment_W[size_t(s)], e = ex.segment_W[size_t(s) + 1];
    Tensor y = y_SD.rows(b, e);
    experts_->forward(y, x_SD.rows(b, e), ex.segment_offsets(s),
                      absorbed_ ? score_S.rows(b, e) : Tensor(), saved.routed.back(),
                      saved.remat.routed_keep);
  }
  for (MoeRegion r : {MoeRegion::w13, MoeRegion::act, MoeRegion::w2}) counters_.count_run(r);
  // combine: the results come back, then the only place its body runs
  // (never replayed)
  part.emplace(times_, StepPart::dispatch);
  Tensor y_ND = dispatcher_->from_experts(y_SD, ex, mem, cfg_.name + " combine");
  if (exchanges) counters_.count_exchange(MoeRegion::combine, /*replay=*/false);
  Tensor out_TD = Tensor::empty({T, D}, dt, MemTag::activations, mem);
  combine_forward(out_TD, y_ND, plan, absorbed_);
  counters_.count_run(MoeRegion::combine);

  // Kept for backward: the routing decision and the plan, always. With
  // absorbed scores combine is a plain sum and its backward needs only the
  // permutation, so y_ND dies here (x_ND too, unless the plan keeps it).
  saved.layer.save("x_TD", x_TD);
  if (routing.logits_TE.defined()) saved.layer.save("logits_TE", routing.logits_TE);
  if (routing.probs_TE.defined()) saved.layer.save("probs_TE", routing.probs_TE);
  saved.layer.save("weights_TK", routing.weights_TK);
  saved.layer.save("score_N", plan.score_N);
  if (absorbed_ && exchanges) saved.layer.save("score_S", score_S);
  if (!absorbed_) saved.layer.save("y_ND", y_ND);
  saved.routing = std::move(routing);
  return out_TD;
}

void MoeLayer::replay_routed(std::vector<SavedTensors>& routed, const MoeSaved& saved) {
  const MoeRematPlan& rp = saved.remat;
  const DispatchPlan& plan = saved.plan;
  const ExpertExchange& ex = saved.exchange;
  Tensor x_SD;  // defined when the dispatch is replayed
  if (rp.replay_dispatch) {
    Tensor x_ND = Tensor::empty({plan.N, experts_->hidden()}, experts_->dtype(),
                                MemTag::activations, tracker());
    permute_forward(x_ND, saved.layer.get("x_TD"), plan);
    x_SD = dispatcher_->to_experts(x_ND, ex, tracker(), cfg_.name + " dispatch (replay)");
    counters_.count_replay(MoeRegion::dispatch);
    if (ex.ranks > 1) counters_.count_exchange(MoeRegion::dispatch, /*replay=*/true);
    if (saved.weight_grads || saved.adapter_grads) {
      for (int s = 0; s < ex.ranks; ++s) {
        routed[size_t(s)].save("x_ND",
                               x_SD.rows(ex.segment_W[size_t(s)], ex.segment_W[size_t(s) + 1]));
      }
    }
  }
  if (!rp.routed_replay.any()) return;
  const Tensor score_S = received_scores(saved);
  for (int s = 0; s < ex.ranks; ++s) {
    const int64_t b = ex.segment_W[size_t(s)], e = ex.segment_W[size_t(s) + 1];
    SavedTensors& record = routed[size_t(s)];
    const Tensor x = x_SD.defined()       ? x_SD.rows(b, e)
                     : record.has("x_ND") ? record.get("x_ND")
                                          : Tensor();
    experts_->replay(record, x, ex.segment_offsets(s),
                     score_S.defined() ? score_S.rows(b, e) : Tensor(), rp.routed_replay);
  }
  if (rp.routed_replay.w13) counters_.count_replay(MoeRegion::w13);
  if (rp.routed_replay.act) counters_.count_replay(MoeRegion::act);
  if (rp.routed_replay.w2) counters_.count_replay(MoeRegion::w2);
}

Tensor MoeLayer::backward(Tensor& dx_TD, const Tensor& dout_TD, MoeSaved& saved,
                          const Tensor& dlogits_extra_TE, bool accumulate) {
  const DispatchPlan& plan = saved.plan;
  const int64_t T = plan.T, D = experts_->hidden();
  const DType dt = experts_->dtype();
  TIERMOE_CHECK(saved.layer.has("x_TD"), "backward without a forward", cfg_.name,
                "run forward with this MoeSaved first");
  TIERMOE_CHECK(saved.adapter_grads || !experts_->adapted().any(),
                "backward after a forward that kept no LoRA adapter saves", cfg_.name,
                "run forward with adapter_grads = true when a backward follows");
  check_shape(dout_TD, {T, D}, cfg_.name + ": dout_TD");
  check_dtype(dout_TD, dt, cfg_.name + ": dout_TD");
  check_shape(dx_TD, {T, D}, cfg_.name + ": dx_TD");
  MemoryTracker& mem = tracker();
  const Tensor& score_N = saved.layer.get("score_N");

  const ExpertExchange& ex = saved.exchange;
  const bool exchanges = ex.ranks > 1;
  // combine (post-combine: d score here), then dy to the experts' owners
  std::optional<TimedPart> part(std::in_place, times_, StepPart::dispatch);
  Tensor dy_ND = Tensor::empty({plan.N, D}, dt, MemTag::activations, mem);
  Tensor dscore_N = Tensor::zeros({plan.N}, score_N.dtype(), MemTag::activations, mem);
  combine_backward(dy_ND, dscore_N, dout_TD, saved.absorbed ? Tensor() : saved.layer.get("y_ND"),
                   plan, saved.absorbed);
  Tensor dy_SD = dispatcher_->to_experts(dy_ND, ex, mem, cfg_.name + " combine backward");
  if (exchanges) counters_.count_backward_exchange(MoeRegion::combine);
  // w2, act, w13 (after rebuilding what forward did not keep), each source
  // rank's rows on their own, in rank order: the expert weight gradients
  // add up in the order one rank's micro-batches would add them
  part.emplace(times_, StepPart::experts);
  std::vector<SavedTensors> routed = saved.routed;
  replay_routed(routed, saved);
  const Tensor score_S = received_scores(saved);
  Tensor dx_SD = Tensor::empty({ex.received_rows(), D}, dt, MemTag::activations, mem);
  Tensor dscore_S = saved.absorbed ? Tensor::zeros({ex.received_rows()}, score_N.dtype(),
                                                   MemTag::activations, mem)
                                   : Tensor();
  for (int s = 0; s < ex.ranks; ++s) {
    const int64_t b = ex.segment_W[size_t(s)], e = ex.segment_W[size_t(s) + 1];
    Tensor dx = dx_SD.rows(b, e);
    Tensor ds = saved.absorbed ? dscore_S.rows(b, e) : Tensor();
    experts_->backward(dx, ds, dy_SD.rows(b, e), ex.segment_offsets(s),
                       saved.absorbed ? score_S.rows(b, e) : Tensor(), routed[size_t(s)],
                       saved.weight_grads, saved.adapter_grads);
  }
  // dispatch: dx (and absorbed d scores) back to the rows' source
  part.emplace(times_, StepPart::dispatch);
  Tensor dx_ND = dispatcher_->from_experts(dx_SD, ex, mem, cfg_.name + " dispatch backward");
  if (saved.absorbed) {
    dscore_N =
        dispatcher_->from_experts(dscore_S, ex, mem, cfg_.name + " dispatch backward scores");
  }
  if (exchanges) counters_.count_backward_exchange(MoeRegion::dispatch);
  permute_backward(dx_TD, dx_ND, plan, accumulate);
  // route
  part.emplace(times_, StepPart::router);
  Tensor dweights_TK = Tensor::zeros({T, plan.K}, score_N.dtype(), MemTag::activations, mem);
  scores_backward(dweights_TK, dscore_N, plan);
  if (router_) {
    router_->backward(dx_TD, dweights_TK, dlogits_extra_TE, saved.layer.get("x_TD"),
                      saved.routing, /*accumulate=*/true);
  }
  return dweights_TK;
}

}  // namespace tiermoe
