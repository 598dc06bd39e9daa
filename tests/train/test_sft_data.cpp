// SFT rows (train/sft_data.h) and the JSON Lines reader (io/sft_jsonl.h):
// targets, packing, padding, truncation, and errors that name the line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tiermoe/core/error.h"
#include "tiermoe/io/sft_jsonl.h"
#include "tiermoe/train/sft_data.h"

namespace tiermoe {
namespace {

namespace fs = std::filesystem;

std::string write_file(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("tiermoe_sft_" + name);
  std::ofstream(p) << text;
  return p.string();
}

TEST(SftJsonl, LabelsMaskOrNeither) {
  const std::string path = write_file("a.jsonl",
                                      "{\"input_ids\": [1, 2, 3], \"labels\": [-100, 2, 3]}\n"
                                      "\n"
                                      "{\"input_ids\": [4, 5, 6], \"assistant_mask\": [0, true, 1],"
                                      " \"messages\": []}\n"
                                      "{\"input_ids\": [7, 8]}\n");
  const std::vector<SftExample> ex = read_sft_jsonl(path);
  ASSERT_EQ(ex.size(), 3u);
  EXPECT_EQ(ex[0].labels, (std::vector<int32_t>{-100, 2, 3}));
  EXPECT_EQ(ex[1].labels, (std::vector<int32_t>{-100, 5, 6}));
  EXPECT_EQ(ex[2].labels, (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(ex[2].line, 4);
  EXPECT_TRUE(is_sft_jsonl(path));
}

TEST(SftJsonl, ErrorsNameTheLineAndTheField) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"[1, 2]", "not a JSON object"},
      {"{\"labels\": [1]}", "no \"input_ids\""},
      {"{\"input_ids\": []}", "empty"},
      {"{\"input_ids\": [1, 2], \"labels\": [1]}", "\"labels\" has 1 entries for 2"},
      {"{\"input_ids\": [1], \"labels\": [-5]}", "neither a token id nor -100"},
      {"{\"input_ids\": [1], \"labels\": [1], \"assistant_mask\": [1]}", "both"},
      {"{\"input_ids\": [1, 2], \"assistant_mask\": [1, 2]}", "is not 0 or 1"},
      {"{\"input_ids\": [1.5]}", "not a 32-bit integer"},
      {"{\"input_ids\": [-1]}", "negative"},
      {"{\"input_ids\": [1]", "not valid JSON"},
      {"{\"input_ids\": [[1, 2]]}", "\"input_ids\"[0] = a list is not a 32-bit integer"},
      {"{\"input_ids\": [1, {\"a\": 1}]}", "\"input_ids\"[1] = an object"},
      {"{\"input_ids\": \"1 2\"}", "\"input_ids\" is not a list"},
      {"{\"input_ids\": [1], \"input_ids\": [2]}", "\"input_ids\" appears twice"},
      {"{\"input_ids\": [1, 2], \"labels\": [1, \"x\"]}", "\"labels\"[1] = \"x\""},
      {"{\"input_ids\": [1]} {\"input_ids\": [2]}", "not valid JSON"},
      {"{\"input_ids\": [1,\n2]}", "not valid JSON"},  // one object, one line
      {"5", "not a JSON object"},
  };
  for (const auto& [line, words] : bad) {
    const std::string path = write_file("bad.jsonl", "{\"input_ids\": [3]}\n" + line + "\n");
    try {
      read_sft_jsonl(path);
      ADD_FAILURE() << "accepted: " << line;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(words), std::string::npos) << what;
      EXPECT_NE(what.find(":2"), std::string::npos) << "no line number: " << what;
    }
  }
}

// Fields TierMoE does not read are skipped whatever they hold, and lines
// count across blank and CRLF lines.
TEST(SftJsonl, OtherFieldsAreSkippedAndLinesCounted) {
  const std::string path = write_file(
      "skip.jsonl",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"[1, 2]\"}], \"input_ids\": [1, 2],"
      " \"meta\": {\"labels\": \"no\", \"n\": [[1.5, null, true]]}, \"labels\": [-100, 2]}\r\n"
      "   \r\n"
      "\n"
      "{\"input_ids\": [3]}");
  const std::vector<SftExample> ex = read_sft_jsonl(path);
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex[0].input_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(ex[0].labels, (std::vector<int32_t>{-100, 2}));
  EXPECT_EQ(ex[1].line, 4);
}

// With max_tokens an example keeps its first max_tokens ids and labels, and
// the entries past them are still checked and counted.
TEST(SftJsonl, MaxTokensKeepsThePrefixAndChecksTheRest) {
  const std::string path = write_file(
      "keep.jsonl", "{\"input_ids\": [1, 2, 3, 4, 5], \"labels\": [-100, 2, 3, 4, 5]}\n");
  const std::vector<SftExample> ex = read_sft_jsonl(path, 3);
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(ex[0].input_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ex[0].labels, (std::vector<int32_t>{-100, 2, 3}));
  for (const char* bad : {"{\"input_ids\": [1, 2, 3, 4, 5], \"labels\": [-100, 2, 3, 4]}",
                          "{\"input_ids\": [1, 2, 3, 4, 1.5]}"}) {
    EXPECT_THROW(read_sft_jsonl(write_file("keep_bad.jsonl", std::string(bad) + "\n"), 3), Error)
        << bad;
  }
}

// A line past 256 MiB is refused naming its line, not read whole (a 2 GB
// line ended in std::bad_alloc; a 200 MB one took 4.65 GB).
TEST(SftJsonl, ALineLongerThan256MiBIsRefused) {
  const std::string path = (fs::temp_directory_path() / "tiermoe_sft_long.jsonl").string();
  {
    std::ofstream out(path, std::ios::binary);
    out << "{\"input_ids\": [1]}\n{\"input_ids\": [1], \"pad\": [";
    const std::string block(1 << 20, ' ');
    for (int i = 0; i < 257; ++i) out << block;
    out << "]}\n";
  }
  try {
    read_sft_jsonl(path);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the line is longer than 256 MiB"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("long.jsonl:2"), std::string::npos) << e.what();
  }
  fs::remove(path);
}

SftExample ex(std::vector<int32_t> ids, std::vector<int32_t> labels = {}) {
  SftExample e{ids, labels.empty() ? ids : labels, 0};
  return e;
}

TEST(SftData, PacksInOrderWithRestartsAndPads) {
  // 3 + 4 fit a row of 8; 5 does not, so it opens row 1 (3 pad tokens).
  SftData d({ex({1, 2, 3}), ex({4, 5, 6, 7}, {-100, -100, 6, 7}), ex({8, 9, 10, 11, 12})}, "x",
            {.seq_len = 8, .pack = true, .pad_id = 99});
  ASSERT_EQ(d.num_rows(8), 2);
  TokenBatch b = d.eval_batch(2, 8);
  EXPECT_EQ(b.inputs_BL, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 99,  //
                                               8, 9, 10, 11, 12, 99, 99, 99}));
  EXPECT_EQ(b.targets_BL, (std::vector<int32_t>{2, 3, -100, -100, 6, 7, -100, -100,  //
                                                9, 10, 11, 12, -100, -100, -100, -100}));
  EXPECT_EQ(b.layout.positions_BT, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 3, 0,  //
                                                         0, 1, 2, 3, 4, 0, 1, 2}));
  EXPECT_EQ(b.layout.doc_start_BT, (std::vector<int32_t>{0, 0, 0, 3, 3, 3, 3, 7,  //
                                                         0, 0, 0, 0, 0, 5, 5, 5}));
  EXPECT_EQ(b.layout.counted_BT, (std::vector<uint8_t>{1, 1, 1, 1, 1, 1, 1, 0,  //
                                                       1, 1, 1, 1, 1, 0, 0, 0}));
  EXPECT_EQ(d.counted_targets(), 8);
  EXPECT_EQ(d.size(), 12);
  EXPECT_THROW(d.num_rows(16), Error);
}

TEST(SftData, PaddingPutsOneExamplePerRowAndTruncates) {
  SftData d({ex({1, 2, 3}), ex({4, 5, 6, 7, 8, 9, 10})}, "x", {.seq_len = 4, .pack = false});
  ASSERT_EQ(d.num_rows(4), 2);
  EXPECT_EQ(d.truncated(), 1);
  TokenBatch b = d.eval_batch(2, 4);
  EXPECT_EQ(b.inputs_BL, (std::vector<int32_t>{1, 2, 3, 0, 4, 5, 6, 7}));
  EXPECT_EQ(b.targets_BL, (std::vector<int32_t>{2, 3, -100, -100, 5, 6, 7, -100}));
  EXPECT_EQ(b.layout.doc_start_BT, (std::vector<int32_t>{0, 0, 0, 3, 0, 0, 0, 0}));
  EXPECT_EQ(b.layout.positions_BT, (std::vector<int32_t>{0, 1, 2, 0, 0, 1, 2, 3}));
  EXPECT_EQ(b.layout.counted_BT, (std::vector<uint8_t>{1, 1, 1, 0, 1, 1, 1, 1}));
  EXPECT_THROW(d.eval_batch(3, 4), Error);
}

// A batch is cut to its longest row's tokens; the layout moves with it.
TEST(SftData, WithoutPaddedTailCutsToTheLongestRow) {
  SftData d({ex({1, 2, 3}), ex({4, 5})}, "x", {.seq_len = 6, .pack = false});
  const TokenBatch b = without_padded_tail(d.eval_batch(2, 6));
  EXPECT_EQ(b.seq_len, 3);
  EXPECT_EQ(b.inputs_BL, (std::vector<int32_t>{1, 2, 3, 4, 5, 0}));
  EXPECT_EQ(b.targets_BL, (std::vector<int32_t>{2, 3, -100, 5, -100, -100}));
  EXPECT_EQ(b.layout.positions_BT, (std::vector<int32_t>{0, 1, 2, 0, 1, 0}));
  EXPECT_EQ(b.layout.doc_start_BT, (std::vector<int32_t>{0, 0, 0, 0, 0, 2}));
  EXPECT_EQ(b.layout.counted_BT, (std::vector<uint8_t>{1, 1, 1, 1, 1, 0}));
  // Rows that fill L, and token windows (no layout), are kept as they are.
  SftData full({ex({1, 2, 3}), ex({4, 5, 6})}, "x", {.seq_len = 3, .pack = false});
  EXPECT_EQ(without_padded_tail(full.eval_batch(2, 3)).seq_len, 3);
}

// The padding is made as rows are copied, not stored: 100,000 two-token
// examples padded to 2048 held 3.4 GB (17 bytes a padded token).
TEST(SftData, PaddingIsNotStored) {
  std::vector<SftExample> examples(1000, ex({1, 2}));
  SftData d(examples, "x", {.seq_len = 2048, .pack = false});
  EXPECT_EQ(d.num_rows(2048), 1000);
  EXPECT_EQ(d.ids().size(), 2000u);
  EXPECT_EQ(d.targets().size(), 2000u);
  TokenBatch b = d.eval_batch(1, 2048);
  EXPECT_EQ(b.inputs_BL[0], 1);
  EXPECT_EQ(b.inputs_BL[2047], 0);
  EXPECT_EQ(b.layout.positions_BT[2047], 2045);
  EXPECT_EQ(b.layout.doc_start_BT[2047], 2);
}

}  // namespace
}  // namespace tiermoe
