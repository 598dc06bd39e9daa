// safetensors write -> read: bit-exact tensors, the reference writer's header
// layout (padding, order, metadata), atomic replacement, view/load semantics.
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/testing.h"
#include "io/test_safetensors_util.h"
#include "tiermoe/io/safetensors.h"

namespace tiermoe {
namespace {

using testing::read_bytes;
using testing::TempDir;
using testing::throws_error_with;

NamedTensors sample_tensors() {
  Rng rng(7);
  Tensor bf = testing::random_tensor({2, 3}, DType::bf16, rng);
  // Specials must survive the round trip bit for bit.
  bf.set(0, std::numeric_limits<double>::infinity());
  bf.set(1, -0.0);
  bf.set(2, std::numeric_limits<double>::quiet_NaN());
  return {
      {"w.bf16", bf},
      {"w.f64", testing::random_tensor({3, 4}, DType::f64, rng)},
      {"w.f32", testing::random_tensor({5}, DType::f32, rng)},
      {"scalar", Tensor::from_values({}, DType::f32, {3.5})},
      {"empty", Tensor::empty({0, 4}, DType::bf16)},
      {"a.bf16", testing::random_tensor({7}, DType::bf16, rng)},
  };
}

uint64_t header_length(const std::string& bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return n;
}

TEST(SafetensorsRoundTrip, TensorsComeBackBitExact) {
  TempDir tmp;
  std::string path = tmp.file("t.safetensors");
  NamedTensors tensors = sample_tensors();
  save_safetensors(path, tensors);

  SafetensorsFile f = SafetensorsFile::open(path);
  ASSERT_EQ(f.entries().size(), tensors.size());
  for (const auto& [name, want] : tensors) {
    ASSERT_TRUE(f.contains(name)) << name;
    Tensor got = f.view(name);
    EXPECT_TRUE(testing::bitwise_equal(got, want, name));
    EXPECT_EQ(f.entry(name).dtype, safetensors_dtype_name(want.dtype())) << name;
    EXPECT_EQ(f.bytes(name).size(), want.nbytes()) << name;
  }
  EXPECT_EQ(f.view("scalar").dim(), 0);
  EXPECT_EQ(f.view("empty").numel(), 0);
  EXPECT_FALSE(f.contains("missing"));
}

TEST(SafetensorsRoundTrip, HeaderIsPaddedSortedAndTaggedPt) {
  TempDir tmp;
  std::string path = tmp.file("t.safetensors");
  NamedTensors tensors = sample_tensors();
  save_safetensors(path, tensors);

  std::string bytes = read_bytes(path);
  uint64_t n = header_length(bytes);
  EXPECT_EQ(n % 8, 0u);
  std::string header = bytes.substr(8, n);
  size_t close = header.find_last_of('}');
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos)
      << "padding must be spaces: " << header;

  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  // Wider dtypes first, then by name; packed without gaps, so naturally aligned.
  std::vector<std::string> order;
  for (const auto& e : f.entries()) {
    order.push_back(e.name);
    EXPECT_EQ((8 + n + e.begin) % (safetensors_dtype_bits(e.dtype) / 8), 0u) << e.name;
  }
  EXPECT_EQ(order, (std::vector<std::string>{"w.f64", "scalar", "w.f32", "a.bf16", "empty",
                                             "w.bf16"}));
  EXPECT_EQ(f.file_size(), 8 + n + f.entries().back().end);
}

TEST(SafetensorsRoundTrip, HeaderTextMatchesTheReferenceWriter) {
  TempDir tmp;
  std::string path = tmp.file("t.safetensors");
  save_safetensors(path, {{"b", Tensor::from_values({1}, DType::f32, {1.0})},
                          {"a", Tensor::from_values({2}, DType::bf16, {1.0, 2.0})}});
  std::string want =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("a":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]}})";
  want.resize((want.size() + 7) / 8 * 8, ' ');
  std::string bytes = read_bytes(path);
  EXPECT_EQ(bytes.substr(8, header_length(bytes)), want);
}

TEST(SafetensorsRoundTrip, MetadataIsWrittenAsGivenOrOmitted) {
  TempDir tmp;
  Tensor t = Tensor::from_values({2}, DType::f32, {1.0, 2.0});
  save_safetensors(tmp.file("m.safetensors"), {{"t", t}}, {{"format", "pt"}, {"step", "12"}});
  EXPECT_EQ(SafetensorsFile::open(tmp.file("m.safetensors")).metadata().at("step"), "12");

  save_safetensors(tmp.file("none.safetensors"), {{"t", t}}, {});
  EXPECT_TRUE(SafetensorsFile::open(tmp.file("none.safetensors")).metadata().empty());
  EXPECT_EQ(read_bytes(tmp.file("none.safetensors")).find("__metadata__"), std::string::npos);
}

TEST(SafetensorsRoundTrip, LoadConvertsWithRoundToNearestEven) {
  TempDir tmp;
  std::string path = tmp.file("t.safetensors");
  NamedTensors tensors = sample_tensors();
  save_safetensors(path, tensors);
  SafetensorsFile f = SafetensorsFile::open(path);
  for (const auto& [name, src] : tensors) {
    for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
      Tensor got = f.load(name, dt, MemTag::grads);
      EXPECT_TRUE(got.owns_storage());
      EXPECT_EQ(got.tag(), MemTag::grads);
      EXPECT_TRUE(testing::bitwise_equal(got, src.to(dt), name + " as " +
                                                              std::string(dtype_name(dt))));
    }
  }
  // A value halfway between two bf16 neighbours rounds to the even one.
  Tensor tie = Tensor::from_values({2}, DType::f32, {0.0, 0.0});
  tie.data<float>()[0] = std::bit_cast<float>(uint32_t(0x3f808000));  // 1 + 2^-8: tie, round down
  tie.data<float>()[1] = std::bit_cast<float>(uint32_t(0x3f818000));  // tie, round up to even
  save_safetensors(path, {{"tie", tie}});
  Tensor got = SafetensorsFile::open(path).load("tie", DType::bf16);
  EXPECT_EQ(got.data<bf16>()[0].bits, 0x3f80);
  EXPECT_EQ(got.data<bf16>()[1].bits, 0x3f82);
}

TEST(SafetensorsRoundTrip, ViewOutlivesTheFileObjectAndNeverWritesTheFile) {
  TempDir tmp;
  std::string path = tmp.file("t.safetensors");
  Tensor src = Tensor::from_values({3}, DType::f32, {1.0, 2.0, 3.0});
  save_safetensors(path, {{"x", src}});
  std::string before = read_bytes(path);
  Tensor view;
  {
    SafetensorsFile f = SafetensorsFile::open(path);
    view = f.view("x");
    EXPECT_FALSE(view.owns_storage());
  }
  EXPECT_TRUE(testing::bitwise_equal(view, src));
  view.set(0, 42.0);  // copy-on-write: only this process's page changes
  EXPECT_EQ(view.get(0), 42.0);
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(SafetensorsFile::open(path).view("x").get(0), 1.0);
}

TEST(SafetensorsRoundTrip, UnalignedDataFromOtherWritersComesBackAsACopy) {
  TempDir tmp;
  std::string path = tmp.file("odd.safetensors");
  // Trailing header whitespace puts the data at an odd offset.
  std::string header = testing::json_object({testing::header_entry("x", "F32", "[2]", 0, 8)});
  while ((8 + header.size()) % 4 != 1) header += ' ';
  float values[2] = {1.5f, -2.25f};
  std::string data(reinterpret_cast<const char*>(values), sizeof values);
  testing::write_bytes(path, testing::le64(header.size()) + header + data);

  Tensor t = SafetensorsFile::open(path).view("x");
  EXPECT_TRUE(t.owns_storage());
  EXPECT_EQ(t.to_vector(), (std::vector<double>{1.5, -2.25}));
}

TEST(SafetensorsRoundTrip, OtherDtypesAreBytesOnly) {
  TempDir tmp;
  std::string path = tmp.file("i64.safetensors");
  std::string header = testing::json_object({testing::header_entry("ids", "I64", "[2]", 0, 16),
                                            testing::header_entry("h", "F16", "[1]", 16, 18)});
  testing::write_bytes(path, testing::safetensors_bytes(header, 18));
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.bytes("ids").size(), 16u);
  EXPECT_EQ(f.bytes("h").size(), 2u);
  EXPECT_TRUE(throws_error_with([&] { f.view("ids"); }, {"I64", "'ids'", "bytes()"}));
  EXPECT_TRUE(throws_error_with([&] { f.load("h", DType::f32); }, {"F16", "'h'"}));
  EXPECT_TRUE(throws_error_with([&] { f.entry("nope"); }, {"'nope'", "i64.safetensors"}));
}

TEST(SafetensorsRoundTrip, DtypeTables) {
  EXPECT_EQ(safetensors_dtype_bits("BF16"), 16u);
  EXPECT_EQ(safetensors_dtype_bits("F4"), 4u);
  EXPECT_EQ(safetensors_dtype_bits("F6_E3M2"), 6u);
  EXPECT_EQ(safetensors_dtype_bits("U64"), 64u);
  EXPECT_EQ(safetensors_dtype_bits("F8_E4M3"), 8u);
  EXPECT_TRUE(throws_error_with([] { safetensors_dtype_bits("bf16"); }, {"unknown"}));
  EXPECT_EQ(safetensors_dtype_name(DType::f64), "F64");
  EXPECT_EQ(safetensors_dtype_name(DType::f32), "F32");
  EXPECT_EQ(safetensors_dtype_name(DType::bf16), "BF16");
}

TEST(SafetensorsWriter, ReplacesAtomicallyAndLeavesNoTemporaries) {
  TempDir tmp;
  std::string path = tmp.file("t.safetensors");
  Tensor one = Tensor::from_values({1}, DType::f32, {1.0});
  Tensor two = Tensor::from_values({2}, DType::f64, {2.0, 3.0});
  save_safetensors(path, {{"one", one}});
  save_safetensors(path, {{"two", two}});
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_FALSE(f.contains("one"));
  EXPECT_TRUE(testing::bitwise_equal(f.view("two"), two));

  // A refused write leaves the old file intact and cleans up after itself.
  std::string before = read_bytes(path);
  EXPECT_TRUE(throws_error_with([&] { save_safetensors(path, {{"a", one}, {"a", two}}); },
                                {"duplicate", "'a'"}));
  EXPECT_TRUE(throws_error_with([&] { save_safetensors(path, {{"u", Tensor()}}); },
                                {"undefined", "'u'"}));
  EXPECT_TRUE(throws_error_with([&] { save_safetensors(path, {{"__metadata__", one}}); },
                                {"reserved"}));
  EXPECT_TRUE(throws_error_with([&] { save_safetensors(path, {{"bad\xff", one}}); },
                                {"UTF-8"}));
  EXPECT_TRUE(throws_error_with(
      [&] { save_safetensors(tmp.file("no/such/dir/x.safetensors"), {{"a", one}}); },
      {"cannot create"}));
  EXPECT_EQ(read_bytes(path), before);
  size_t files = 0;
  for ([[maybe_unused]] const auto& item : std::filesystem::directory_iterator(tmp.path())) ++files;
  EXPECT_EQ(files, 1u);
}

TEST(SafetensorsWriter, RefusesHeadersOverTheLimit) {
  TempDir tmp;
  std::string name(100'000'000, 'n');  // the name alone fills the limit
  Tensor t = Tensor::from_values({1}, DType::f32, {1.0});
  EXPECT_TRUE(throws_error_with([&] { save_safetensors(tmp.file("big.safetensors"), {{name, t}}); },
                                {"exceeds", "100000000"}));
  EXPECT_FALSE(std::filesystem::exists(tmp.file("big.safetensors")));
}

}  // namespace
}  // namespace tiermoe
