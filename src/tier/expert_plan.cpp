#include "expert_plan.h"

#include <cstring>
#include <utility>

#include "expert_graphs.h"

namespace tiermoe {

namespace {

using detail::str_of;

DType score_dtype(DType d) { return d == DType::f64 ? DType::f64 : DType::f32; }

// Builds refs and steps in device.h's slot order (inputs, then outputs).
class PlanBuilder {
 public:
  explicit PlanBuilder(const GraphKey& key) { plan_.key = key; }

  int input(std::string name, Shape shape, DType dtype) {
    return add(std::move(name), std::move(shape), dtype, true, true, false);
  }
  int output(std::string name, Shape shape, DType dtype) {
    return add(std::move(name), std::move(shape), dtype, true, false, true);
  }
  // A weight-gradient sum: read when continued, written always.
  int sum(std::string name, Shape shape, DType dtype) {
    return add(std::move(name), std::move(shape), dtype, true, true, true);
  }
  int scratch(std::string name, Shape shape, DType dtype) {
    const int r = add(std::move(name), std::move(shape), dtype, false, true, true);
    PlanRef& ref = plan_.refs[size_t(r)];
    ref.scratch_offset = plan_.scratch_bytes;
    plan_.scratch_bytes += (ref.bytes() + kAlign - 1) / kAlign * kAlign;
    return r;
  }
  // Row-major Y_MN = X_MK W_NK^T as a column-major GEMM: Y^T = W X^T.
  void x_wt(int y, int x, int w, int64_t M, int64_t N, int64_t K) {
    step(GemmStep{.trans_a = true,
                  .m = N,
                  .n = M,
                  .k = K,
                  .a = w,
                  .b = x,
                  .c = y,
                  .lda = K,
                  .ldb = K,
                  .ldc = N});
  }
  // Row-major DX_MK = DY_MN W_NK: DX^T = W^T DY^T, W's memory read as W^T.
  void dy_w(int dx, int dy, int w, int64_t M, int64_t N, int64_t K) {
    step(GemmStep{.m = K, .n = M, .k = N, .a = w, .b = dy, .c = dx, .lda = K, .ldb = N, .ldc = K});
  }
  // Row-major DW_NK (+)= DY_MN^T X_MK: DW^T = X^T DY, continued per sum_started.
  void dyt_x(int dw, int dy, int x, int64_t M, int64_t N, int64_t K) {
    step(GemmStep{.trans_b = true,
                  .m = K,
                  .n = N,
                  .k = M,
                  .a = x,
                  .b = dy,
                  .c = dw,
                  .lda = K,
                  .ldb = N,
                  .ldc = K,
                  .beta = GemmBeta::sum});
  }
  void step(PlanStep s) { plan_.steps.push_back(std::move(s)); }

  ExpertPlan finish() {
    ExpertPlan p = std::move(plan_);
    p.scale_dtype = p.key.dtype == DType::f64 ? DType::f64 : DType::f32;
    p.scalars_offset = p.refs.size() * sizeof(uint64_t);
    p.sum_started_offset = p.scalars_offset + 3 * 8;
    p.arg_bytes = p.sum_started_offset + 8;
    return p;
  }

 private:
  static constexpr size_t kAlign = 256;
  int add(std::string name, Shape shape, DType dtype, bool slot, bool read, bool written) {
    PlanRef r;
    r.name = std::move(name), r.shape = std::move(shape), r.dtype = dtype;
    r.slot = slot, r.read = read, r.written = written;
    plan_.refs.push_back(std::move(r));
    return int(plan_.refs.size()) - 1;
  }
  ExpertPlan plan_;
};

ExpertPlan plan_forward(const GraphKey& k) {
  const int64_t D = k.D, F = k.F, G = k.G;
  const DType t = k.dtype, s = score_dtype(t);
  PlanBuilder b(k);
  const int x = b.input("x_GD", {G, D}, t);
  const int w13 = b.input("w13_FD", {2 * F, D}, t);
  const int w2 = b.input("w2_DF", {D, F}, t);
  const int score = k.absorb ? b.input("score_G", {G}, s) : -1;
  const int b13 = k.bias ? b.input("b13_F", {2 * F}, t) : -1;
  const int b2 = k.bias ? b.input("b2_D", {D}, t) : -1;
  const int y = b.output("y_GD", {G, D}, t);
  const int h = b.output("h_G2F", {G, 2 * F}, t);
  const int a = b.output("a_GF", {G, F}, t);
  const int w2_in = k.absorb ? b.scratch("w2_in_GF", {G, F}, t) : a;

  b.x_wt(h, x, w13, G, 2 * F, D);
  b.step(
      ActForwardStep{.h = h, .a = a, .w2_in = k.absorb ? w2_in : -1, .b13 = b13, .score = score});
  b.x_wt(y, w2_in, w2, G, D, F);
  if (k.bias) b.step(BiasForwardStep{.y = y, .b2 = b2, .score = score});
  return b.finish();
}

ExpertPlan plan_backward(const GraphKey& k) {
  const int64_t D = k.D, F = k.F, G = k.G;
  const DType t = k.dtype, s = score_dtype(t);
  const bool dw = k.kind == GraphKind::expert_bwd_dx_dw;
  PlanBuilder b(k);
  const int dy = b.input("dy_GD", {G, D}, t);
  const int h = b.input("h_G2F", {G, 2 * F}, t);
  const int w13 = b.input("w13_FD", {2 * F, D}, t);
  const int w2 = b.input("w2_DF", {D, F}, t);
  const int x = dw ? b.input("x_GD", {G, D}, t) : -1;
  const int a = (dw || k.absorb) ? b.input("a_GF", {G, F}, t) : -1;
  const int score = k.absorb ? b.input("score_G", {G}, s) : -1;
  // W13's bias takes no part in the backward, only in its gradient (db13).
  if (k.bias) b.input("b13_F", {2 * F}, t);
  const int b2 = k.bias ? b.input("b2_D", {D}, t) : -1;
  const int dx = b.output("dx_GD", {G, D}, t);
  const int dscore = k.absorb ? b.output("dscore_G", {G}, s) : -1;
  int dw13 = -1, dw2 = -1, db13 = -1, db2 = -1;
  if (dw) {
    dw13 = b.sum("dw13_FD", {2 * F, D}, s);
    dw2 = b.sum("dw2_DF", {D, F}, s);
    if (k.bias) {
      db13 = b.sum("db13_F", {2 * F}, s);
      db2 = b.sum("db2_D", {D}, s);
    }
  }
  const int da = b.scratch("da_GF", {G, F}, t);
  const int dh = b.scratch("dh_G2F", {G, 2 * F}, t);
  const int w2_in = (dw && k.absorb) ? b.scratch("w2_in_GF", {G, F}, t) : a;

  if (k.bias && k.absorb) b.step(RowDotStep{.out = dscore, .x = dy, .v = b2});
  if (k.bias && dw) b.step(ColumnSumStep{.out = db2, .in = dy, .score = score});
  if (dw && k.absorb) b.step(ScaleRowsStep{.out = w2_in, .a = a, .score = score});
  if (dw) b.dyt_x(dw2, dy, w2_in, G, D, F);
  b.dy_w(da, dy, w2, G, D, F);
  b.step(ActBackwardStep{.dh = dh,
                         .da = da,
                         .h = h,
                         .a = k.absorb ? a : -1,
                         .score = score,
                         .dscore = dscore,
                         .dscore_started = k.bias});
  if (k.bias && dw) b.step(ColumnSumStep{.out = db13, .in = dh});
  if (dw) b.dyt_x(dw13, dh, x, G, 2 * F, D);
  b.dy_w(dx, dh, w13, G, 2 * F, D);
  return b.finish();
}

}  // namespace

int ExpertPlan::ref(std::string_view name) const {
  for (size_t i = 0; i < refs.size(); ++i) {
    if (refs[i].name == name) return int(i);
  }
  return -1;
}

int ExpertPlan::slots() const {
  int n = 0;
  while (n < int(refs.size()) && refs[size_t(n)].slot) ++n;
  return n;
}

ExpertPlan plan_expert_graph(const GraphKey& key) {
  validate_graph_key(key);
  return key.kind == GraphKind::expert_fwd ? plan_forward(key) : plan_backward(key);
}

void write_arg_block(const ExpertPlan& plan, std::span<const uint64_t> slot_addresses,
                     uint64_t scratch, bool sum_started, void* block) {
  TIERMOE_ASSERT(int(slot_addresses.size()) == plan.slots(), "argument block of ",
                 slot_addresses.size(), " slots for ", plan.slots());
  auto* bytes = static_cast<char*>(block);
  std::memset(bytes, 0, plan.arg_bytes);
  for (size_t i = 0; i < plan.refs.size(); ++i) {
    const PlanRef& r = plan.refs[i];
    const uint64_t address = r.slot ? slot_addresses[i] : scratch + r.scratch_offset;
    std::memcpy(bytes + i * sizeof(uint64_t), &address, sizeof address);
  }
  auto scalar = [&](size_t offset, double v) {
    if (plan.scale_dtype == DType::f64) {
      std::memcpy(bytes + offset, &v, sizeof v);
    } else {
      const float f = float(v);
      std::memcpy(bytes + offset, &f, sizeof f);
    }
  };
  scalar(plan.one_offset(), 1.0);
  scalar(plan.beta_offset(GemmBeta::zero), 0.0);
  scalar(plan.beta_offset(GemmBeta::sum), sum_started ? 1.0 : 0.0);
  const int32_t started = sum_started ? 1 : 0;
  std::memcpy(bytes + plan.sum_started_offset, &started, sizeof started);
}

BoundLaunch bind_launch(const ExpertPlan& plan, const GraphArgs& args,
                        const std::function<std::optional<size_t>(uint64_t)>& buffer_bytes,
                        size_t align, std::string_view where) {
  const std::string key = plan.key.str(), w(where);
  const int slots = plan.slots();
  auto slot_list = [&] {
    std::string s;
    for (int i = 0; i < slots; ++i) s += (s.empty() ? "" : ", ") + plan.refs[size_t(i)].name;
    return s;
  };
  for (size_t i = 0; i < args.tensors.size(); ++i) {
    const std::string& name = args.tensors[i].first;
    const int r = plan.ref(name);
    TIERMOE_CHECK(r >= 0 && r < slots, str_of("launch of ", key, ": no slot named '", name, "'"), w,
                  "this key's slots are " + slot_list());
    for (size_t j = 0; j < i; ++j) {
      TIERMOE_CHECK(args.tensors[j].first != name,
                    str_of("launch of ", key, ": slot '", name, "' is given twice"), w,
                    "set each slot once");
    }
  }
  BoundLaunch out;
  for (int i = 0; i < slots; ++i) {
    const PlanRef& s = plan.refs[size_t(i)];
    const DeviceTensor* d = args.find(s.name);
    const std::string want = str_of(dtype_name(s.dtype), shape_str(s.shape));
    TIERMOE_CHECK(d, str_of("launch of ", key, ": missing slot '", s.name, "' (", want, ")"), w,
                  "this key's slots are " + slot_list());
    TIERMOE_CHECK(d->dtype == s.dtype && d->shape == s.shape,
                  str_of("launch of ", key, ": slot '", s.name, "' is ", dtype_name(d->dtype),
                         shape_str(d->shape), ", want ", want),
                  w, "a graph computes exactly G rows of its key's D, F and dtype");
    TIERMOE_CHECK(d->offset % align == 0,
                  str_of("launch of ", key, ": slot '", s.name, "' starts at byte ", d->offset,
                         ", not a multiple of ", align),
                  w, str_of("place graph arguments at ", align, "-byte aligned offsets"));
    const std::optional<size_t> size = buffer_bytes(d->buffer.id);
    TIERMOE_CHECK(size.has_value(),
                  str_of("launch of ", key, ", slot ", s.name, ": buffer #", d->buffer.id,
                         " is not a live buffer of this device"),
                  w,
                  "allocate buffers with this device's alloc() and stop using them after free()");
    TIERMOE_CHECK(d->offset <= *size && s.bytes() <= *size - d->offset,
                  str_of("launch of ", key, ", slot ", s.name, ": ", s.bytes(), " bytes at offset ",
                         d->offset, " do not fit buffer #", d->buffer.id, " (", *size, " bytes)"),
                  w, "keep offset + bytes within the buffer");
    out.slots.push_back(BoundSlot{d->buffer.id, d->offset, s.bytes()});
    out.accesses.push_back(
        MemAccess{d->buffer.id, d->offset, d->offset + s.bytes(), /*write=*/s.written});
  }
  for (const auto& [name, value] : args.ints) {
    TIERMOE_CHECK(name == "sum_started" && plan.key.kind == GraphKind::expert_bwd_dx_dw,
                  str_of("launch of ", key, ": no integer argument named '", name, "'"), w,
                  "only expert_bwd_dx_dw takes one: sum_started");
    TIERMOE_CHECK(value == 0 || value == 1,
                  str_of("launch of ", key, ": sum_started is ", value, ", want 0 or 1"), w,
                  "0 starts the weight-gradient sums, 1 continues them");
    out.sum_started = value == 1;
  }
  return out;
}

}  // namespace tiermoe
