#pragma once
// The expert graphs a CpuDevice compiles: what a GraphKey of the expert kinds
// runs, over tensors that view device memory. Quantized weights are decoded
// into their scratch slots first (the values the host's packing expands, so
// the products are the host's bits). The body is moe/expert_math.h,
// the very functions the host's GroupedExperts runs, on an ExpertsConfig
// built from the key (one expert, its dw_row_block = G so that one launch is
// one block of the weight-gradient sum rule). Private to src/tier.
#include <string>
#include <string_view>
#include <vector>

#include "tiermoe/core/tensor.h"
#include "tiermoe/moe/experts.h"
#include "tiermoe/tier/device.h"

namespace tiermoe {

// The tensors of one expert launch, named as device.h's slots; undefined
// where the key has no such slot.
struct ExpertLaunch {
  Tensor x_GD, w13_FD, w2_DF, b13_F, b2_D, score_G;  // forward inputs
  Tensor w13_q, w2_q;  // quantized weights' images; w13_FD, w2_DF then their decoding
  Tensor y_GD, h_G2F, a_GF;                          // forward outputs (h, a: backward inputs)
  Tensor dy_GD, dx_GD, dscore_G;                     // backward
  Tensor dw13_FD, dw2_DF, db13_F, db2_D;             // weight-gradient sums, grad dtype
  bool sum_started = false;                          // continue the sums (ints["sum_started"])
};

// One argument a key requires: its name, where it goes, shape and dtype.
struct GraphSlot {
  std::string_view name;
  Tensor ExpertLaunch::*tensor;
  Shape shape;
  DType dtype;
};

// Error naming the key unless its kind, sizes and dtype are ones a graph exists for.
void validate_graph_key(const GraphKey& key);

class ExpertGraph final : public Graph {
 public:
  // Validates the key; the graph runs `kernels` (cpu:: or ref::).
  ExpertGraph(const GraphKey& key, KernelSet kernels);

  const std::string& name() const { return name_; }  // key().str()
  // The key's arguments, inputs then outputs (device.h's list).
  const std::vector<GraphSlot>& slots() const { return slots_; }
  // Whether ints[name] means anything to this graph ("sum_started", dx_dw only).
  bool takes_int(std::string_view name) const;

  // Runs the graph; the caller checked every slot against slots().
  void run(ExpertLaunch t) const;
  // Runs the graph once on zeros in host memory, so that each kernel it
  // calls (oneDNN primitives for these exact shapes and the calling thread's
  // thread count) exists before the first launch.
  void warm_up() const;

 private:
  ExpertsConfig cfg_;
  std::vector<GraphSlot> slots_;
  std::string name_;
};

}  // namespace tiermoe
