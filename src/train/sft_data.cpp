#include "tiermoe/train/sft_data.h"

#include <algorithm>

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
  int64_t fill = L;  // tokens used in the current row; L: no row open
  auto open_row = [&] {
    ++rows_;
    const size_t n = size_t(rows_ * L);
    ids_.resize(n, o.pad_id);
    targets_.resize(n, kNoLoss);
    positions_.resize(n, 0);
    doc_start_.resize(n, 0);
    counted_.resize(n, 0);
    fill = 0;
  };
  // The padding of a row's tail: one document of its own.
  auto close_row = [&] {
    if (fill >= L) return;
    const int64_t base = (rows_ - 1) * L;
    for (int64_t t = fill; t < L; ++t) {
      positions_[size_t(base + t)] = int32_t(t - fill);
      doc_start_[size_t(base + t)] = int32_t(fill);
    }
    fill = L;
  };
  for (const SftExample& ex : examples) {
    TIERMOE_CHECK(ex.labels.size() == ex.input_ids.size() && !ex.input_ids.empty(),
                  str_of("example of line ", ex.line, ": ", ex.input_ids.size(), " ids and ",
                         ex.labels.size(), " labels"),
                  source_, "labels has one entry per input id");
    const int64_t n = std::min<int64_t>(int64_t(ex.input_ids.size()), L);
    truncated_ += int64_t(ex.input_ids.size()) > L;
    if (!o.pack || fill + n > L) {
      close_row();
      open_row();
    }
    const int64_t base = (rows_ - 1) * L + fill;
    for (int64_t t = 0; t < n; ++t) {
      const size_t at = size_t(base + t);
      ids_[at] = ex.input_ids[size_t(t)];
      targets_[at] = t + 1 < n ? ex.labels[size_t(t + 1)] : kNoLoss;
      positions_[at] = int32_t(t);
      doc_start_[at] = int32_t(fill);
      counted_[at] = 1;
    }
    fill += n;
    real_tokens_ += n;
    ++examples_;
  }
  close_row();
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
  const size_t from = size_t(index * L), to = size_t(row * L);
  std::copy_n(ids_.begin() + from, L, out.inputs_BL.begin() + to);
  std::copy_n(targets_.begin() + from, L, out.targets_BL.begin() + to);
  std::copy_n(positions_.begin() + from, L, out.layout.positions_BT.begin() + to);
  // Starts index the row, so they move with it unchanged.
  std::copy_n(doc_start_.begin() + from, L, out.layout.doc_start_BT.begin() + to);
  std::copy_n(counted_.begin() + from, L, out.layout.counted_BT.begin() + to);
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
