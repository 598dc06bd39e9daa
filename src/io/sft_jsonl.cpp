#include "tiermoe/io/sft_jsonl.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "safetensors_common.h"
#include "tiermoe/core/error.h"
#include "tiermoe/core/files.h"

namespace tiermoe {

namespace {

using detail::str_of;
using nlohmann::json;

constexpr int32_t kIgnore = -100;

std::vector<int32_t> int_array(const json& j, const char* field, const std::string& where) {
  TIERMOE_CHECK(j.is_array(), str_of("\"", field, "\" is not a list"), where,
                "give token ids as a JSON list of integers");
  std::vector<int32_t> out;
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const json& v = j[i];
    TIERMOE_CHECK(
        v.is_number_integer() && v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX,
        str_of("\"", field, "\"[", i, "] = ", v.dump(), " is not a 32-bit integer"), where,
        "token ids and labels are integers");
    out.push_back(int32_t(v.get<int64_t>()));
  }
  return out;
}

SftExample parse_line(const json& j, const std::string& where, int64_t line) {
  TIERMOE_CHECK(j.is_object(), "the line is not a JSON object", where,
                "each line is {\"input_ids\": [...], \"labels\": [...]} (labels optional)");
  TIERMOE_CHECK(j.contains("input_ids"), "no \"input_ids\"", where,
                "tokenize the data first, e.g. with scripts/prep_sft.py");
  SftExample ex;
  ex.line = line;
  ex.input_ids = int_array(j.at("input_ids"), "input_ids", where);
  TIERMOE_CHECK(!ex.input_ids.empty(), "\"input_ids\" is empty", where,
                "drop empty examples from the data");
  for (size_t i = 0; i < ex.input_ids.size(); ++i) {
    TIERMOE_CHECK(ex.input_ids[i] >= 0,
                  str_of("\"input_ids\"[", i, "] = ", ex.input_ids[i], " is negative"), where,
                  "token ids are >= 0");
  }
  const bool has_labels = j.contains("labels"), has_mask = j.contains("assistant_mask");
  TIERMOE_CHECK(!(has_labels && has_mask), "both \"labels\" and \"assistant_mask\"", where,
                "give one of them: labels (-100 = no loss) or assistant_mask (1 = loss)");
  const size_t n = ex.input_ids.size();
  if (has_labels) {
    ex.labels = int_array(j.at("labels"), "labels", where);
    TIERMOE_CHECK(ex.labels.size() == n,
                  str_of("\"labels\" has ", ex.labels.size(), " entries for ", n, " input_ids"),
                  where, "labels has one entry per input id (-100 where there is no loss)");
    for (size_t i = 0; i < n; ++i) {
      TIERMOE_CHECK(
          ex.labels[i] >= 0 || ex.labels[i] == kIgnore,
          str_of("\"labels\"[", i, "] = ", ex.labels[i], " is neither a token id nor -100"), where,
          "-100 marks positions without loss");
    }
  } else if (has_mask) {
    const json& m = j.at("assistant_mask");
    TIERMOE_CHECK(m.is_array() && m.size() == n,
                  str_of("\"assistant_mask\" is not a list of ", n, " flags"), where,
                  "assistant_mask has one 0/1 per input id");
    ex.labels.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const json& v = m[i];
      const bool ok = v.is_boolean() || (v.is_number_integer() && (v == 0 || v == 1));
      TIERMOE_CHECK(ok, str_of("\"assistant_mask\"[", i, "] = ", v.dump(), " is not 0 or 1"), where,
                    "1 marks the tokens trained on (the assistant's), 0 the rest");
      const bool on = v.is_boolean() ? v.get<bool>() : v.get<int>() == 1;
      ex.labels[i] = on ? ex.input_ids[i] : kIgnore;
    }
  } else {
    ex.labels = ex.input_ids;
  }
  return ex;
}

}  // namespace

std::vector<SftExample> read_sft_jsonl(const std::string& path) {
  require_regular_file(path, "SFT data file", "check the path");
  std::ifstream in(path, std::ios::binary);
  TIERMOE_CHECK(in.good(), "cannot open the SFT data file", path, "check the path");
  std::vector<SftExample> out;
  std::string text;
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = str_of(path, ":", line);
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      throw Error(str_of("not valid JSON: ", e.what()), where,
                  "each line must be one JSON object (JSON Lines)");
    }
    out.push_back(parse_line(j, where, line));
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
