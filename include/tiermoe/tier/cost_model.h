#pragma once
// The cost model the placement planner predicts step times with: pure
// formulas over an expert's shape and a few throughputs, and the start-up
// measurements that fill those throughputs in (measured, not guessed:
// docs/architecture.md). All times are seconds per training step for one expert's rows.
//
// Work per routed row (GEMM flops, 2 per multiply-add; the activation is
// noise next to them):
//   forward    6 D F    (h = x W13^T: 2 * 2F * D; y = a W2^T: 2 * D * F)
//   bwd dx     6 D F    (da = dy W2: 2 D F; dx = dh W13: 2 * 2F * D)
//   bwd dW     6 D F    (dW2 = dy^T a: 2 D F; dW13 = dh^T x: 2 * 2F * D)
// lora (frozen experts) runs forward + bwd dx = 12 D F per row; full
// fine-tuning adds dW, 18 D F.
//
// Host:   rows * flops_per_row / host_flops_per_s (linear: no padding).
// Device: an expert's M rows run as bucket launches (padded_launches), each a
//         forward and a backward graph over G rows:
//           sum over launches G * flops_per_row / device_flops_per_s + 2 launch_s
// Link:   rows cross the link (in the compute dtype; scores in the score
//         dtype: fp32, f64 in f64 runs); only the M real rows travel, the
//         device zero-fills the padding:
//           forward   up x (D) [, score if absorbed]; down y (D), h (2F), a (F)
//           backward  up dy (D), h (2F) [, a if absorbed or full] [, score if
//                     absorbed] [, x (D) if full]; down dx (D) [, dscore if absorbed]
//         Full fine-tuning also moves each resident expert once per step
//         (sync): its dW sums down (grad dtype) and the AdamW-updated weights
//         up (compute dtype).
// Memory: a resident expert holds its weights (w13 2F x D, w2 D x F, biases
//         b13 2F and b2 D) in the compute dtype, or W13 and W2 as quantized
//         images (kernels/quant_image.h), and for full fine-tuning their
//         gradient sums in the grad dtype (bytes_resident). Each device
//         holds one workspace (kWorkspaceSets x workspace_layout), shared by
//         all layers; with quantized experts it has room to decode one.
//         Uploads move what is held: quantized experts' stored bytes.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tiermoe/core/dtype.h"
#include "tiermoe/core/progress_meter.h"
#include "tiermoe/core/tensor.h"
#include "tiermoe/moe/experts.h"
#include "tiermoe/tier/device.h"

namespace tiermoe {

// What the cost of one expert depends on.
struct ExpertShape {
  int64_t D = 0, F = 0;
  DType dtype = DType::bf16;  // weights and activations
  bool bias = false;          // b13, b2 (GPT-OSS)
  ExpertActivation activation = ExpertActivation::swiglu;
  bool absorb = true;  // router scores go to the device (score_G, dscore_G)
  // Frozen experts held at their stored width on a device that can
  // (Device::holds_quantized); lora only.
  std::optional<ExpertQuant> quant;
  DType grad_dtype() const { return dtype == DType::f64 ? DType::f64 : DType::f32; }
  DType score_dtype() const { return dtype == DType::f64 ? DType::f64 : DType::f32; }
  int64_t param_count() const { return 3 * D * F + (bias ? 2 * F + D : 0); }
};

// lora: frozen experts (device runs expert_fwd + expert_bwd_dx).
// full: trainable experts (expert_fwd + expert_bwd_dx_dw, per-step sync).
enum class TrainMode { lora, full };
std::string_view train_mode_name(TrainMode m);                           // "lora", "full"
TrainMode parse_train_mode(std::string_view s, std::string_view where);  // Error otherwise

struct CostModel {
  double host_flops_per_s = 0;
  double device_flops_per_s = 0;
  double link_bytes_per_s = 0;  // each way
  double launch_s = 0;          // fixed cost of one graph launch
  // Ascending bucket sizes G; the largest is the most rows one launch takes
  // (ExpertsConfig::dw_row_block, so device dW sums match the host's).
  std::vector<int64_t> buckets;
  int64_t largest_bucket() const { return buckets.back(); }
  void validate(std::string_view where) const;  // positive finite rates, ascending buckets
};

// 16, 24, 32, 48, ..., largest: doublings from `smallest` with the 1.5x
// midpoint between each pair (padding wastes at most a third of a launch,
// not half); largest always last.
std::vector<int64_t> bucket_ladder(int64_t smallest = 16, int64_t largest = 512);

// The graph key of one expert graph at G rows.
GraphKey expert_graph_key(GraphKind kind, const ExpertShape& s, int64_t G);
GraphKind backward_graph_kind(TrainMode m);  // expert_bwd_dx or expert_bwd_dx_dw

double flops_per_row(const ExpertShape& s, TrainMode m);  // 12 D F or 18 D F
// The buckets a group of M rows launches at: floor(M / Gmax) launches of
// Gmax, then the smallest bucket >= the remainder (none when it is 0).
std::vector<int64_t> padded_launches(int64_t M, const std::vector<int64_t>& buckets);

double host_seconds(double rows, const ExpertShape& s, TrainMode m, const CostModel& c);
double device_seconds(int64_t M, const ExpertShape& s, TrainMode m, const CostModel& c);
// Bytes one row moves each way over forward + backward, and their time.
size_t row_bytes_up(const ExpertShape& s, TrainMode m);
size_t row_bytes_down(const ExpertShape& s, TrainMode m);
double transfer_seconds(double rows, const ExpertShape& s, TrainMode m, const CostModel& c);
// Full fine-tuning's per-step weight sync of one resident expert (0 for lora).
size_t sync_bytes(const ExpertShape& s, TrainMode m);
double sync_seconds(const ExpertShape& s, TrainMode m, const CostModel& c);
// Bytes uploaded to make an expert resident (its weights).
size_t bytes_upload(const ExpertShape& s);
// Device memory one resident expert holds.
size_t bytes_resident(const ExpertShape& s, TrainMode m);

// The device workspace: one launch's staging at G rows, allocated ONCE per
// device and shared by every layer and expert. Slots (compute dtype unless
// noted), each at an offset aligned to kWorkspaceAlign bytes:
//   x_GD      (G, D)   forward input; bwd dW input
//   y_GD      (G, D)   forward output; the backward's dy_GD goes here too
//   dx_GD     (G, D)   backward output
//   h_G2F     (G, 2F)  forward output, backward input
//   a_GF      (G, F)   forward output, backward input
//   w13_FD    (2F, D)  quantized experts only: their decoded W13
//   w2_DF     (D, F)   and W2 (graph scratch, whatever G)
//   score_G   (G)      score dtype, absorbed only
//   dscore_G  (G)      score dtype, absorbed only
struct WorkspaceSlot {
  std::string name;
  Shape shape;
  DType dtype;
  size_t offset = 0;  // bytes from the start of the workspace
  size_t bytes = 0;
};
struct WorkspaceLayout {
  std::vector<WorkspaceSlot> slots;
  size_t bytes = 0;                                        // allocate this much for all slots
  const WorkspaceSlot& slot(std::string_view name) const;  // Error when absent
  // The slot as a graph argument inside `buffer` (allocated with `bytes`).
  DeviceTensor tensor(const DeviceBuffer& buffer, std::string_view name) const;
};
inline constexpr size_t kWorkspaceAlign = 256;
WorkspaceLayout workspace_layout(const ExpertShape& s, int64_t G);
// Successive launches take turns over this many sets of the slots, so a
// device that overlaps its work (the CUDA device) stages one launch's rows
// into one set while the launch before it still computes from the other.
inline constexpr int64_t kWorkspaceSets = 2;
// The workspace's device memory: kWorkspaceSets layouts at G rows.
size_t bytes_workspace(const ExpertShape& s, int64_t G);

// Start-up measurements (a second or less at Qwen3 shapes; warm-up excluded).
// Host: GroupedExperts forward_rows + backward_rows (dW in full mode) over a
// few experts of 256 rows each, on `threads` threads; returns flops/s.
double measure_host(const ExpertShape& s, TrainMode m, int threads);
// Host memory measure_host allocates (overflow-checked: an Error when the
// shape's sizes overflow).
size_t measure_host_bytes(const ExpertShape& s, TrainMode m);
// Device: the mode's two graphs at the largest bucket (flops/s), a few MB up
// and down (link bytes/s), and the forward graph at a tiny shape and the
// smallest bucket (launch_s). Frees everything it allocated.
struct DeviceRates {
  double flops_per_s = 0, link_bytes_per_s = 0, launch_s = 0;
};
// `meter` (may be null) advances by one after each of its kDeviceMeasures
// measurements (launch, throughput, link).
inline constexpr int kDeviceMeasures = 3;
DeviceRates measure_device(Device& dev, const ExpertShape& s, TrainMode m,
                           const std::vector<int64_t>& buckets, ProgressMeter* meter = nullptr);
// Device memory measure_device needs.
size_t measure_device_bytes(const ExpertShape& s, TrainMode m, const std::vector<int64_t>& buckets);

}  // namespace tiermoe
