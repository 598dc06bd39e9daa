#include "expert_graphs.h"

#include <utility>

#include "tiermoe/kernels/quant_image.h"
#include "tiermoe/moe/expert_math.h"

namespace tiermoe {

namespace {

// Router scores and their gradient travel in fp32 (f64 in f64 runs), as the
// router writes them; weight-gradient sums in the grad dtype (the same).
DType score_dtype(DType d) { return d == DType::f64 ? DType::f64 : DType::f32; }

// device.h's slot list for `key`, inputs then outputs.
std::vector<GraphSlot> make_slots(const GraphKey& key) {
  const int64_t D = key.D, F = key.F, G = key.G;
  const DType t = key.dtype, s = score_dtype(key.dtype);
  using L = ExpertLaunch;
  std::vector<GraphSlot> v;
  auto add = [&](std::string_view name, Tensor L::*field, Shape shape, DType dtype) {
    v.push_back(GraphSlot{name, field, std::move(shape), dtype});
  };
  auto weights = [&] {
    if (key.quant) {
      add("w13_q", &L::w13_q, {quant_image(key.quant->w13, 2 * F, D).words()}, DType::f32);
      add("w2_q", &L::w2_q, {quant_image(key.quant->w2, D, F).words()}, DType::f32);
    }
    add("w13_FD", &L::w13_FD, {2 * F, D}, t);
    add("w2_DF", &L::w2_DF, {D, F}, t);
  };
  auto biases = [&] {
    if (!key.bias) return;
    add("b13_F", &L::b13_F, {2 * F}, t);
    add("b2_D", &L::b2_D, {D}, t);
  };
  if (key.kind == GraphKind::expert_fwd) {
    add("x_GD", &L::x_GD, {G, D}, t);
    weights();
    if (key.absorb) add("score_G", &L::score_G, {G}, s);
    biases();
    add("y_GD", &L::y_GD, {G, D}, t);
    add("h_G2F", &L::h_G2F, {G, 2 * F}, t);
    add("a_GF", &L::a_GF, {G, F}, t);
    return v;
  }
  const bool dw = key.kind == GraphKind::expert_bwd_dx_dw;
  add("dy_GD", &L::dy_GD, {G, D}, t);
  add("h_G2F", &L::h_G2F, {G, 2 * F}, t);
  weights();
  if (dw) add("x_GD", &L::x_GD, {G, D}, t);
  if (dw || key.absorb) add("a_GF", &L::a_GF, {G, F}, t);
  if (key.absorb) add("score_G", &L::score_G, {G}, s);
  biases();
  add("dx_GD", &L::dx_GD, {G, D}, t);
  if (key.absorb) add("dscore_G", &L::dscore_G, {G}, s);
  if (dw) {
    add("dw13_FD", &L::dw13_FD, {2 * F, D}, s);
    add("dw2_DF", &L::dw2_DF, {D, F}, s);
    if (key.bias) {
      add("db13_F", &L::db13_F, {2 * F}, s);
      add("db2_D", &L::db2_D, {D}, s);
    }
  }
  return v;
}

}  // namespace

void validate_graph_key(const GraphKey& key) {
  // Checked field by field before anything calls key.str(), which can only
  // name valid enumerators.
  const auto kind = unsigned(key.kind), dtype = unsigned(key.dtype);
  const auto act = unsigned(key.activation);
  const std::string raw = detail::str_of("kind ", kind, " D", key.D, " F", key.F, " G", key.G,
                                         " dtype ", dtype, " activation ", act);
  TIERMOE_CHECK(kind <= unsigned(GraphKind::expert_bwd_dx_dw), "graph key has no such kind: " + raw,
                "GraphKey", "kinds are expert_fwd, expert_bwd_dx, expert_bwd_dx_dw");
  TIERMOE_CHECK(dtype <= unsigned(DType::bf16), "graph key has no such dtype: " + raw, "GraphKey",
                "graphs compute in f64, f32 or bf16");
  TIERMOE_CHECK(act <= unsigned(ExpertActivation::gpt_oss),
                "graph key has no such activation: " + raw, "GraphKey",
                "activations are swiglu and gpt_oss");
  TIERMOE_CHECK(!key.quant || key.kind != GraphKind::expert_bwd_dx_dw,
                "graph key with quantized weights computes weight gradients: " + raw, "GraphKey",
                "quantized experts are frozen: expert_fwd and expert_bwd_dx only");
  TIERMOE_CHECK(!key.quant || (key.quant->w13.group >= 1 && key.quant->w13.row_group >= 1 &&
                               key.quant->w2.group >= 1 && key.quant->w2.row_group >= 1),
                "graph key with a quant layout of group or row group < 1: " + raw, "GraphKey",
                "take the layouts from the experts' matrices (GroupedExperts::quant)");
  TIERMOE_CHECK(key.D >= 1 && key.F >= 1 && key.G >= 1,
                "graph key needs D, F, G >= 1: " + key.str(), "GraphKey",
                "G is the bucket's row count; D and F the expert's sizes");
}

ExpertGraph::ExpertGraph(const GraphKey& key, KernelSet kernels) : Graph(key) {
  validate_graph_key(key);
  name_ = key.str();
  cfg_.num_experts = 1;
  cfg_.hidden = key.D;
  cfg_.ffn = key.F;
  cfg_.activation = key.activation;
  cfg_.gpt_oss = key.gpt_oss;
  cfg_.bias = key.bias;
  cfg_.kernels = kernels;
  cfg_.dw_row_block = key.G;
  cfg_.validate(name_);
  slots_ = make_slots(key);
}

bool ExpertGraph::takes_int(std::string_view name) const {
  return name == "sum_started" && key().kind == GraphKind::expert_bwd_dx_dw;
}

void ExpertGraph::run(ExpertLaunch t) const {
  if (const auto& q = key().quant) {
    dequantize_into(quant_image_view(q->w13, 2 * key().F, key().D, t.w13_q.raw()), t.w13_FD);
    dequantize_into(quant_image_view(q->w2, key().D, key().F, t.w2_q.raw()), t.w2_DF);
  }
  const ExpertMath m{&cfg_, key().dtype, ExpertWeights{t.w13_FD, t.w2_DF, t.b13_F, t.b2_D, {}},
                     /*adapter=*/nullptr, /*expert=*/0};
  ExpertRowsActs acts;
  acts.h_M2F = t.h_G2F;
  acts.a_MF = t.a_GF;
  switch (key().kind) {
    case GraphKind::expert_fwd:
      expert_forward(m, t.y_GD, acts, t.x_GD, t.score_G);
      return;
    case GraphKind::expert_bwd_dx:
      expert_backward(m, t.dx_GD, t.dscore_G, t.dy_GD, acts, t.score_G, nullptr, false);
      return;
    case GraphKind::expert_bwd_dx_dw: {
      acts.x_MD = t.x_GD;
      ExpertGrads sum{t.dw13_FD, t.dw2_DF, t.db13_F, t.db2_D, {}};
      expert_backward(m, t.dx_GD, t.dscore_G, t.dy_GD, acts, t.score_G, &sum, t.sum_started);
      return;
    }
  }
}

void ExpertGraph::warm_up() const {
  // A started sum (the first launch of an expert) writes its GEMMs straight
  // into the sums; a continued one computes the same shapes into scratch, so
  // one run creates every primitive either needs.
  ExpertLaunch t;
  for (const GraphSlot& s : slots_) t.*s.tensor = Tensor::zeros(s.shape, s.dtype);
  run(std::move(t));
}

}  // namespace tiermoe
