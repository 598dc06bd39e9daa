#pragma once
// Token windows for evaluation and training.
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

namespace tiermoe {

struct TokenBatch {
  int64_t batch = 0, seq_len = 0;
  std::vector<int32_t> inputs_BL;   // (B, L) row b is window b's inputs
  std::vector<int32_t> targets_BL;  // (B, L) the same tokens shifted by one
};

class TokenWindows {
 public:
  // `source` names the data in errors: a file path, or "built-in Markov corpus".
  TokenWindows(std::vector<int32_t> tokens, std::string source);
  static TokenWindows from_file(const std::string& path);  // io's read_tokens

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  std::span<const int32_t> tokens() const { return tokens_; }
  const std::string& source() const { return source_; }

  int64_t num_windows(int64_t seq_len) const;  // (size - 1) / seq_len; 0 for an empty stream

  // The first `batch` windows; an Error naming the source and the counts
  // when it holds fewer than batch * seq_len + 1 tokens.
  TokenBatch eval_batch(int64_t batch, int64_t seq_len) const;

  // Copies window `w` into row `row` of `out`.
  void copy_window(TokenBatch& out, int64_t row, int64_t w) const;

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
// num_windows are checked on restore, so resuming with another --seq-len or
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
  WindowSampler(const TokenWindows& data, SamplerOptions options);

  // The next `batch` windows of the walk; a batch may span an epoch boundary.
  TokenBatch next_batch(int64_t batch);

  SamplerPosition position() const;
  void set_position(const SamplerPosition& p);  // throws on a mismatched seq_len, data or index

  int64_t num_windows() const { return num_windows_; }

 private:
  void start_epoch(int64_t epoch);

  const TokenWindows& data_;
  SamplerOptions options_;
  int64_t num_windows_ = 0;
  int64_t epoch_ = 0;
  int64_t index_ = 0;
  std::vector<int64_t> order_;  // (num_windows) window ids of the current epoch
};

}  // namespace tiermoe
