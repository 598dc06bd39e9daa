#pragma once
// Internal to src/model: copying a block of columns between two row-major
// matrices (a head's columns of a projection: rows are tokens, or (token,
// head) pairs), optionally reordering rope pairs on the way.
#include <cstdint>

#include "tiermoe/core/error.h"
#include "tiermoe/core/tensor.h"

namespace tiermoe {

// How a block of rope dims is reordered on its way: kept, de-interleaved
// (evens, then odds: the order rope_interleave's attention sees) or
// interleaved back (backward's way to the projection's layout).
enum class Pairs { kept, deinterleave, interleave };

// The source column of destination column j of a `width`-wide block.
inline int64_t source_of(int64_t j, int64_t width, Pairs pairs) {
  const int64_t half = width / 2;
  switch (pairs) {
    case Pairs::kept:
      return j;
    case Pairs::deinterleave:
      return j < half ? 2 * j : 2 * (j - half) + 1;
    case Pairs::interleave:
      return j % 2 == 0 ? j / 2 : half + j / 2;
  }
  __builtin_unreachable();
}

// dst[r, dst_col + j] = src[r, src_col + source_of(j)] for j < width, over the
// rows of dst and src seen as row-major [rows, dst_cols] and [rows, src_cols]
// (a head's columns: rows are (token, head) pairs).
inline void copy_block(Tensor& dst, int64_t dst_cols, int64_t dst_col, const Tensor& src,
                       int64_t src_cols, int64_t src_col, int64_t width,
                       Pairs pairs = Pairs::kept) {
  const int64_t rows = dst.numel() / dst_cols;
  TIERMOE_ASSERT(src.numel() / src_cols == rows && src.dtype() == dst.dtype(), dst.str(), " ",
                 src.str());
  visit_dtype(dst.dtype(), [&]<class T>() {
    T* d = dst.data<T>();
    const T* s = src.data<T>();
    for (int64_t r = 0; r < rows; ++r) {
      T* dr = d + r * dst_cols + dst_col;
      const T* sr = s + r * src_cols + src_col;
      for (int64_t j = 0; j < width; ++j) dr[j] = sr[source_of(j, width, pairs)];
    }
  });
}

}  // namespace tiermoe
