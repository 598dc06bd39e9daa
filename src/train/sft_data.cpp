#include "tiermoe/train/sft_data.h"

#include <algorithm>
#include <numeric>

#include "tiermoe/core/error.h"

namespace tiermoe {

using detail::str_of;

namespace {
constexpr int32_t kNoLoss = -100;
}

SftData::SftData(const std::vector<SftExample>& examples, std::string source, SftOptions o)
    : source_(std::move(source)), options_(o) {
  const int64_t L = o.seq_len;
  TIERMOE_CHECK(L >= 1, str_of("seq_len ", L, " must be >= 1"), source_,
                "pass --seq-len of at least 1");
  // Only the examples' tokens are stored, row after row; copy_row adds each
  // row's padding (100,000 two-token examples padded to 2048 held 3.4 GB).
  int64_t fill = L;  // tokens used in the current row; L: no row open
  for (const SftExample& ex : examples) {
    TIERMOE_CHECK(ex.labels.size() == ex.input_ids.size() && !ex.input_ids.empty(),
                  str_of("example of line ", ex.line, ": ", ex.input_ids.size(), " ids and ",
                         ex.labels.size(), " labels"),
                  source_, "labels has one entry per input id");
    const int64_t n = std::min<int64_t>(int64_t(ex.input_ids.size()), L);
    truncated_ += int64_t(ex.input_ids.size()) > L;
    if (!o.pack || fill + n > L) {
      row_begin_.push_back(int64_t(ids_.size()));
      fill = 0;
    }
    for (int64_t t = 0; t < n; ++t) {
      ids_.push_back(ex.input_ids[size_t(t)]);
      targets_.push_back(t + 1 < n ? ex.labels[size_t(t + 1)] : kNoLoss);
      positions_.push_back(int32_t(t));
      doc_start_.push_back(int32_t(fill));
    }
    fill += n;
    real_tokens_ += n;
    ++examples_;
  }
  rows_ = int64_t(row_begin_.size());
  row_begin_.push_back(int64_t(ids_.size()));
  TIERMOE_CHECK(rows_ >= 1, "no examples", source_, "the data holds no examples");
  // Trained anyway, such data gives loss 0 and a zero gradient, yet AdamW's
  // decay still moves the weights and every checkpoint looks like progress.
  TIERMOE_CHECK(
      counted_targets() > 0,
      str_of("nothing to train on: in all ", examples_,
             " examples every label the loss "
             "would count is -100",
             truncated_ ? str_of(" (", truncated_, " cut to --seq-len ", options_.seq_len, ")")
                        : std::string()),
      source_,
      str_of("labels -100 (or assistant_mask 0) mark tokens without loss, and an "
             "example's first token is never a target; give each example at least one "
             "counted token after its first",
             truncated_ ? "; a longer --seq-len keeps more of each example" : ""));
}

SftData SftData::from_file(const std::string& path, SftOptions options) {
  // One token past seq_len tells a cut example from one that fits.
  return SftData(read_sft_jsonl(path, options.seq_len + 1), path, options);
}

int64_t SftData::num_rows(int64_t seq_len) const {
  TIERMOE_CHECK(seq_len == options_.seq_len,
                str_of("the SFT rows were built for seq_len ", options_.seq_len, ", not ", seq_len),
                source_, "build the data with the run's --seq-len");
  return rows_;
}

void SftData::copy_row(TokenBatch& out, int64_t row, int64_t index) const {
  const int64_t L = options_.seq_len;
  TIERMOE_ASSERT(out.seq_len == L && row >= 0 && row < out.batch && index >= 0 && index < rows_);
  const int64_t from = row_begin_[size_t(index)], n = row_begin_[size_t(index) + 1] - from;
  const size_t to = size_t(row * L), pad = size_t(L - n);
  const auto copy = [&](const std::vector<int32_t>& src, std::vector<int32_t>& dst, int32_t fill) {
    std::copy_n(src.begin() + from, n, dst.begin() + to);
    std::fill_n(dst.begin() + to + size_t(n), pad, fill);
  };
  copy(ids_, out.inputs_BL, options_.pad_id);
  copy(targets_, out.targets_BL, kNoLoss);
  // Starts index the row, so they move with it unchanged. The tail's
  // padding is one document of its own, so nothing real attends to it.
  copy(doc_start_, out.layout.doc_start_BT, int32_t(n));
  std::copy_n(positions_.begin() + from, n, out.layout.positions_BT.begin() + to);
  std::iota(out.layout.positions_BT.begin() + to + size_t(n),
            out.layout.positions_BT.begin() + to + size_t(L), 0);
  std::fill_n(out.layout.counted_BT.begin() + to, n, uint8_t(1));
  std::fill_n(out.layout.counted_BT.begin() + to + size_t(n), pad, uint8_t(0));
}

std::string SftData::summary() const {
  return str_of(examples_, " examples ", options_.pack ? "packed into " : "padded to ", rows_,
                " rows of ", options_.seq_len, " (", real_tokens_, " tokens, ", counted_targets(),
                " with loss", truncated_ ? str_of(", ", truncated_, " truncated") : std::string(),
                ")");
}

int64_t SftData::counted_targets() const {
  return std::count_if(targets_.begin(), targets_.end(), [](int32_t t) { return t != kNoLoss; });
}

}  // namespace tiermoe
