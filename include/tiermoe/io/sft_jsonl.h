#pragma once
// Supervised fine-tuning data: JSON Lines of tokenized examples, one object
// per line, with Hugging Face's field names and meaning:
//
//   {"input_ids": [151644, 872, 198, ...], "labels": [-100, -100, -100, ..., 9707, 151645]}
//   {"input_ids": [...], "assistant_mask": [0, 0, 0, ..., 1, 1]}
//   {"input_ids": [...]}
//
// `labels` has one entry per input id: the token that position is trained to
// be, or -100 for a position that carries no loss (the prompt, the user's
// turns). `assistant_mask` (0/1 or false/true, as the tokenizer's
// return_assistant_tokens_mask gives) is the same information: labels =
// input_ids where the mask is 1, -100 elsewhere. With neither, every token is
// trained on. The model predicts labels[t + 1] from the tokens up to t (the
// shift transformers applies), so an example's first label never counts.
// Other keys (e.g. "attention_mask", "messages") are ignored.
//
// Every rejection names the file, the line and the field: a line that is
// not an object, empty or non-integer input_ids, labels or a mask of another
// length, both labels and assistant_mask, a label below -100 or a negative id.
#include <cstdint>
#include <string>
#include <vector>

namespace tiermoe {

struct SftExample {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;  // same length; -100: no loss at this position
  int64_t line = 0;             // 1-based line in its file
};

// Streams the file a line at a time; a line may hold at most 256 MiB. With
// max_tokens > 0 an example keeps only its first max_tokens ids and labels
// (every entry is still checked and counted): what a run of --seq-len
// max_tokens - 1 can use, and enough to tell that it was cut.
std::vector<SftExample> read_sft_jsonl(const std::string& path, int64_t max_tokens = 0);

// Whether `path` holds SFT JSON Lines rather than a token array: a .jsonl or
// .json name, or a file whose first non-blank byte is '{'.
bool is_sft_jsonl(const std::string& path);

// Writes examples as JSON Lines with input_ids and labels (tests, tools).
void write_sft_jsonl(const std::string& path, const std::vector<SftExample>& examples);

}  // namespace tiermoe
