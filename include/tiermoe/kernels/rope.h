#pragma once
// Rotary position embedding, rotate-half form (Hugging Face Llama/Qwen3: not
// interleaved, element i pairs with i + P/2); ref:: and cpu:: twins.
//
//   inv_freq_i = theta^(-2i/P)             i = 0 .. P/2-1
//   ang        = pos * inv_freq, cos/sin of cat(ang, ang)  -> tables [R, P]
//   y          = x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x2, x1)
//
// Tables are computed in f32 (f64 in f64 runs) from the positions and then
// cast to the activation dtype, as HF does. x is [..., H, P] whose leading
// dimensions flatten to the R rows of the tables (e.g. [B, T, H, P] with one
// position per (b, t)); the same tables serve q and k. Partial rotary
// (GLM-4.5's partial_rotary_factor): tables of width Pr < P, built with Pr
// in place of P above, rotate each head's first Pr values and pass the rest
// through unchanged.
//
// Rounding: each elementwise step rounds to the activation dtype, as HF's
// eager bf16 code does (x*cos, rotate_half(x)*sin, then their sum), so bf16
// results match HF bit for bit given the same tables. f32 and f64 round at
// the same points, which there is plain f32/f64 arithmetic. Backward is the
// transpose rotation, dx = dy * cos - rotate_half(dy * sin), rounded the
// same way.
#include <cstdint>
#include <span>

#include "tiermoe/core/tensor.h"

namespace tiermoe {

#define TIERMOE_ROPE_DECLS                                                                        \
  /* cos_RP, sin_RP (dtype of the activations) for positions pos_R */                             \
  void rope_tables(Tensor& cos_RP, Tensor& sin_RP, std::span<const int32_t> pos_R, double theta); \
  /* the same from given frequencies inv_freq [P/2] (YaRN's), each entry times scale */           \
  void rope_tables_scaled(Tensor& cos_RP, Tensor& sin_RP, std::span<const int32_t> pos_R,         \
                          std::span<const double> inv_freq, double scale);                        \
  /* y = x * cos + rotate_half(x) * sin; y may alias x */                                         \
  void rope_forward(Tensor& y, const Tensor& x, const Tensor& cos_RP, const Tensor& sin_RP);      \
  /* dx (+)= dy * cos - rotate_half(dy * sin); dx may alias dy */                                 \
  void rope_backward(Tensor& dx, const Tensor& dy, const Tensor& cos_RP, const Tensor& sin_RP,    \
                     bool accumulate = false);

namespace ref {
TIERMOE_ROPE_DECLS
}
namespace cpu {
TIERMOE_ROPE_DECLS
}

#undef TIERMOE_ROPE_DECLS

}  // namespace tiermoe
