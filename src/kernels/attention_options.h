#pragma once
// Internal to the attention kernels: the checks of AttentionOptions and what
// they mean for one query row (kernels/attention.h, "Options"): the first
// key it sees and its sink logit.
#include <cmath>
#include <cstdint>
#include <span>
#include <string>

#include "nn_common.h"
#include "tiermoe/core/error.h"
#include "tiermoe/kernels/attention.h"

namespace tiermoe::nn_detail {

// Throws unless doc_start_BT is empty or B*T contiguous document starts.
inline void check_doc_starts(std::span<const int32_t> doc_start_BT, int64_t B, int64_t T,
                             std::string_view op) {
  if (doc_start_BT.empty()) return;
  using detail::str_of;
  TIERMOE_CHECK(
      int64_t(doc_start_BT.size()) == B * T,
      str_of("doc_start_BT holds ", doc_start_BT.size(), " entries for B ", B, " x T ", T),
      std::string(op), "pass one document start per token, or none");
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int32_t s = doc_start_BT[size_t(b * T + t)];
      const bool ok = t == 0 ? s == 0 : (s == doc_start_BT[size_t(b * T + t - 1)] || s == t);
      TIERMOE_CHECK(ok,
                    str_of("doc_start_BT[", b * T + t, "] = ", s, " (row ", b, ", token ", t,
                           ") is not a contiguous document start"),
                    std::string(op),
                    "a token continues its predecessor's document (same start) or begins one "
                    "(start = its own index); row starts are 0");
    }
  }
}

// Every option against the problem's dims (sinks in q's dtype).
inline void check_attention_options(const AttentionOptions& opt, const AttentionDims& d, DType dt,
                                    std::string_view op) {
  check_doc_starts(opt.doc_start_BT, d.B, d.T, op);
  TIERMOE_CHECK(opt.window >= 0, detail::str_of("sliding window ", opt.window), std::string(op),
                "a window is a positive number of keys, or 0 for none");
  TIERMOE_CHECK(std::isfinite(opt.scale) && opt.scale >= 0,
                detail::str_of("score scale ", opt.scale), std::string(op),
                "a positive scale, or 0 for P^-0.5");
  if (opt.sinks_H) {
    check_shape_is(*opt.sinks_H, {d.Hq}, "sinks_H", op);
    check_dtype_is(*opt.sinks_H, dt, "sinks_H", op, "sinks are in the attention's dtype");
  }
}

// dsinks_H, when given: [Hq] in the grad dtype, and only with sinks.
inline void check_dsinks(const Tensor* dsinks_H, const AttentionOptions& opt,
                         const AttentionDims& d, DType dt, std::string_view op) {
  if (!dsinks_H) return;
  TIERMOE_CHECK(opt.sinks_H != nullptr, "dsinks_H given without sinks", std::string(op),
                "pass sinks_H in the options, or no dsinks_H");
  check_shape_is(*dsinks_H, {d.Hq}, "dsinks_H", op);
  check_dtype_is(*dsinks_H, acc_dtype(dt), "dsinks_H", op,
                 "sink gradients are f32 (f64 in f64 runs)");
}

// The first key query (b, i) sees: its document's first token, raised by the
// window. It never decreases along a row (the kernels' block skipping relies
// on that).
inline int64_t first_key(const AttentionOptions& opt, int64_t b, int64_t T, int64_t i) {
  const int64_t doc = opt.doc_start_BT.empty() ? 0 : opt.doc_start_BT[size_t(b * T + i)];
  return opt.window > 0 ? std::max(doc, i - opt.window + 1) : doc;
}

// The scale on q . k: the option's, else P^-0.5.
inline double score_scale(const AttentionOptions& opt, const AttentionDims& d) {
  return opt.scale != 0 ? opt.scale : 1.0 / std::sqrt(double(d.P));
}

// Head h's sink logit, -inf without sinks (exp(-inf) = 0 adds nothing).
template <class A>
A sink_logit(const AttentionOptions& opt, int64_t h) {
  if (!opt.sinks_H) return A(-INFINITY);
  return visit_dtype(opt.sinks_H->dtype(),
                     [&]<class T>() { return A(load(opt.sinks_H->data<T>()[h])); });
}

}  // namespace tiermoe::nn_detail
