#pragma once
#include <cstdint>
#include <vector>

namespace tiermoe {

// How the tokens of a batch row belong to documents, for SFT data packed as
// transformers' DataCollatorWithFlattening + position_ids packs it, or padded:
// RoPE positions restart at 0 with each document, no token attends to
// another document's, and padding is left out of the aux loss (HF's masked
// means). Each vector is empty (the default meaning) or has B*T entries.
struct TokenLayout {
  std::vector<int32_t> positions_BT;  // default: 0..T-1 per row
  std::vector<int32_t> doc_start_BT;  // kernels/attention.h; default: one document per row
  std::vector<uint8_t> counted_BT;    // 0 on padding; default: every token counts
  bool empty() const { return positions_BT.empty() && doc_start_BT.empty() && counted_BT.empty(); }
};

}  // namespace tiermoe
