// Malformed safetensors files: each broken rule gives its own clear Error,
// and random mutations of a valid file never give anything but an Error.
//
// The corpus under tests/data/safetensors/malformed/ is generated from the
// table below; run with TIERMOE_WRITE_MALFORMED_CORPUS=1 to rewrite it.
#include <cstdlib>
#include <cstring>
#include <random>

#include "common/testing.h"
#include "io/test_safetensors_util.h"
#include "tiermoe/io/safetensors.h"

namespace tiermoe {
namespace {

using testing::header_entry;
using testing::json_object;
using testing::le64;
using testing::safetensors_bytes;
using testing::TempDir;
using testing::throws_error_with;

struct MalformedCase {
  std::string file;   // name under tests/data/safetensors/malformed/
  std::string rule;   // what is wrong, for the README
  std::string bytes;  // the whole file
  std::string needle; // the rule as the error message names it
  std::string tensor; // the tensor the message must name, if any
};

const std::string kMeta = R"("__metadata__":{"format":"pt"})";

// A tiny valid file is {a: F32[2] at [0,8), b: BF16[2,2] at [8,16)}; each case
// breaks one rule of the safetensors format.
std::string tiny(const std::string& a, const std::string& b, size_t data_bytes) {
  return safetensors_bytes(json_object({kMeta, a, b}), data_bytes);
}
const std::string kA = header_entry("a", "F32", "[2]", 0, 8);
const std::string kB = header_entry("b", "BF16", "[2,2]", 8, 16);

std::vector<MalformedCase> malformed_corpus() {
  std::string e_past_eof = le64(4096) + json_object({kMeta});
  return {
      {"too_short.safetensors", "file shorter than the 8-byte length prefix",
       std::string("\x10\0\0\0\0", 5), "too short", ""},
      {"header_too_large.safetensors", "header length 100000001 > 100 MB limit (prefix only)",
       le64(100'000'001), "header too large", ""},
      {"header_past_eof.safetensors", "header length runs past the end of the file", e_past_eof,
       "runs past the end", ""},
      {"data_truncated.safetensors", "data buffer shorter than the last data_offsets end",
       tiny(kA, kB, 12), "data truncated", ""},
      {"trailing_bytes.safetensors", "bytes after the last tensor", tiny(kA, kB, 20),
       "trailing bytes", ""},
      {"overlap.safetensors", "b begins inside a",
       tiny(kA, header_entry("b", "BF16", "[2,2]", 4, 12), 12), "overlap", "'b'"},
      {"gap.safetensors", "unused bytes between a and b",
       tiny(kA, header_entry("b", "BF16", "[2,2]", 12, 20), 20), "leave a gap", "'b'"},
      {"first_not_at_zero.safetensors", "the first tensor begins at 4",
       tiny(header_entry("a", "F32", "[2]", 4, 12), header_entry("b", "BF16", "[2,2]", 12, 20),
            20),
       "does not start at offset 0", "'a'"},
      {"end_before_begin.safetensors", "data_offsets [8, 0]",
       tiny(kA, header_entry("b", "BF16", "[2,2]", 8, 0), 8), "end < begin", "'b'"},
      {"unknown_dtype.safetensors", "dtype F31", tiny(kA, header_entry("b", "F31", "[2,2]", 8, 16), 16),
       "unknown dtype", "'b'"},
      {"duplicate_tensor.safetensors", "tensor key a twice",
       tiny(kA, header_entry("a", "F32", "[2]", 8, 16), 16), "duplicate key \"a\"", ""},
      {"duplicate_field.safetensors", "field dtype twice in one entry",
       tiny(kA, R"("b":{"dtype":"BF16","dtype":"BF16","shape":[2,2],"data_offsets":[8,16]})", 16),
       "duplicate key \"dtype\" inside \"b\"", ""},
      {"size_mismatch.safetensors", "shape [3] of F32 needs 12 bytes, offsets hold 8",
       tiny(header_entry("a", "F32", "[3]", 0, 8), kB, 16), "size mismatch", "'a'"},
      {"not_utf8.safetensors", "a tensor name with byte 0xFF",
       tiny(kA, header_entry("b\xff", "BF16", "[2,2]", 8, 16), 16), "not valid UTF-8", ""},
      {"metadata_not_string.safetensors", "__metadata__ value 1 (a number)",
       safetensors_bytes(json_object({R"("__metadata__":{"format":1})", kA, kB}), 16),
       "is not a string", ""},
      {"metadata_not_object.safetensors", "__metadata__ is a list",
       safetensors_bytes(json_object({R"("__metadata__":["pt"])", kA, kB}), 16),
       "__metadata__ is not an object", ""},
      {"negative_dim.safetensors", "shape [-2]", tiny(header_entry("a", "F32", "[-2]", 0, 8), kB, 16),
       "is negative", "'a'"},
      {"fractional_dim.safetensors", "shape [2.0]",
       tiny(header_entry("a", "F32", "[2.0]", 0, 8), kB, 16), "is not an integer", "'a'"},
      {"dim_over_2p48.safetensors", "shape [2^48]",
       tiny(header_entry("a", "F32", "[281474976710656]", 0, 8), kB, 16), "2^48-1", "'a'"},
      {"numel_overflow.safetensors", "shape [2^40, 2^40, 0] overflows while multiplying",
       safetensors_bytes(json_object({header_entry("a", "F32", "[1099511627776,1099511627776,0]",
                                                   0, 0)}),
                         0),
       "overflows", "'a'"},
      {"partial_byte.safetensors", "F4 [3] is 12 bits",
       safetensors_bytes(json_object({header_entry("a", "F4", "[3]", 0, 1)}), 1),
       "not a whole number of bytes", "'a'"},
      {"header_not_object.safetensors", "header is a JSON list", safetensors_bytes("[1,2]", 0),
       "not a JSON object", ""},
      {"invalid_json.safetensors", "header cut in the middle of JSON",
       safetensors_bytes(R"({"a":{"dtype")", 0), "not valid JSON", ""},
      {"entry_not_object.safetensors", "tensor entry is a number",
       safetensors_bytes(json_object({R"("a":5)"}), 0), "entry is not a JSON object", "'a'"},
      {"missing_field.safetensors", "entry without data_offsets",
       tiny(R"("a":{"dtype":"F32","shape":[2]})", kB, 16), "missing field \"data_offsets\"",
       "'a'"},
      {"extra_field.safetensors",
       "entry with an extra field (the schema forbids it; the Rust reader ignores it)",
       tiny(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"strides":[1]})", kB, 16),
       "unknown field \"strides\"", "'a'"},
      {"offsets_arity.safetensors", "data_offsets [0]",
       tiny(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0]})", kB, 16),
       "not a list of two integers", "'a'"},
      {"nested_too_deep.safetensors", "shape [[2]]",
       tiny(header_entry("a", "F32", "[[2]]", 0, 8), kB, 16), "nested deeper", ""},
  };
}

std::string corpus_dir() { return std::string(TIERMOE_TEST_DATA_DIR) + "/safetensors/malformed"; }

std::string corpus_readme(const std::vector<MalformedCase>& cases) {
  std::string s =
      "# Malformed safetensors files\n\n"
      "Each file breaks one rule of the format (huggingface/safetensors, as its reference reader "
      "checks) and "
      "must be\nrejected with a clear error. Generated by tests/io/test_safetensors_malformed.cpp "
      "(run test_io with\nTIERMOE_WRITE_MALFORMED_CORPUS=1 to rewrite); the test checks these "
      "files against the generator.\n\n"
      "| file | what is wrong | the error says |\n|---|---|---|\n";
  for (const auto& c : cases) s += "| " + c.file + " | " + c.rule + " | " + c.needle + " |\n";
  return s;
}

TEST(SafetensorsMalformed, TinyBaseFileIsValid) {
  TempDir tmp;
  testing::write_bytes(tmp.file("ok.safetensors"), tiny(kA, kB, 16));
  SafetensorsFile f = SafetensorsFile::open(tmp.file("ok.safetensors"));
  EXPECT_EQ(f.entries().size(), 2u);
  // Leading and trailing JSON whitespace around the header object is allowed.
  std::string padded = " \t\r\n" + json_object({kMeta, kA, kB}) + "\n  ";
  testing::write_bytes(tmp.file("ws.safetensors"), safetensors_bytes(padded, 16));
  EXPECT_EQ(SafetensorsFile::open(tmp.file("ws.safetensors")).entries().size(), 2u);
}

TEST(SafetensorsMalformed, EachBrokenRuleHasItsOwnError) {
  TempDir tmp;
  for (const MalformedCase& c : malformed_corpus()) {
    SCOPED_TRACE(c.file);
    std::string path = tmp.file(c.file);
    testing::write_bytes(path, c.bytes);
    std::vector<std::string> needles = {c.needle, c.file};
    if (!c.tensor.empty()) needles.push_back(c.tensor);
    EXPECT_TRUE(throws_error_with([&] { SafetensorsFile::open(path); },
                                  needles));
  }
}

TEST(SafetensorsMalformed, CommittedCorpusMatchesTheGenerator) {
  std::vector<MalformedCase> cases = malformed_corpus();
  if (std::getenv("TIERMOE_WRITE_MALFORMED_CORPUS")) {
    std::filesystem::create_directories(corpus_dir());
    for (const auto& c : cases) testing::write_bytes(corpus_dir() + "/" + c.file, c.bytes);
    testing::write_bytes(corpus_dir() + "/README.md", corpus_readme(cases));
  }
  for (const auto& c : cases) {
    std::string path = corpus_dir() + "/" + c.file;
    EXPECT_EQ(testing::read_bytes(path), c.bytes)
        << path << " is stale; rerun with TIERMOE_WRITE_MALFORMED_CORPUS=1";
    EXPECT_TRUE(throws_error_with([&] { SafetensorsFile::open(path); }, {c.needle}));
  }
  EXPECT_EQ(testing::read_bytes(corpus_dir() + "/README.md"), corpus_readme(cases));
}

TEST(SafetensorsMalformed, RandomMutationsOnlyEverThrowError) {
  TempDir tmp;
  std::string valid_path = tmp.file("valid.safetensors");
  Rng rng(3);
  save_safetensors(valid_path, {{"w", testing::random_tensor({3, 2}, DType::f32, rng)},
                                {"d", testing::random_tensor({2}, DType::f64, rng)},
                                {"s", Tensor::from_values({}, DType::bf16, {1.0})},
                                {"e", Tensor::empty({0, 3}, DType::bf16)}});
  const std::string valid = testing::read_bytes(valid_path);
  uint64_t n = 0;
  std::memcpy(&n, valid.data(), 8);

  // Mutations aim mostly at the header, where the parser and validator live.
  const std::string interesting = "{}[]\":,-.0123456789eE \\\xff\x80";
  std::mt19937_64 gen(12345);
  auto pick = [&](size_t hi) { return size_t(gen() % hi); };
  std::string path = tmp.file("mutant.safetensors");
  int opened = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string bytes = valid;
    int kind = int(pick(6));
    size_t header_pos = 8 + pick(size_t(n));
    switch (kind) {
      case 0:  // replace a few header bytes
        for (size_t k = 0, m = 1 + pick(3); k < m; ++k) {
          bytes[8 + pick(size_t(n))] = interesting[pick(interesting.size())];
        }
        break;
      case 1:  // random byte anywhere
        bytes[pick(bytes.size())] = char(pick(256));
        break;
      case 2:  // truncate
        bytes.resize(pick(bytes.size()));
        break;
      case 3:  // change the length prefix a little
        std::memcpy(bytes.data(), le64(n + pick(17) - 8).data(), 8);
        break;
      case 4:  // delete a short run of header bytes
        bytes.erase(header_pos, 1 + pick(6));
        break;
      case 5:  // insert a character into the header
        bytes.insert(header_pos, 1, interesting[pick(interesting.size())]);
        break;
    }
    testing::write_bytes(path, bytes);
    try {
      SafetensorsFile f = SafetensorsFile::open(path);
      for (const auto& e : f.entries()) {
        std::span<const std::byte> data = f.bytes(e.name);
        volatile unsigned sum = 0;
        for (std::byte b : data) sum = sum + unsigned(b);
        if (e.dtype == "F32" || e.dtype == "F64" || e.dtype == "BF16") {
          Tensor t = f.load(e.name, DType::f64);
          EXPECT_EQ(t.nbytes(), data.size() * 8 / (safetensors_dtype_bits(e.dtype) / 8));
        }
      }
      ++opened;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "mutation " << iter << " (kind " << kind
                    << ") threw a non-tiermoe exception: " << e.what();
    }
  }
  // Both outcomes must occur, or the mutations test nothing.
  EXPECT_GT(opened, 10);
  EXPECT_GT(rejected, 1000);
}

}  // namespace
}  // namespace tiermoe
