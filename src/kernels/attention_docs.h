#pragma once
// Internal to the attention kernels: the packed-document layout check and
// the first key a query row may see (kernels/attention.h, "Packed documents").
#include <cstdint>
#include <span>
#include <string>

#include "tiermoe/core/error.h"

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

// The first key query (b, i) sees.
inline int64_t first_key(std::span<const int32_t> doc_start_BT, int64_t b, int64_t T, int64_t i) {
  return doc_start_BT.empty() ? 0 : doc_start_BT[size_t(b * T + i)];
}

}  // namespace tiermoe::nn_detail
