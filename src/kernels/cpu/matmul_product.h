#pragma once
// Internal to the cpu:: matmuls: the one GEMM every linear-layer product
// (matmul.cpp) and mixed-width product (matmul_mixed.cpp) runs.
#include "onednn.h"
#include "tiermoe/core/tensor.h"

namespace tiermoe::cpu {

// C_MN (+)= A_MK . B_KN over the tensors as stored (the shape's flags say
// which is transposed; its dtypes are taken from the tensors). B has A's
// dtype, or is narrower where product_reads_narrower_b says so.
void product(Tensor& c, const Tensor& a, const Tensor& b, onednn::GemmShape s);

// Whether product() takes a B stored in `stored` for a `compute` product: a
// bf16 B in an f32 product on TierMoE's own GEMM, widened (exactly) while it
// is packed, so the result is bitwise the product on the widened B.
bool product_reads_narrower_b(DType compute, DType stored);

}  // namespace tiermoe::cpu
