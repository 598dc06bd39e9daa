#pragma once
// Grouped products over a stack of G weights: rows [offset_G[g],
// offset_G[g+1]) of the input go through weight g (a MoE layer's experts, one
// group each; nothing here knows about experts). The weights are packed once
// into the microkernel's layout (PackedWeights) and every group's work items,
// (group, block of rows, run of column blocks), run in one parallel loop in
// a fixed order: group-major, then column runs, then row blocks. The fused
// GLU product also applies a gated activation and a per-row score in its
// epilogue, on each finished block of f32 sums, so the W13 output never makes
// a second trip through memory before the activation.
//
// Every output row goes through the instruction sequence of cpu::matmul_* on
// the same ISA (kernels/cpu/gemm/microkernel.h: fixed blocking, fixed kc,
// partial blocks padded with zeros), so a row's bits do not depend on its
// group's row count, on the other groups, on the threads or on whether the
// weights were packed ahead: grouped == per-group cpu::matmul_* followed by
// the same elementwise steps, bit for bit (tests/kernels/test_grouped_matmul.cpp).
//
// ref:: twins (plain loops over ref::matmul_*, the oracle) take the same
// arguments and read the weights the PackedWeights was packed from (widened
// to the products' dtype where they are stored narrower).
//
// Dtypes: f32 or bf16 (f64 runs stay on the per-expert path); outputs and
// bias in the input dtype, scores f32 (or f64), math in f32, one rounding to
// the dtype at each store, as moe/expert_ops.h does step by step.
#include <cstdint>
#include <span>
#include <vector>

#include "tiermoe/core/tensor.h"
#include "tiermoe/kernels/cpu_isa.h"
#include "tiermoe/kernels/quant.h"

namespace tiermoe {

// The gated activation of a GLU product h [M, 2F] -> a [M, F]:
//   swiglu   gate columns [0, F), up [F, 2F): a = silu(gate) * up
//   clamped  GPT-OSS, interleaved (2i gate, 2i+1 up): gate = min(gate, limit),
//            up = clamp(up, -limit, limit), a = (up + 1) * gate * sigmoid(alpha * gate)
enum class GluKind : uint8_t { swiglu, clamped };
struct Glu {
  GluKind kind = GluKind::swiglu;
  double alpha = 1.702, limit = 7.0;
};

// What a stack w_GNK ([G, N, K], nn.Linear's [out, in]) is packed for:
//   forward      y = x w^T (B = w^T, K x N)
//   forward_glu  the same with the swiglu layout's columns regrouped so each
//                block of columns holds matching gate and up columns (the
//                clamped layout's interleaved pairs already are)
//   backward_dx  dx = dy w (B = w, N x K)
enum class PackUse : uint8_t { forward, forward_glu, backward_dx };

class PackedWeights {
 public:
  // Packs every weight of w_GNK (f32 or bf16, contiguous, [G, N, K]) for
  // `use` on the process's ISA (cpu_isa(); not onednn), for products in its
  // dtype. The buffer is kept and reused when a re-pack needs no more bytes.
  // Keeps views of the weights, which the ref twins read; the caller
  // re-packs after changing them.
  void pack(const Tensor& w_GNK, PackUse use, Glu glu = {});
  // The same from one contiguous [N, K] weight per group (experts bound one
  // at a time, as a checkpoint's per-expert tensors are mapped), for
  // products in dt: each weight stored as dt, or as bf16 for an f32 product
  // (a mapped bf16 checkpoint in an f32 run), widened while packing, so the
  // products are those of the widened weights.
  void pack(std::vector<Tensor> w_G_NK, DType dt, PackUse use, Glu glu = {});
  // Binds weights stored quantized (kernels/quant.h), one [N, K] matrix per
  // group, for products in dt: nothing is packed ahead. Each product expands
  // the panels it needs from the codes while packing them, into what pack()
  // would have written from dequantize(w, f32), so the products are those of
  // the dequantized weights, bit for bit, and only the stored bytes stay
  // resident. A group's rows go through the panels in tall blocks
  // (gemm::tall_rows), so a panel is expanded once per such block.
  void bind_quantized(std::vector<QuantMatrix> w_G_NK, DType dt, PackUse use, Glu glu = {});
  bool quantized() const { return !quant_.empty(); }
  const QuantMatrix& quant_source(int64_t g) const { return quant_[size_t(g)]; }
  // Whether pack() takes weights stored as `stored` for products in dt: as
  // they are, or widened while packing (bf16 into f32).
  static bool reads(DType stored, DType dt) {
    return stored == dt || (dt == DType::f32 && stored == DType::bf16);
  }
  // The bytes pack() allocates for a [G, N, K] stack of dtype dt (f32 or
  // bf16) on the process's ISA, without packing (memory plans).
  static int64_t storage_bytes(int64_t G, int64_t N, int64_t K, DType dt, PackUse use,
                               Glu glu = {});
  bool packed() const { return storage_.defined() || quantized(); }
  CpuIsa isa() const { return isa_; }
  PackUse use() const { return use_; }
  const Glu& glu() const { return glu_; }
  DType dtype() const { return dtype_; }  // of the products' inputs and outputs
  // [N, K] as stored (undefined when quantized: quant_source).
  const Tensor& source(int64_t g) const { return sources_[size_t(g)]; }
  int64_t groups() const { return G_; }
  int64_t out_features() const { return N_; }  // N
  int64_t in_features() const { return K_; }   // K
  int64_t bytes() const { return storage_.defined() ? G_ * group_bytes_ : 0; }

  // For the cpu twin: the product's C columns as packed (forward_glu pads
  // each block's gate and up halves to whole panels) and one group's panels
  // (null when quantized).
  int64_t packed_cols() const { return packed_cols_; }
  const void* group_data(int64_t g) const;

 private:
  void set_shape(int64_t G, int64_t N, int64_t K, DType dt, PackUse use, Glu glu);

  std::vector<Tensor> sources_;
  std::vector<QuantMatrix> quant_;
  Tensor storage_;
  DType dtype_ = DType::f32;
  CpuIsa isa_ = CpuIsa::avx2;
  PackUse use_ = PackUse::forward;
  Glu glu_;
  int64_t G_ = 0, N_ = 0, K_ = 0, packed_cols_ = 0, group_bytes_ = 0;
};

// skip_G: one flag per group (or empty for none); a skipped group's rows are
// left untouched (another tier computes them).
#define TIERMOE_GROUPED_MATMUL_DECLS                                                                \
  /* forward use: y_NO[rows of g] = x_NI[rows of g] . w_g^T, then (bias_GO */                       \
  /* defined) y = T(y + b_g), or with score_N y = T(y + score * b_g); */                            \
  /* backward_dx use: y_NO = x_NI . w_g with O = K, I = N (no bias). */                             \
  void grouped_matmul(Tensor& y_NO, const Tensor& x_NI, const std::vector<int64_t>& offset_G,     \
                      const PackedWeights& w, const Tensor& bias_GO = Tensor(),                     \
                      const Tensor& score_N = Tensor(), std::span<const uint8_t> skip_G = {});     \
  /* forward_glu use: h_N2F = x_ND . w_g^T (+ b13_G2F as T(h + b)), */                              \
  /* a_NF = T(glu(h)), and with score_N as_NF = T(a * score) (as_NF */                              \
  /* unused without). */                                                                            \
  void grouped_glu_forward(Tensor& h_N2F, Tensor& a_NF, Tensor& as_NF, const Tensor& x_ND,         \
                           const std::vector<int64_t>& offset_G, const PackedWeights& w13,          \
                           const Tensor& b13_G2F, const Tensor& score_N,                            \
                           std::span<const uint8_t> skip_G = {});

namespace ref {
TIERMOE_GROUPED_MATMUL_DECLS
}
namespace cpu {
TIERMOE_GROUPED_MATMUL_DECLS
}

#undef TIERMOE_GROUPED_MATMUL_DECLS

}  // namespace tiermoe
