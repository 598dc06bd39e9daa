#pragma once
// The rows batches are drawn from (RowSource): token windows of a flat
// stream (here), or packed / padded SFT examples (sft_data.h).
//
// Window w of length L takes tokens [w*L, w*L+L) as inputs and
// [w*L+1, w*L+L+1) as targets (the `eval` contract, docs/architecture.md): windows are laid end to
// end, each sharing its last target with the next window's first input, so a
// stream of n tokens holds (n - 1) / L of them.
//
// eval_batch(B, L) is the first B windows. WindowSampler walks all windows
// for training, epoch after epoch, in order or shuffled per epoch; the order
// of epoch e is a pure function of (seed, e), so its whole state is the small
// SamplerPosition a checkpoint stores, and a resumed run draws the same
// batches, bit for bit, as one that never stopped.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tiermoe/model/token_layout.h"

namespace tiermoe {

struct TokenBatch {
  int64_t batch = 0, seq_len = 0;
  std::vector<int32_t> inputs_BL;   // (B, L) row b is window b's inputs
  std::vector<int32_t> targets_BL;  // (B, L) the next tokens; -100 where there is no loss
  TokenLayout layout;               // packed documents (SFT); empty for token windows
};

// Rows of seq_len tokens a batch is made of, numbered 0 .. num_rows - 1.
class RowSource {
 public:
  virtual ~RowSource() = default;
  // Names the data in errors: a file path, or "built-in Markov corpus".
  virtual const std::string& source() const = 0;
  virtual int64_t size() const = 0;  // tokens held
  virtual int64_t num_rows(int64_t seq_len) const = 0;
  // Whether batches carry a TokenLayout (a copy_row fills batch.layout).
  virtual bool has_layout() const { return false; }
  // What the rows hold, for logs ("120 examples packed into 14 rows ..."); may be empty.
  virtual std::string summary() const { return ""; }
  // Copies row `index` into row `row` of `out` (allocated by make_batch).
  virtual void copy_row(TokenBatch& out, int64_t row, int64_t index) const = 0;
  // An empty batch of B rows of L tokens (with a layout when has_layout()).
  TokenBatch make_batch(int64_t batch, int64_t seq_len) const;
  // The first `batch` rows; an Error naming the source and the counts when
  // it holds fewer.
  virtual TokenBatch eval_batch(int64_t batch, int64_t seq_len) const;
};

// `b` cut to its longest row's tokens: the padding past every row's last
// counted token is dropped (nothing real attends to it and it carries no
// loss, so the loss and every gradient are the same), so a short example in
// a long --seq-len does not pay attention over the padding. Without a layout
// (token windows: no padding) `b` itself.
TokenBatch without_padded_tail(TokenBatch b);

class TokenWindows final : public RowSource {
 public:
  // `source` names the data in errors: a file path, or "built-in Markov corpus".
  TokenWindows(std::vector<int32_t> tokens, std::string source);
  static TokenWindows from_file(const std::string& path);  // io's read_tokens

  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }
  std::span<const int32_t> tokens() const { return tokens_; }
  const std::string& source() const override { return source_; }

  int64_t num_windows(int64_t seq_len) const;  // (size - 1) / seq_len; 0 for an empty stream
  int64_t num_rows(int64_t seq_len) const override { return num_windows(seq_len); }

  // The first `batch` windows; an Error naming the source and the counts
  // when it holds fewer than batch * seq_len + 1 tokens.
  TokenBatch eval_batch(int64_t batch, int64_t seq_len) const override;

  // Copies window `w` into row `row` of `out`.
  void copy_window(TokenBatch& out, int64_t row, int64_t w) const;
  void copy_row(TokenBatch& out, int64_t row, int64_t w) const override {
    copy_window(out, row, w);
  }

 private:
  std::vector<int32_t> tokens_;
  std::string source_;
};

struct SamplerOptions {
  int64_t seq_len = 64;
  bool shuffle = true;  // a fresh permutation of the windows each epoch; false walks them in order
  uint64_t seed = 0;    // shuffle seed
};

// Everything a checkpoint needs to resume the sampler. seq_len and
// num_windows (the source's rows) are checked on restore, so resuming with another --seq-len or
// another data file is an Error instead of a silently different run.
struct SamplerPosition {
  uint64_t seed = 0;
  int64_t epoch = 0;        // epochs completed
  int64_t index = 0;        // windows consumed in the current epoch, in [0, num_windows)
  int64_t seq_len = 0;
  int64_t num_windows = 0;
  bool shuffle = true;

  bool operator==(const SamplerPosition&) const = default;
};

class WindowSampler {
 public:
  // Keeps a reference: `data` must outlive the sampler. Throws when the data
  // holds less than one window (seq_len + 1 tokens).
  WindowSampler(const RowSource& data, SamplerOptions options);

  // The next `batch` windows of the walk; a batch may span an epoch boundary.
  TokenBatch next_batch(int64_t batch);

  SamplerPosition position() const;
  void set_position(const SamplerPosition& p);  // throws on a mismatched seq_len, data or index

  int64_t num_windows() const { return num_windows_; }

 private:
  void start_epoch(int64_t epoch);

  const RowSource& data_;
  SamplerOptions options_;
  int64_t num_windows_ = 0;
  int64_t epoch_ = 0;
  int64_t index_ = 0;
  std::vector<int64_t> order_;  // (num_windows) window ids of the current epoch
};

}  // namespace tiermoe
