#pragma once
// ExpertPlan: what a GPU runs for one expert graph key (tier/device.h), as
// data: the buffers the graph touches, its GEMMs in BLAS's column-major
// convention and its elementwise steps, in order. The CUDA device captures a
// plan once per key into a CUDA graph (cuBLAS GEMMs, its own kernels for the
// rest) and replays it per launch; the host tests run the very same plan
// through a plain interpreter against the host's expert math, so the GEMM
// shapes, transposes, leading dimensions and the order of the epilogues are
// checked on any machine. The math is moe/expert_math.h's, step by step:
//
//   expert_fwd        h = x w13^T; [h += b13]; a = act(h); [a' = T(a * score)]
//                     y = a' w2^T; [y += score * b2 | y += b2]
//   expert_bwd_dx     [dscore = <dy, b2>]; da = dy w2;
//                     [dscore += <da, a>; da = T(da * score)]; dh = act'(da, h); dx = dh w13
//   expert_bwd_dx_dw  as expert_bwd_dx, plus [db2 (+)= sum score * dy]; [a' = T(a * score)];
//                     dw2 (+)= dy^T a'; [db13 (+)= sum dh]; dw13 (+)= dh^T x
//
// Weight-gradient sums follow the host's block rule (moe/expert_math.h): a
// launch starts them unless ints["sum_started"] is 1; then its products are
// added in f32 (f64 in f64 runs). A GEMM continuing a sum computes
// C = A B + 1 * C: its block's product is summed in f32 and added to the sum
// with one rounding, where the host rounds the product to f32 first and then
// adds; the blocks and their order are the same.
//
// Pointers reach the graph through an argument block in device memory that
// the device writes before each launch (one graph serves every expert and
// every workspace window): per ref its address, then the GEMM scalars one,
// zero and sum_beta (sum_started ? 1 : 0) in the scale dtype, then
// sum_started as an int32. cuBLAS reads its matrix pointers from the block
// (batched GEMM, batch 1) and its alpha/beta from it (device pointer mode).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "stream_hazards.h"
#include "tiermoe/core/tensor.h"
#include "tiermoe/tier/device.h"

namespace tiermoe {

// A buffer the graph touches: one of the key's argument slots (device.h's
// names), or scratch the device keeps per graph.
struct PlanRef {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  bool slot = true;
  size_t scratch_offset = 0;  // scratch only: bytes into the graph's scratch
  bool read = false, written = false;
  size_t bytes() const { return size_t(shape_numel(shape)) * dtype_size(dtype); }
};

// C = op(A) op(B) + beta C, column-major (cuBLAS): C is m x n with leading
// dimension ldc; op(A) is m x k, op(B) k x n. Refs by index into plan.refs.
enum class GemmBeta : uint8_t { zero, sum };  // sum: sum_started ? 1 : 0
struct GemmStep {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int a = -1, b = -1, c = -1;
  int64_t lda = 0, ldb = 0, ldc = 0;
  GemmBeta beta = GemmBeta::zero;
};

// Elementwise steps; -1 is an absent operand. Math in acc dtype (f32, f64 in
// f64 runs), one rounding at each store.
// [h += b13], a = act(h), [w2_in = T(a * score)]; h is read and rewritten.
struct ActForwardStep {
  int h = -1, a = -1, w2_in = -1, b13 = -1, score = -1;
};
// y += b2, or y += score * b2 when absorbed.
struct BiasForwardStep {
  int y = -1, b2 = -1, score = -1;
};
// out_G[m] = <x_GD[m], v_D>, written (dscore's first term: the bias).
struct RowDotStep {
  int out = -1, x = -1, v = -1;
};
// out_C (+)= sum over rows of [score_m *] in_GC[m]: started unless
// sum_started (a weight-gradient sum: db2, db13).
struct ColumnSumStep {
  int out = -1, in = -1, score = -1;
};
// out = T(a * score), per row.
struct ScaleRowsStep {
  int out = -1, a = -1, score = -1;
};
// Absorbed: dscore[m] (+)= <da[m], a[m]> (added when dscore_started, the bias
// having written it) and da' = T(da * score); then dh = act'(da', h).
struct ActBackwardStep {
  int dh = -1, da = -1, h = -1, a = -1, score = -1, dscore = -1;
  bool dscore_started = false;
};
using PlanStep = std::variant<GemmStep, ActForwardStep, BiasForwardStep, RowDotStep, ColumnSumStep,
                              ScaleRowsStep, ActBackwardStep>;

struct ExpertPlan {
  GraphKey key;
  std::vector<PlanRef> refs;  // the key's slots in device.h's order, then scratch
  std::vector<PlanStep> steps;
  size_t scratch_bytes = 0;
  DType scale_dtype = DType::f32;  // GEMM alpha/beta: f64 in f64 graphs
  // The argument block: refs.size() pointers, the scalars one, zero and
  // sum_beta (8 bytes each, the scale dtype at the start), sum_started (int32).
  size_t scalars_offset = 0, sum_started_offset = 0, arg_bytes = 0;

  int ref(std::string_view name) const;  // -1 when absent
  int slots() const;                     // refs before the first scratch ref
  // The block offset of a GEMM's beta.
  size_t beta_offset(GemmBeta b) const { return scalars_offset + (b == GemmBeta::zero ? 8 : 16); }
  size_t one_offset() const { return scalars_offset; }
};

// Error naming the key for keys no graph exists for (tier/expert_graphs.h's rule).
ExpertPlan plan_expert_graph(const GraphKey& key);

// Writes one launch's argument block (plan.arg_bytes) into `block`:
// `slot_addresses` per slot ref (plan.slots() of them, in order), scratch refs
// at `scratch` + their offsets.
void write_arg_block(const ExpertPlan& plan, std::span<const uint64_t> slot_addresses,
                     uint64_t scratch, bool sum_started, void* block);

// One launch's slots checked against the plan: for each slot ref, the
// buffer, byte offset and byte count its argument names.
struct BoundSlot {
  uint64_t buffer = 0;
  size_t offset = 0, bytes = 0;
};
struct BoundLaunch {
  std::vector<BoundSlot> slots;  // plan.slots() of them
  bool sum_started = false;
  std::vector<MemAccess> accesses;  // what the launch reads and writes, for StreamHazards
};
// Error naming the key and the slot for a missing, unknown, repeated or
// misshaped argument, a window outside its buffer (`buffer_bytes` gives a
// live buffer's size, nullopt for an unknown id), an offset that is not a
// multiple of `align` bytes, or a bad integer argument. `where` names the device.
BoundLaunch bind_launch(const ExpertPlan& plan, const GraphArgs& args,
                        const std::function<std::optional<size_t>(uint64_t)>& buffer_bytes,
                        size_t align, std::string_view where);

}  // namespace tiermoe
