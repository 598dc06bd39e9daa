#include "tiermoe/kernels/embedding.h"

#include "../nn_common.h"

namespace tiermoe::ref {

using namespace nn_detail;

void embedding_forward(Tensor& out_TD, const Tensor& table_VD, std::span<const int32_t> ids_T) {
  check_rank(table_VD, 2, "table_VD", "embedding_forward", "[V, D]");
  int64_t V = table_VD.size(0), D = table_VD.size(1);
  check_embedding(out_TD, "out_TD", D, ids_T, "embedding_forward");
  check_same_dtype_as(out_TD, table_VD, "out_TD", "table_VD", "embedding_forward");
  check_ids(ids_T, V, "ids_T", "embedding_forward", kIdHint);
  visit_dtype(table_VD.dtype(), [&]<class T>() {
    for (size_t t = 0; t < ids_T.size(); ++t) {
      const T* src = table_VD.data<T>() + ids_T[t] * D;
      T* dst = out_TD.data<T>() + int64_t(t) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = src[d];
    }
  });
}

void embedding_backward(Tensor& dtable_VD, const Tensor& dout_TD, std::span<const int32_t> ids_T,
                        bool accumulate) {
  check_rank(dtable_VD, 2, "dtable_VD", "embedding_backward", "[V, D]");
  int64_t V = dtable_VD.size(0), D = dtable_VD.size(1);
  check_embedding(dout_TD, "dout_TD", D, ids_T, "embedding_backward");
  check_dtype_is(dtable_VD, acc_dtype(dout_TD.dtype()), "dtable_VD", "embedding_backward",
                 "the embedding gradient is f32 (f64 in f64 runs)");
  check_ids(ids_T, V, "ids_T", "embedding_backward", kIdHint);
  if (!accumulate) dtable_VD.zero();
  visit_dtype(dout_TD.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    for (size_t t = 0; t < ids_T.size(); ++t) {
      const T* src = dout_TD.data<T>() + int64_t(t) * D;
      A* dst = dtable_VD.data<A>() + ids_T[t] * D;
      for (int64_t d = 0; d < D; ++d) dst[d] += load(src[d]);
    }
  });
}

}  // namespace tiermoe::ref
