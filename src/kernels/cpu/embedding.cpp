#include "tiermoe/kernels/embedding.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "../nn_common.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe::cpu {

using namespace nn_detail;

void embedding_forward(Tensor& out_TD, const Tensor& table_VD, std::span<const int32_t> ids_T) {
  check_rank(table_VD, 2, "table_VD", "embedding_forward", "[V, D]");
  int64_t V = table_VD.size(0), D = table_VD.size(1);
  check_embedding(out_TD, "out_TD", D, ids_T, "embedding_forward");
  check_same_dtype_as(out_TD, table_VD, "out_TD", "table_VD", "embedding_forward");
  check_ids(ids_T, V, "ids_T", "embedding_forward", kIdHint);
  size_t row_bytes = size_t(D) * dtype_size(table_VD.dtype());
  const char* src = static_cast<const char*>(table_VD.raw());
  char* dst = static_cast<char*>(out_TD.raw());
  parallel_for(int64_t(ids_T.size()), 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      std::memcpy(dst + size_t(t) * row_bytes, src + size_t(ids_T[size_t(t)]) * row_bytes,
                  row_bytes);
    }
  });
}

// Tokens are grouped by id (a stable sort keeps each group in increasing t),
// then each group is owned by one task: no two tasks write the same table
// row, and every row sums its tokens in the order ref:: does.
void embedding_backward(Tensor& dtable_VD, const Tensor& dout_TD, std::span<const int32_t> ids_T,
                        bool accumulate) {
  check_rank(dtable_VD, 2, "dtable_VD", "embedding_backward", "[V, D]");
  int64_t V = dtable_VD.size(0), D = dtable_VD.size(1);
  check_embedding(dout_TD, "dout_TD", D, ids_T, "embedding_backward");
  check_dtype_is(dtable_VD, acc_dtype(dout_TD.dtype()), "dtable_VD", "embedding_backward",
                 "the embedding gradient is f32 (f64 in f64 runs)");
  check_ids(ids_T, V, "ids_T", "embedding_backward", kIdHint);
  if (!accumulate) {
    size_t row_bytes = size_t(D) * dtype_size(dtable_VD.dtype());
    char* base = static_cast<char*>(dtable_VD.raw());
    parallel_for(V, 256, [&](int64_t begin, int64_t end) {
      std::memset(base + size_t(begin) * row_bytes, 0, size_t(end - begin) * row_bytes);
    });
  }
  std::vector<int32_t> order(ids_T.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return ids_T[size_t(a)] < ids_T[size_t(b)]; });
  std::vector<size_t> group_start;  // index into order where each id's group begins
  for (size_t i = 0; i < order.size(); ++i) {
    if (i == 0 || ids_T[size_t(order[i])] != ids_T[size_t(order[i - 1])]) group_start.push_back(i);
  }
  group_start.push_back(order.size());
  int64_t groups = int64_t(group_start.size()) - 1;
  visit_dtype(dout_TD.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const T* dout = dout_TD.data<T>();
    A* dtable = dtable_VD.data<A>();
    parallel_for(groups, 16, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        A* dst = dtable + int64_t(ids_T[size_t(order[group_start[size_t(g)]])]) * D;
        for (size_t i = group_start[size_t(g)]; i < group_start[size_t(g) + 1]; ++i) {
          const T* src = dout + int64_t(order[i]) * D;
          for (int64_t d = 0; d < D; ++d) dst[d] += load(src[d]);
        }
      }
    });
  });
}

}  // namespace tiermoe::cpu
