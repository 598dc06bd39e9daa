#pragma once
// A MoE layer's shared expert: a dense SwiGLU MLP that every token passes
// through beside its routed experts, added onto their combine. Qwen2-MoE
// scales it per token by a learned sigmoid gate (Qwen2MoeSparseMoeBlock);
// GLM-4.5 (DeepSeek-V3's shared_experts) adds it as it is:
//
//   m = mlp(x)                          mlp.shared_expert.{gate,up,down}_proj
//   s = sigmoid(x . g^T)                mlp.shared_expert_gate.weight g [1, D]; gated only
//   y += s * m  (or y += m)             onto the routed experts' combine
//
// The gate and the product run in the accumulation dtype and round once,
// as torch rounds sigmoid(z) * m; the sum onto y rounds once more.
//
// It is the remat region `shared` (remat/policy.h): under a policy that
// replays it, forward keeps only its input x (the MoE block's, held anyway)
// and backward runs the forward again from it first, to the same bits.
#include <memory>
#include <string>
#include <vector>

#include "tiermoe/core/tensor.h"
#include "tiermoe/model/dense_mlp.h"
#include "tiermoe/model/linear.h"
#include "tiermoe/model/lora.h"

namespace tiermoe {

struct SharedExpertSaved {
  DenseMlpSaved mlp;  // only mlp.x_TD when the region replays
  Tensor m_TD;  // the MLP's output, before the gate (the gate's gradient); gated only
  Tensor s_T;   // sigmoid(x . g^T) per token, accumulation dtype; gated only
  void clear() { *this = SharedExpertSaved(); }
};

class SharedExpert {
 public:
  SharedExpert(int64_t hidden, int64_t intermediate, bool gated, DType compute,
               MatrixAlloc alloc = MatrixAlloc::zeroed);

  // y_TD += sigmoid(x_TD g^T) * mlp(x_TD), or mlp(x_TD) ungated.
  void forward_add(Tensor& y_TD, const Tensor& x_TD, SharedExpertSaved& saved) const;
  // dx_TD += d/dx of the above; parameter grads +=.
  void backward_add(Tensor& dx_TD, const Tensor& dy_TD, const SharedExpertSaved& saved);
  // Whether forward keeps what backward reads (else backward replays it).
  void set_keep(bool keep) { keep_ = keep; }
  bool keeps() const { return keep_; }

  DenseMlp& mlp() { return mlp_; }
  bool gated() const { return gated_; }
  Weight& gate() { return gate_.weight; }  // (1, D); undefined value when ungated

  // LoRA on the MLP's gate/up/down_proj (never the scalar gate); `prefix`
  // is the module path ("model.layers.0.mlp.shared_expert.").
  void enable_lora(const LoraConfig& config, const std::string& prefix, Rng& rng) {
    mlp_.enable_lora(config, prefix, rng);
  }
  std::vector<LoraAdapter*> lora_adapters() { return mlp_.lora_adapters(); }

 private:
  // The MLP's output m and, gated, the gate s into `saved`; returns m.
  Tensor run(const Tensor& x_TD, SharedExpertSaved& saved) const;

  DenseMlp mlp_;
  bool gated_;
  bool keep_ = true;
  Linear gate_;  // (1, D), no bias; gated only
};

}  // namespace tiermoe
