#pragma once
// Expanding stored matrices (kernels/quant.h) straight into the bf16-pair
// panels of the vdpbf16ps and AMX microkernels (gemm/microkernel.h,
// BPack::bf16_pairs), without the decode-then-pack round trip: each
// 32-value run of a weight row becomes one vector of 16 bf16 pairs (int4
// and MXFP4 by a 16-entry table lookup, vpermw; int8 and FP8 converted,
// scaled and rounded), and 16 rows' vectors are transposed in registers
// into the panel's rows of columns. AVX-512 BW, in quant_pack_avx512.cpp;
// the bits are those of dequantize_row_bf16 packed by gemm::pack_b.
#include <cstdint>

#include "tiermoe/kernels/quant.h"

namespace tiermoe::cpu {

// Whether pack_pairs handles a forward panel of q over k in
// [k0, k0 + kk) with nr columns: 32-aligned runs of K inside whole scale
// groups, nr a multiple of 16, and a CPU with AVX-512 BW.
bool pairs_apply(const QuantMatrix& q, int64_t k0, int64_t kk, int64_t nr);

// The bf16_pairs panel [kc/2][nr] (dwords) of weight rows [first, first +
// valid) as its columns, k in [k0, k0 + kk), zero past valid and past kk.
void pack_pairs(const QuantMatrix& q, int64_t first, int64_t valid, int64_t k0, int64_t kk,
                       int64_t kc, int64_t nr, void* dst);

// The dx orientation (B = W: weight rows are k, weight columns the panels'
// columns): whether pack_pairs_dx takes the block of columns [j0,
// j0 + width) of q, and the block's panels, one after another
// ([width / nr][kc/2][nr] dwords), over weight rows [k0, k0 + kk), zero
// past kk. Each run of 32 columns of two rows is expanded and interleaved
// into pairs, no transpose.
bool pairs_dx_apply(const QuantMatrix& q, int64_t j0, int64_t width, int64_t nr);
void pack_pairs_dx(const QuantMatrix& q, int64_t k0, int64_t kk, int64_t kc, int64_t j0,
                          int64_t width, int64_t nr, void* dst);

}  // namespace tiermoe::cpu
