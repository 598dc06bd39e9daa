#pragma once
// TieredExperts: one MoE layer's experts across the host and a device at the
// same time (docs/architecture.md, "The device tier"). Resident (hot) experts keep their
// weights in device memory; their rows (already expert-major) go up in
// bucket-sized launches of a compiled graph, zero-padded to the bucket with
// score 0, and their outputs come back straight into the layer's row buffers.
// The other experts run on the host kernels while the device works.
//
// Every row computes the same bits on either tier (the device runs
// moe/expert_math.h's functions; weight gradients follow its block rule), so
// the placement changes speed, never results. A device fault during a call
// sends that call's device rows to the host and the layer stays on the host
// until the next step (begin_step()).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tiermoe/moe/executor.h"
#include "tiermoe/moe/expert_math.h"
#include "tiermoe/moe/experts.h"
#include "tiermoe/tier/cost_model.h"
#include "tiermoe/tier/device.h"

namespace tiermoe {

// The smallest bucket holding `rows` (rows <= the largest bucket).
int64_t bucket_for(const std::vector<int64_t>& buckets, int64_t rows);

// The device staging of cost_model.h's workspace_layout at the largest
// bucket, kWorkspaceSets times over, allocated once and shared by every
// layer (layers run one at a time). Successive launches take the sets in
// turn. Rows past a launch's count are zeroed on the device before it runs.
class TierWorkspace {
 public:
  TierWorkspace(Device& device, const ExpertShape& shape, int64_t max_rows);
  ~TierWorkspace();
  TierWorkspace(const TierWorkspace&) = delete;
  TierWorkspace& operator=(const TierWorkspace&) = delete;

  // The first G rows of a slot (x_GD, y_GD, dx_GD, h_G2F, a_GF, score_G,
  // dscore_G; the backward's dy goes in y_GD) of set `set`.
  DeviceTensor slot(std::string_view name, int64_t G, int64_t set) const;
  // A set's decode scratch of quantized experts (w13_FD, w2_DF), when the
  // shape it was made for has a quant layout (decodes()).
  DeviceTensor decoded(std::string_view name, int64_t set) const;
  bool decodes() const { return has_decode_slots_; }
  size_t bytes() const { return size_t(kWorkspaceSets) * layout_.bytes; }
  int64_t max_rows() const { return max_rows_; }

 private:
  Device* device_;
  int64_t max_rows_;
  // Slot `name` of set `set`, whole.
  DeviceTensor in_set(std::string_view name, int64_t set) const;

  WorkspaceLayout layout_;
  bool has_decode_slots_ = false;
  DeviceBuffer buffer_;
};

// What one layer did since the last take_stats().
struct TierLayerStats {
  int64_t rows = 0;          // routed rows through forward (replays not counted)
  int64_t device_rows = 0;   // of which computed on the device
  int64_t padded_rows = 0;   // zero rows added to fill buckets, all launches
  int64_t device_calls = 0;  // graph launches
  size_t bytes_up = 0, bytes_down = 0;  // activations; weight moves are the tier's
  double host_s = 0;         // the host's share of the experts (wall)
  double wait_s = 0;         // then waiting for the device
  double device_s = 0;       // the device stream busy (compute + transfers)
  double transfer_s = 0;     // of which transfers
  int64_t faults = 0;        // calls whose device rows went to the host after a fault
  void add(const TierLayerStats& o);
  double hot_fraction() const { return rows ? double(device_rows) / double(rows) : 0.0; }
};

class TieredExperts final : public ExpertExecutor {
 public:
  // `experts` (host weights, grads, the adapter) and `host` (its host
  // executor) must outlive this; the workspace and device too.
  TieredExperts(GroupedExperts& experts, HostExperts& host, Device& device,
                TierWorkspace& workspace, std::vector<int64_t> buckets);
  ~TieredExperts() override;
  TieredExperts(const TieredExperts&) = delete;
  TieredExperts& operator=(const TieredExperts&) = delete;

  std::string name() const override { return "tiered:" + experts_->name(); }
  int64_t num_experts() const override { return experts_->config().num_experts; }
  int64_t hidden() const override { return experts_->config().hidden; }
  DType dtype() const override { return experts_->dtype(); }
  bool has_output_postprocess() const override { return experts_->has_output_postprocess(); }
  ExpertAdapted adapted() const override { return host_->adapted(); }

  void forward(Tensor& y_ND, const Tensor& x_ND, const std::vector<int64_t>& offset_E,
               const Tensor& score_N, SavedTensors& saved, const ExpertSaves& keep) override;
  void replay(SavedTensors& saved, const Tensor& x_ND, const std::vector<int64_t>& offset_E,
              const Tensor& score_N, const ExpertStages& stages) override;
  void backward(Tensor& dx_ND, Tensor& dscore_N, const Tensor& dy_ND,
                const std::vector<int64_t>& offset_E, const Tensor& score_N,
                const SavedTensors& saved, bool weight_grads, bool adapter_grads) override;

  // Whether these experts can run on the device at all: the device graphs
  // carry no LoRA adapter and no output postprocess (those stay on the host).
  bool device_capable() const;
  // Makes exactly the flagged experts resident: frees the others, allocates
  // and uploads the new ones (with weight-gradient sums when `with_grads`).
  // Returns the weight bytes uploaded. DeviceOutOfMemory propagates with the
  // experts that did fit kept resident.
  size_t set_resident(const std::vector<uint8_t>& resident_E, bool with_grads);
  std::vector<uint8_t> resident() const;  // per expert, from what the device holds
  int64_t resident_count() const;
  size_t device_bytes() const;  // weights and sums held on the device
  // Re-uploads every resident expert's weights (after an optimizer step);
  // returns the bytes. Waits for the device.
  size_t upload_weights();
  // Host threads while the device runs (0: unchanged), so a CPU device and
  // the host do not oversubscribe the cores.
  void set_host_threads(int threads) { host_threads_ = threads; }
  // Called with each forward's rows per expert (the routing profile).
  void set_observer(std::function<void(const std::vector<int64_t>&)> fn) { observe_ = std::move(fn); }
  // A new step: the device is tried again after a fault.
  void begin_step() { host_only_ = false; }
  bool host_only() const { return host_only_; }
  TierLayerStats take_stats();

 private:
  struct ExpertBlock;
  struct Resident;
  ExpertBlock alloc_block(DType dt, BufferUsage usage, const std::string& what);
  void free_block(ExpertBlock& block);
  // Expert e's host weights into its device block.
  void upload_expert(int64_t e, const ExpertBlock& on_device);
  // A quantized matrix into its image's window (staged when its rows are
  // strided; the copy lives until upload_expert's sync).
  void upload_image(const DeviceTensor& dst, const QuantMatrix& q);
  // The weight slots of a launch: the block's tensors, or its images and
  // the workspace set's decode scratch.
  void set_weights(GraphArgs& args, const ExpertBlock& w, int64_t set) const;
  // The layouts the device holds these experts in: the experts' own when
  // they are quantized and the device holds quantized weights, else none.
  std::optional<ExpertQuant> held_quant() const;
  // Experts whose rows this call sends to the device (empty: none).
  std::vector<uint8_t> device_experts(const std::vector<int64_t>& offset_E) const;
  // Expert e's forward rows on the device; the products whose destination
  // is given (row buffers of all N rows) come back into it.
  void enqueue_forward(int64_t e, Tensor* y_ND, Tensor* h_N2F, Tensor* a_NF, const Tensor& x_ND,
                       const std::vector<int64_t>& offset_E, const Tensor& score_N);
  void enqueue_backward(int64_t e, Tensor& dx_ND, Tensor& dscore_N, const Tensor& dy_ND,
                        const std::vector<int64_t>& offset_E, const Tensor& score_N,
                        const SavedTensors& saved, ExpertGrads* sums_host);
  // Uploads `m` host rows into the first rows of a G-row slot and zeroes the rest.
  void stage_rows(const DeviceTensor& slot, const Tensor& rows);
  GraphKey key(GraphKind kind, int64_t G, bool absorb) const;
  // Runs host work with host_threads_ while the device runs; times it.
  void run_host(const std::function<void()>& fn);
  // Waits for the device; on a DeviceError marks the layer host-only for the
  // step and returns false.
  bool sync_device();
  void begin_counters();
  void end_counters();

  GroupedExperts* experts_;
  HostExperts* host_;
  Device* device_;
  TierWorkspace* ws_;
  std::vector<int64_t> buckets_;
  // Per expert, what the device holds of it; null when not resident (the one
  // record of residency: resident() and DeviceTier::placement() read it).
  std::vector<std::unique_ptr<Resident>> state_;
  int host_threads_ = 0;
  bool host_only_ = false;
  std::function<void(const std::vector<int64_t>&)> observe_;
  TierLayerStats stats_;
  DeviceCounters before_;
  std::vector<std::vector<char>> staged_images_;
  int64_t launches_ = 0;  // picks the workspace set of the next launch
};

}  // namespace tiermoe
