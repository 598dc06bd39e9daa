#include "tiermoe/train/data.h"

#include <algorithm>
#include <numeric>

#include "tiermoe/core/error.h"
#include "tiermoe/core/random.h"
#include "tiermoe/io/tokens.h"

namespace tiermoe {

using detail::str_of;

namespace {

void check_shape(int64_t batch, int64_t seq_len, const std::string& where) {
  TIERMOE_CHECK(batch >= 1 && seq_len >= 1, str_of("batch ", batch, " and seq_len ", seq_len, " must both be >= 1"),
                where, "pass --batch and --seq-len of at least 1");
}

}  // namespace

TokenBatch RowSource::make_batch(int64_t batch, int64_t seq_len) const {
  TokenBatch b;
  b.batch = batch;
  b.seq_len = seq_len;
  const size_t n = size_t(batch * seq_len);
  b.inputs_BL.resize(n);
  b.targets_BL.resize(n);
  if (has_layout()) {
    b.layout.positions_BT.resize(n);
    b.layout.doc_start_BT.resize(n);
    b.layout.counted_BT.resize(n);
  }
  return b;
}

TokenBatch RowSource::eval_batch(int64_t batch, int64_t seq_len) const {
  check_shape(batch, seq_len, source());
  const int64_t rows = num_rows(seq_len);
  TIERMOE_CHECK(rows >= batch,
                str_of("evaluating ", batch, " rows of ", seq_len, " tokens, but the data holds ",
                       rows),
                source(), str_of("use --batch ", rows, " or less"));
  TokenBatch out = make_batch(batch, seq_len);
  for (int64_t b = 0; b < batch; ++b) copy_row(out, b, b);
  return out;
}

TokenBatch without_padded_tail(TokenBatch b) {
  const TokenLayout& in = b.layout;
  if (in.counted_BT.empty()) return b;
  const int64_t B = b.batch, L = b.seq_len;
  int64_t keep = 1;
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t t = L - 1; t >= keep; --t) {
      if (in.counted_BT[size_t(r * L + t)]) {
        keep = t + 1;
        break;
      }
    }
  }
  if (keep == L) return b;
  // Row r moves to r * keep <= r * L: a forward copy in place is safe.
  const auto cut = [&](auto& v) {
    if (v.empty()) return;
    for (int64_t r = 1; r < B; ++r) std::copy_n(v.begin() + r * L, keep, v.begin() + r * keep);
    v.resize(size_t(B * keep));
  };
  cut(b.inputs_BL);
  cut(b.targets_BL);
  cut(b.layout.positions_BT);
  cut(b.layout.doc_start_BT);
  cut(b.layout.counted_BT);
  b.seq_len = keep;
  return b;
}

TokenWindows::TokenWindows(std::vector<int32_t> tokens, std::string source)
    : tokens_(std::move(tokens)), source_(std::move(source)) {}

TokenWindows TokenWindows::from_file(const std::string& path) { return TokenWindows(read_tokens(path), path); }

int64_t TokenWindows::num_windows(int64_t seq_len) const {
  TIERMOE_ASSERT(seq_len >= 1);
  return size() >= 1 ? (size() - 1) / seq_len : 0;
}

void TokenWindows::copy_window(TokenBatch& out, int64_t row, int64_t w) const {
  const int64_t L = out.seq_len;
  TIERMOE_ASSERT(row >= 0 && row < out.batch && w >= 0 && w < num_windows(L));
  const int32_t* first = tokens_.data() + w * L;
  std::copy(first, first + L, out.inputs_BL.begin() + row * L);
  std::copy(first + 1, first + L + 1, out.targets_BL.begin() + row * L);
}

TokenBatch TokenWindows::eval_batch(int64_t batch, int64_t seq_len) const {
  check_shape(batch, seq_len, source_);
  const int64_t needed = batch * seq_len + 1;
  TIERMOE_CHECK(size() >= needed,
                str_of("evaluating ", batch, " windows of ", seq_len, " tokens needs ", needed,
                       " tokens (batch * seq_len + 1), but the data holds ", size()),
                source_, str_of("use a smaller --batch or --seq-len (this data fits ", num_windows(seq_len),
                                " windows of ", seq_len, "), or more data"));
  TokenBatch out = make_batch(batch, seq_len);
  for (int64_t b = 0; b < batch; ++b) copy_window(out, b, b);
  return out;
}

WindowSampler::WindowSampler(const RowSource& data, SamplerOptions options)
    : data_(data), options_(options) {
  const int64_t L = options_.seq_len;
  TIERMOE_CHECK(L >= 1, str_of("seq_len ", L, " must be >= 1"), data_.source(), "pass --seq-len of at least 1");
  num_windows_ = data_.num_rows(L);
  TIERMOE_CHECK(num_windows_ >= 1,
                str_of("the data holds ", data_.size(), " tokens, fewer than one training window of seq_len ", L,
                       " needs (", L + 1, ": inputs plus the shifted target)"),
                data_.source(), "use a smaller --seq-len or a longer data file");
  start_epoch(0);
}

void WindowSampler::start_epoch(int64_t epoch) {
  epoch_ = epoch;
  index_ = 0;
  order_.resize(num_windows_);
  std::iota(order_.begin(), order_.end(), int64_t{0});
  if (!options_.shuffle) return;
  // A fresh generator per epoch keeps the order a pure function of (seed,
  // epoch): resuming needs no generator state beyond the position.
  Rng rng(options_.seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(epoch + 1)));
  for (int64_t i = num_windows_ - 1; i > 0; --i) {
    std::swap(order_[i], order_[static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)))]);
  }
}

TokenBatch WindowSampler::next_batch(int64_t batch) {
  check_shape(batch, options_.seq_len, data_.source());
  TokenBatch out = data_.make_batch(batch, options_.seq_len);
  for (int64_t b = 0; b < batch; ++b) {
    data_.copy_row(out, b, order_[index_]);
    if (++index_ == num_windows_) start_epoch(epoch_ + 1);
  }
  return out;
}

SamplerPosition WindowSampler::position() const {
  return {.seed = options_.seed, .epoch = epoch_, .index = index_, .seq_len = options_.seq_len,
          .num_windows = num_windows_, .shuffle = options_.shuffle};
}

void WindowSampler::set_position(const SamplerPosition& p) {
  const std::string& where = data_.source();
  TIERMOE_CHECK(p.seq_len == options_.seq_len,
                str_of("the saved data position is for seq_len ", p.seq_len, ", this run uses ", options_.seq_len),
                where, str_of("resume with --seq-len ", p.seq_len));
  TIERMOE_CHECK(p.num_windows == num_windows_,
                str_of("the saved data position is for ", p.num_windows, " windows, this data holds ", num_windows_,
                       " (", data_.size(), " tokens)"),
                where, "resume with the data file the checkpoint was trained on");
  TIERMOE_CHECK(p.epoch >= 0 && p.index >= 0 && p.index < num_windows_,
                str_of("the saved data position (epoch ", p.epoch, ", index ", p.index, ") is outside [0, ",
                       num_windows_, ")"),
                where, "the checkpoint's data position is corrupt");
  // The epoch's order is drawn again only when it changes (a rewind within
  // an epoch, as each step's look ahead does, costs nothing).
  const bool same_order = !order_.empty() && p.epoch == epoch_ && p.seed == options_.seed &&
                          p.shuffle == options_.shuffle;
  options_.seed = p.seed;
  options_.shuffle = p.shuffle;
  if (!same_order) start_epoch(p.epoch);
  index_ = p.index;
}

}  // namespace tiermoe
