#pragma once
// Argument checks shared by the ref and cpu grouped products
// (kernels/grouped_matmul.h), so both reject the same inputs alike.
#include <span>
#include <string>
#include <vector>

#include "tiermoe/kernels/grouped_matmul.h"

namespace tiermoe::detail {

inline void check_grouped_rows(const std::vector<int64_t>& offset_G, int64_t G, int64_t N,
                               std::span<const uint8_t> skip_G, std::string_view op) {
  bool ok = int64_t(offset_G.size()) == G + 1 && offset_G.front() == 0 && offset_G.back() == N;
  for (size_t g = 0; ok && g + 1 < offset_G.size(); ++g) ok = offset_G[g] <= offset_G[g + 1];
  TIERMOE_CHECK(ok,
                str_of(op, ": offset_G must hold G+1 = ", G + 1,
                       " ascending offsets from 0 to the row count ", N),
                std::string(op), "pass one offset per group of the packed stack, then the total");
  TIERMOE_CHECK(skip_G.empty() || int64_t(skip_G.size()) == G,
                str_of(op, ": skip_G holds ", skip_G.size(), " flags for ", G, " groups"),
                std::string(op), "pass one flag per group, or none");
}

inline void check_packed(const PackedWeights& w, PackUse use_a, PackUse use_b, std::string_view op) {
  TIERMOE_CHECK(w.packed(), str_of(op, ": the weights are not packed"), std::string(op),
                "call PackedWeights::pack first");
  TIERMOE_CHECK(w.use() == use_a || w.use() == use_b,
                str_of(op, ": the weights are packed for another product"), std::string(op),
                "pack them with the PackUse this product takes");
}

inline void check_rows_of(const Tensor& t, int64_t N, int64_t cols, DType dt, std::string_view op,
                          std::string_view name) {
  TIERMOE_CHECK(t.defined() && t.dim() == 2 && t.size(0) == N && t.size(1) == cols &&
                    t.dtype() == dt,
                str_of(op, ": ", name, " must be [", N, ", ", cols, "] ", dtype_name(dt), ", got ",
                       t.defined() ? t.str() : std::string("undefined")),
                std::string(op), "allocate it with the rows of the input and the product's width");
}

inline void check_scores(const Tensor& score_N, int64_t N, std::string_view op) {
  if (!score_N.defined()) return;
  TIERMOE_CHECK(score_N.dim() == 1 && score_N.size(0) == N &&
                    (score_N.dtype() == DType::f32 || score_N.dtype() == DType::f64),
                str_of(op, ": score_N must be [", N, "] f32 or f64, got ", score_N.str()),
                std::string(op), "one router score per input row");
}

// Every check of grouped_matmul's arguments (kernels/grouped_matmul.h).
inline void check_grouped_matmul(const Tensor& y_NO, const Tensor& x_NI,
                                 const std::vector<int64_t>& offset_G, const PackedWeights& w,
                                 const Tensor& bias_GO, const Tensor& score_N,
                                 std::span<const uint8_t> skip_G) {
  const char* op = "grouped_matmul";
  check_packed(w, PackUse::forward, PackUse::backward_dx, op);
  const bool dx = w.use() == PackUse::backward_dx;
  const int64_t N = x_NI.defined() ? x_NI.size(0) : 0;
  const int64_t O = dx ? w.in_features() : w.out_features();
  const DType dt = w.dtype();
  check_rows_of(x_NI, N, dx ? w.out_features() : w.in_features(), dt, op, "x_NI");
  check_rows_of(y_NO, N, O, dt, op, "y_NO");
  check_grouped_rows(offset_G, w.groups(), N, skip_G, op);
  check_scores(score_N, N, op);
  TIERMOE_CHECK(!bias_GO.defined() || (!dx && bias_GO.dim() == 2 && bias_GO.size(0) == w.groups() &&
                                       bias_GO.size(1) == O && bias_GO.dtype() == dt),
                str_of(op, ": bias must be [G, O] = [", w.groups(), ", ", O, "] ", dtype_name(dt),
                       " on a forward product"),
                op, "pass the stacked biases, or none for dx");
}

// Every check of grouped_glu_forward's arguments.
inline void check_grouped_glu_forward(const Tensor& h_N2F, const Tensor& a_NF, const Tensor& as_NF,
                                      const Tensor& x_ND, const std::vector<int64_t>& offset_G,
                                      const PackedWeights& w13, const Tensor& b13_G2F,
                                      const Tensor& score_N, std::span<const uint8_t> skip_G) {
  const char* op = "grouped_glu_forward";
  check_packed(w13, PackUse::forward_glu, PackUse::forward_glu, op);
  const int64_t N = x_ND.defined() ? x_ND.size(0) : 0, F = w13.out_features() / 2;
  const DType dt = w13.dtype();
  check_rows_of(x_ND, N, w13.in_features(), dt, op, "x_ND");
  check_rows_of(h_N2F, N, 2 * F, dt, op, "h_N2F");
  check_rows_of(a_NF, N, F, dt, op, "a_NF");
  if (score_N.defined()) check_rows_of(as_NF, N, F, dt, op, "as_NF");
  check_grouped_rows(offset_G, w13.groups(), N, skip_G, op);
  check_scores(score_N, N, op);
  TIERMOE_CHECK(!b13_G2F.defined() || (b13_G2F.dim() == 2 && b13_G2F.size(0) == w13.groups() &&
                                       b13_G2F.size(1) == 2 * F && b13_G2F.dtype() == dt),
                str_of(op, ": b13 must be [G, 2F] = [", w13.groups(), ", ", 2 * F, "] ",
                       dtype_name(dt)),
                op, "pass the stacked W13 biases, or none");
}

// Score m of an f32 or f64 score vector, as the f32 math reads it.
inline float score_f32(const Tensor& s, int64_t m) {
  return s.dtype() == DType::f64 ? float(s.data<double>()[m]) : s.data<float>()[m];
}

}  // namespace tiermoe::detail
