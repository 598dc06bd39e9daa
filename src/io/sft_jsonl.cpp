#include "tiermoe/io/sft_jsonl.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <streambuf>
#include <string_view>

#include "safetensors_common.h"
#include "tiermoe/core/error.h"
#include "tiermoe/core/files.h"

namespace tiermoe {

namespace {

using detail::str_of;
using nlohmann::json;

constexpr int32_t kIgnore = -100;
constexpr size_t kMaxLineBytes = size_t(256) << 20;

// One line's fields as the SAX parser meets them: the three known lists are
// read straight into int32 (the first `keep` entries kept, every entry
// checked and counted), everything else is skipped without building a DOM.
// A line of 1e8 ids held as nlohmann::json took 4.65 GB; this holds `keep`.
class LineFields : public json::json_sax_t {
 public:
  struct List {
    bool seen = false;
    int64_t count = 0;          // every entry
    std::vector<int32_t> kept;  // the first `keep` of them
  };
  List input_ids, labels, mask;

  LineFields(std::string where, int64_t keep) : where_(std::move(where)), keep_(keep) {}

  bool null() override { return value("null"); }
  bool boolean(bool v) override {
    if (list_ == &mask) return add(v ? 1 : 0);
    return value(v ? "true" : "false");
  }
  bool number_integer(number_integer_t v) override { return integer(v, std::to_string(v)); }
  bool number_unsigned(number_unsigned_t v) override {
    return v <= uint64_t(INT64_MAX) ? integer(int64_t(v), std::to_string(v))
                                    : value(std::to_string(v));
  }
  bool number_float(number_float_t, const string_t& text) override { return value(text); }
  bool string(string_t& v) override { return ignored() || value(json(v).dump()); }
  bool binary(binary_t&) override { return value("binary"); }
  bool start_object(std::size_t) override {
    if (depth_ == 0) {
      ++depth_;
      return true;
    }
    if (!value("an object")) return false;
    ++depth_;
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool key(string_t& k) override {
    if (depth_ != 1) return true;
    list_ = nullptr;
    if (k == "input_ids") list_ = &input_ids;
    if (k == "labels") list_ = &labels;
    if (k == "assistant_mask") list_ = &mask;
    key_ = k;
    if (list_) {
      TIERMOE_CHECK(!list_->seen, str_of("\"", k, "\" appears twice"), where_,
                    "give each field once");
      list_->seen = true;
    }
    return true;
  }
  bool start_array(std::size_t) override {
    TIERMOE_CHECK(depth_ > 0, "the line is not a JSON object", where_, kLineHint);
    if (depth_ == 1 && list_) {
      in_list_ = true;
    } else if (in_list_) {
      return value("a list");
    }
    ++depth_;
    return true;
  }
  bool end_array() override {
    --depth_;
    if (depth_ == 1) in_list_ = false;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    throw Error(str_of("not valid JSON: ", e.what()), where_,
                "each line must be one JSON object (JSON Lines)");
  }

 private:
  static constexpr const char* kLineHint =
      "each line is {\"input_ids\": [...], \"labels\": [...]} (labels optional)";

  // Inside a field TierMoE does not read ("messages", "attention_mask").
  bool ignored() const { return depth_ > 1 ? !(in_list_ && depth_ == 2) : depth_ == 1 && !list_; }

  // A scalar where it is no entry of a known list: the top level (the line
  // is not an object), a known field that is not a list, or a wrong entry.
  bool value(const std::string& text) {
    TIERMOE_CHECK(depth_ > 0, "the line is not a JSON object", where_, kLineHint);
    if (depth_ == 1 && list_) {
      throw Error(str_of("\"", key_, "\" is not a list"), where_,
                  "give token ids as a JSON list of integers");
    }
    if (in_list_ && depth_ == 2) return entry_error(text);
    return true;  // inside a field TierMoE ignores
  }
  bool integer(int64_t v, const std::string& text) {
    if (!(in_list_ && depth_ == 2)) return value(text);
    if (list_ == &mask) {
      if (v != 0 && v != 1) return entry_error(text);
      return add(int32_t(v));
    }
    if (v < INT32_MIN || v > INT32_MAX) return entry_error(text);
    return add(int32_t(v));
  }
  bool add(int32_t v) {
    if (!(in_list_ && depth_ == 2)) return value(v ? "true" : "false");
    if (list_->count < keep_) list_->kept.push_back(v);
    ++list_->count;
    return true;
  }
  bool entry_error(const std::string& text) {
    const int64_t i = list_->count;
    if (list_ == &mask) {
      throw Error(str_of("\"assistant_mask\"[", i, "] = ", text, " is not 0 or 1"), where_,
                  "1 marks the tokens trained on (the assistant's), 0 the rest");
    }
    throw Error(str_of("\"", key_, "\"[", i, "] = ", text, " is not a 32-bit integer"), where_,
                "token ids and labels are integers");
  }

  std::string where_, key_;
  int64_t keep_;
  int depth_ = 0;
  List* list_ = nullptr;  // the known field whose value is being read
  bool in_list_ = false;
};

SftExample parse_line(std::istream& text, const std::string& where, int64_t line, int64_t keep) {
  LineFields f(where, keep);
  json::sax_parse(text, &f);
  TIERMOE_CHECK(f.input_ids.seen, "no \"input_ids\"", where,
                "tokenize the data first, e.g. with scripts/prep_sft.py");
  SftExample ex;
  ex.line = line;
  const int64_t n = f.input_ids.count;
  TIERMOE_CHECK(n > 0, "\"input_ids\" is empty", where, "drop empty examples from the data");
  ex.input_ids = std::move(f.input_ids.kept);
  for (size_t i = 0; i < ex.input_ids.size(); ++i) {
    TIERMOE_CHECK(ex.input_ids[i] >= 0,
                  str_of("\"input_ids\"[", i, "] = ", ex.input_ids[i], " is negative"), where,
                  "token ids are >= 0");
  }
  TIERMOE_CHECK(!(f.labels.seen && f.mask.seen), "both \"labels\" and \"assistant_mask\"", where,
                "give one of them: labels (-100 = no loss) or assistant_mask (1 = loss)");
  if (f.labels.seen) {
    TIERMOE_CHECK(f.labels.count == n,
                  str_of("\"labels\" has ", f.labels.count, " entries for ", n, " input_ids"),
                  where, "labels has one entry per input id (-100 where there is no loss)");
    ex.labels = std::move(f.labels.kept);
    for (size_t i = 0; i < ex.labels.size(); ++i) {
      TIERMOE_CHECK(
          ex.labels[i] >= 0 || ex.labels[i] == kIgnore,
          str_of("\"labels\"[", i, "] = ", ex.labels[i], " is neither a token id nor -100"), where,
          "-100 marks positions without loss");
    }
  } else if (f.mask.seen) {
    TIERMOE_CHECK(f.mask.count == n, str_of("\"assistant_mask\" is not a list of ", n, " flags"),
                  where, "assistant_mask has one 0/1 per input id");
    ex.labels.resize(ex.input_ids.size());
    for (size_t i = 0; i < ex.labels.size(); ++i) {
      ex.labels[i] = f.mask.kept[i] == 1 ? ex.input_ids[i] : kIgnore;
    }
  } else {
    ex.labels = ex.input_ids;
  }
  return ex;
}

// The file's lines one at a time, as a stream that ends at each newline, so
// the SAX parser reads a line straight from the file: nothing holds a line
// whole (the parser holds one token at a time, a long string at most). A
// line past kMaxLineBytes is an Error (a 2 GB line ended in bad_alloc).
class JsonLines : public std::streambuf {
 public:
  explicit JsonLines(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    TIERMOE_CHECK(in_.good(), "cannot open the SFT data file", path, "check the path");
    // A token array under a .jsonl name would fail as "not valid JSON".
    char head[6] = {};
    in_.read(head, sizeof head);
    TIERMOE_CHECK(std::string_view(head, size_t(in_.gcount())) != "\x93NUMPY",
                  "the file holds a NumPy .npy array, not JSON Lines (its name ends in .json or "
                  ".jsonl)",
                  path, "rename it to .npy: --data reads token arrays by their content");
    in_.clear();
    in_.seekg(0);
  }

  // Moves to the next line that is not blank; false at the end of the file.
  bool next() {
    for (;;) {
      if (at_newline_) {
        at_newline_ = false;
        ++pos_;  // the newline itself
        ++line_;
      }
      line_bytes_ = 0;
      bool blank = true;
      for (int c; (c = sgetc()) != traits_type::eof(); sbumpc()) {
        if (c != ' ' && c != '\t' && c != '\r') {
          blank = false;
          break;
        }
      }
      if (!blank) return true;
      if (!at_newline_) return false;  // the end of the file
    }
  }
  int64_t line() const { return line_; }
  std::string where() const { return str_of(path_, ":", line_); }

 protected:
  int_type underflow() override {
    if (at_newline_) return traits_type::eof();
    if (pos_ == len_) {
      in_.read(buf_, sizeof buf_);
      len_ = size_t(in_.gcount());
      pos_ = 0;
      if (len_ == 0) return traits_type::eof();
    }
    const char* start = buf_ + pos_;
    const char* nl = static_cast<const char*>(std::memchr(start, '\n', len_ - pos_));
    const size_t n = nl ? size_t(nl - start) : len_ - pos_;
    line_bytes_ += n;
    TIERMOE_CHECK(line_bytes_ <= kMaxLineBytes,
                  str_of("the line is longer than ", kMaxLineBytes >> 20, " MiB"), where(),
                  "one example a line; an example this long is far past any --seq-len (a "
                  "million tokens with labels is about 16 MiB)");
    setg(buf_ + pos_, buf_ + pos_, buf_ + pos_ + n);
    pos_ += n;
    if (nl) at_newline_ = true;
    if (n == 0) return traits_type::eof();
    return traits_type::to_int_type(*gptr());
  }

 private:
  std::string path_;
  std::ifstream in_;
  char buf_[1 << 16];
  size_t len_ = 0, pos_ = 0;  // buf_ holds [0, len_); the get area ends at pos_
  size_t line_bytes_ = 0;
  int64_t line_ = 1;
  bool at_newline_ = false;  // buf_[pos_] is the newline that ends this line
};

}  // namespace

std::vector<SftExample> read_sft_jsonl(const std::string& path, int64_t max_tokens) {
  require_regular_file(path, "SFT data file", "check the path");
  JsonLines lines(path);
  const int64_t keep = max_tokens > 0 ? max_tokens : INT64_MAX;
  std::vector<SftExample> out;
  while (lines.next()) {
    std::istream line(&lines);
    out.push_back(parse_line(line, lines.where(), lines.line(), keep));
  }
  TIERMOE_CHECK(!out.empty(), "no examples", path,
                "the file holds no JSON lines; prepare data with scripts/prep_sft.py");
  return out;
}

bool is_sft_jsonl(const std::string& path) {
  // Sniffing a FIFO would block; every data file is a regular file.
  require_regular_file(path, "data file",
                       "--data takes a token file (.npy, llm.c .bin) or SFT JSON Lines");
  if (path.ends_with(".jsonl") || path.ends_with(".json")) return true;
  std::ifstream in(path, std::ios::binary);
  char c = 0;
  while (in.get(c)) {
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n') return c == '{';
  }
  return false;
}

void write_sft_jsonl(const std::string& path, const std::vector<SftExample>& examples) {
  std::string text;
  for (const SftExample& ex : examples) {
    text += json{{"input_ids", ex.input_ids}, {"labels", ex.labels}}.dump();
    text += '\n';
  }
  AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

}  // namespace tiermoe
