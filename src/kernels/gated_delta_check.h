#pragma once
// Internal to the gated delta rule's twins (kernels/gated_delta.h): the
// input checks both make, with the same messages, and where a document starts.
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>

#include "attention_options.h"
#include "nn_common.h"
#include "tiermoe/kernels/gated_delta.h"

namespace tiermoe::nn_detail {

struct DeltaDims {
  int64_t B, T, Hk, Dk, Hv, Dv;
  int64_t group() const { return Hv / Hk; }  // value heads per q/k head
};

inline DeltaDims check_gated_delta(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& g, const Tensor& beta,
                                   const GatedDeltaOptions& opt, std::string_view op) {
  check_rank(q, 4, "q", op, "q is [B, T, Hk, Dk]");
  check_same_shape_as(k, q, "k", "q", op);
  check_same_dtype_as(k, q, "k", "q", op);
  check_rank(v, 4, "v", op, "v is [B, T, Hv, Dv]");
  check_same_dtype_as(v, q, "v", "q", op);
  const DeltaDims d{q.size(0), q.size(1), q.size(2), q.size(3), v.size(2), v.size(3)};
  TIERMOE_CHECK(v.size(0) == d.B && v.size(1) == d.T && d.Hk > 0 && d.Hv % d.Hk == 0,
                detail::str_of("v is ", v.str(), " for q ", q.str()), std::string(op),
                "v shares q's batch and length, and its heads are a multiple of q's (each q/k "
                "head serves Hv / Hk value heads)");
  for (const auto& [t, name] : {std::pair{&g, "g"}, std::pair{&beta, "beta"}}) {
    check_shape_is(*t, {d.B, d.T, d.Hv}, name, op);
    check_dtype_is(*t, acc_dtype(q.dtype()), name, op,
                   "the decay and the write strength are f32 (f64 in f64 runs)");
  }
  check_doc_starts(opt.doc_start_BT, d.B, d.T, op);
  return d;
}

// Forward's checks: check_gated_delta's, and out shaped and typed as v.
inline DeltaDims check_gated_delta_forward(const Tensor& out, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const Tensor& g, const Tensor& beta,
                                           const GatedDeltaOptions& opt) {
  const char* op = "gated_delta_forward";
  const DeltaDims d = check_gated_delta(q, k, v, g, beta, opt, op);
  check_same_shape_as(out, v, "out", "v", op);
  check_same_dtype_as(out, v, "out", "v", op);
  return d;
}

// Each gradient shaped and typed as its input (dout as v).
inline void check_gated_delta_grads(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                    const Tensor& dg, const Tensor& dbeta, const Tensor& dout,
                                    const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& g, const Tensor& beta, std::string_view op) {
  const std::tuple<const Tensor&, const Tensor&, const char*> like[] = {
      {dq, q, "dq"},     {dk, k, "dk"}, {dv, v, "dv"},
      {dout, v, "dout"}, {dg, g, "dg"}, {dbeta, beta, "dbeta"}};
  for (const auto& [t, input, name] : like) {
    check_same_shape_as(t, input, name, "its input", op);
    check_same_dtype_as(t, input, name, "its input", op);
  }
}

inline bool starts_document(const GatedDeltaOptions& opt, int64_t b, int64_t t, int64_t T) {
  return t == 0 || (!opt.doc_start_BT.empty() && opt.doc_start_BT[size_t(b * T + t)] == t);
}

}  // namespace tiermoe::nn_detail
