#include "tiermoe/model/self_attention.h"

#include "tiermoe/kernels/rope.h"
#include "tiermoe/model/attention_block.h"
#include "tiermoe/model/gated_deltanet.h"
#include "tiermoe/model/mla_attention.h"

namespace tiermoe {

RopeTables RopeTables::make(int64_t B, int64_t T, const RopeFrequencies& freqs, DType dtype,
                            std::span<const int32_t> positions_BT,
                            std::span<const int32_t> doc_start_BT) {
  RopeTables r;
  r.B = B;
  r.T = T;
  r.doc_start_BT.assign(doc_start_BT.begin(), doc_start_BT.end());
  std::vector<int32_t> pos(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) pos[size_t(b * T + t)] = int32_t(t);
  }
  if (!positions_BT.empty()) {
    TIERMOE_CHECK(int64_t(positions_BT.size()) == B * T,
                  detail::str_of(positions_BT.size(), " positions for B ", B, " x T ", T),
                  "RopeTables", "pass one position per token, or none");
    pos.assign(positions_BT.begin(), positions_BT.end());
  }
  r.cos_RP = Tensor::empty({B * T, freqs.rotary_dim}, dtype);
  r.sin_RP = Tensor::empty({B * T, freqs.rotary_dim}, dtype);
  if (freqs.inv_freq.empty()) {
    cpu::rope_tables(r.cos_RP, r.sin_RP, pos, freqs.theta);
  } else {
    cpu::rope_tables_scaled(r.cos_RP, r.sin_RP, pos, freqs.inv_freq, freqs.attention_factor);
  }
  return r;
}

std::unique_ptr<SelfAttention> make_self_attention(const ModelConfig& c, int64_t layer,
                                                   DType compute, MatrixAlloc alloc) {
  if (c.mla()) return std::make_unique<MlaAttention>(c, compute, alloc);
  if (c.linear_attention(layer)) {
    const GatedDeltaNetDims dims{.hidden = c.hidden_size,
                                 .key_heads = c.linear_num_key_heads,
                                 .key_dim = c.linear_key_head_dim,
                                 .value_heads = c.linear_num_value_heads,
                                 .value_dim = c.linear_value_head_dim,
                                 .conv_kernel = c.linear_conv_kernel_dim,
                                 .norm_eps = c.rms_norm_eps};
    return std::make_unique<GatedDeltaNet>(dims, compute, alloc);
  }
  return std::make_unique<AttentionBlock>(c, layer, compute, alloc);
}

}  // namespace tiermoe
