#pragma once
// The LM head and the cross-entropy loss over chunks of tokens, so the
// [N, V] logits and their gradient are never whole (vocab 151,936 at N = 2048
// tokens would be 1.2 GB each in f32):
//
//   for each chunk of C token rows:
//     logits_CV  = n_CD . W_VD^T                    (W at its stored width: matmul_mixed.h)
//     ce        += cross-entropy of the chunk's counted targets / count
//     dlogits_CV = d ce / d logits_CV               (with grad)
//     dn_CD      = dlogits_CV . W_VD                 dW_VD += dlogits_CV^T . n_CD (trainable W)
//
// `count` is the number of counted targets (!= -100) of the whole batch, so
// every chunk's gradient carries 1 / count and the loss is the mean over the
// batch (Hugging Face's), whatever the chunk size. The chunk's logits and
// gradient live only while it runs: what the head keeps is dn [N, D], which
// backward reads. Results equal the unchunked head (one chunk) to rounding:
// the per-chunk means are recombined, and each row's logits are one product.
#include <cstdint>
#include <span>

#include "tiermoe/core/tensor.h"

namespace tiermoe {

// The default chunk: 512 token rows (about 311 MB of f32 logits at V = 151,936,
// and again for their gradient); 0 means one chunk of every row.
inline constexpr int64_t kDefaultLmHeadChunk = 512;

// Returns the mean cross-entropy over the counted targets. With dn_ND defined
// ([N, D], compute dtype) writes d loss / d n into it, and when dw_VD is
// defined (grad dtype) accumulates (+=) the head's weight gradient.
double lm_head_loss(Tensor& dn_ND, Tensor& dw_VD, const Tensor& n_ND, const Tensor& w_VD,
                    std::span<const int32_t> targets_N, int64_t chunk);

// Counted targets (!= -100).
int64_t count_targets(std::span<const int32_t> targets_N);

}  // namespace tiermoe
