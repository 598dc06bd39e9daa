#pragma once
// SFT examples (io/sft_jsonl.h) as rows of seq_len tokens, with Hugging Face
// semantics:
//
//   targets   position t of an example predicts labels[t + 1]; its last
//             position predicts nothing (-100), so no loss crosses into the
//             next example; the loss is the mean over the counted targets.
//   packing   (default) examples are laid end to end into rows in file order,
//             a new row starting when the next example does not fit; RoPE
//             positions restart at 0 with each example and no token attends
//             to another example's (transformers' DataCollatorWithFlattening
//             with position_ids, run as [B, L] rows).
//   padding   (packing off) one example per row.
//   Either way a row's unused tail is padding: pad_id tokens, no loss, a
//   document of their own (so nothing real attends to them), and left out of
//   the aux loss (HF's attention_mask). An example longer than seq_len keeps
//   its first seq_len tokens (as a tokenizer's truncation would); the count
//   is reported.
//
// Rows are fixed at construction for one seq_len; the sampler shuffles rows.
#include <cstdint>
#include <string>
#include <vector>

#include "tiermoe/io/sft_jsonl.h"
#include "tiermoe/train/data.h"

namespace tiermoe {

struct SftOptions {
  int64_t seq_len = 64;
  bool pack = true;
  int32_t pad_id = 0;
};

class SftData final : public RowSource {
 public:
  SftData(const std::vector<SftExample>& examples, std::string source, SftOptions options);
  static SftData from_file(const std::string& path, SftOptions options);

  const std::string& source() const override { return source_; }
  int64_t size() const override { return real_tokens_; }  // example tokens (no padding)
  int64_t num_rows(int64_t seq_len) const override;       // Error for another seq_len
  bool has_layout() const override { return true; }
  void copy_row(TokenBatch& out, int64_t row, int64_t index) const override;
  std::string summary() const override;

  int64_t num_examples() const { return examples_; }
  int64_t truncated() const { return truncated_; }  // examples cut to seq_len
  int64_t counted_targets() const;                  // targets != -100 over all rows
  // The examples' input ids and targets (padding aside), for checks against
  // the vocabulary.
  const std::vector<int32_t>& ids() const { return ids_; }
  const std::vector<int32_t>& targets() const { return targets_; }

 private:
  std::string source_;
  SftOptions options_;
  int64_t rows_ = 0, examples_ = 0, truncated_ = 0, real_tokens_ = 0;
  // The examples' tokens, row after row, without padding (copy_row adds it);
  // row r holds [row_begin_[r], row_begin_[r + 1]).
  std::vector<int32_t> ids_, targets_, positions_, doc_start_;
  std::vector<int64_t> row_begin_;
};

}  // namespace tiermoe
