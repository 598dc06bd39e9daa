// Sharded checkpoints: huggingface_hub's split and naming, the index, reading
// back through CheckpointTensors, and index errors.
#include <nlohmann/json.hpp>

#include "common/testing.h"
#include "io/test_safetensors_util.h"
#include "tiermoe/io/safetensors.h"

namespace tiermoe {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::throws_error_with;

// t0..t3 (16 bytes each), big (120 bytes), t4..t6: with a 40-byte limit the
// hub's split gives [t0 t1] [big] [t2 t3] [t4 t5] [t6].
NamedTensors shard_tensors() {
  Rng rng(11);
  NamedTensors out;
  for (int i = 0; i < 4; ++i) {
    out.push_back({"t" + std::to_string(i), testing::random_tensor({4}, DType::f32, rng)});
  }
  out.push_back({"big", testing::random_tensor({15}, DType::f64, rng)});
  for (int i = 4; i < 7; ++i) {
    out.push_back({"t" + std::to_string(i), testing::random_tensor({2, 4}, DType::bf16, rng)});
  }
  return out;
}

nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(testing::read_bytes(path));
}

void write_json(const std::string& path, const nlohmann::json& j) {
  testing::write_bytes(path, j.dump(2));
}

std::vector<std::string> file_names(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& item : fs::directory_iterator(dir)) names.push_back(item.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(SafetensorsCheckpoint, SmallCheckpointIsOneFileWithoutIndex) {
  TempDir tmp;
  NamedTensors tensors = shard_tensors();
  std::vector<std::string> written = save_checkpoint_tensors(tmp.path(), tensors);
  EXPECT_EQ(written, (std::vector<std::string>{tmp.file("model.safetensors")}));
  EXPECT_EQ(file_names(tmp.path()), (std::vector<std::string>{"model.safetensors"}));

  CheckpointTensors ckpt = CheckpointTensors::open(tmp.path());
  EXPECT_EQ(ckpt.files().size(), 1u);
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"big", "t0", "t1", "t2", "t3", "t4", "t5",
                                                    "t6"}));
  for (const auto& [name, want] : tensors) {
    EXPECT_TRUE(testing::bitwise_equal(ckpt.view(name), want, name));
  }
  // A .safetensors file on its own opens as a one-file checkpoint.
  EXPECT_EQ(CheckpointTensors::open(tmp.file("model.safetensors")).names().size(), 8u);
}

TEST(SafetensorsCheckpoint, ShardsFollowTheHubSplitAndIndex) {
  TempDir tmp;
  NamedTensors tensors = shard_tensors();
  std::vector<std::string> written = save_checkpoint_tensors(tmp.path(), tensors, 40);

  std::vector<std::vector<std::string>> want_shards = {
      {"t0", "t1"}, {"big"}, {"t2", "t3"}, {"t4", "t5"}, {"t6"}};
  ASSERT_EQ(written.size(), want_shards.size() + 1);
  EXPECT_EQ(written.back(), tmp.file("model.safetensors.index.json"));
  uint64_t total = 0;
  for (const auto& [name, t] : tensors) total += t.nbytes();

  nlohmann::json index = read_json(written.back());
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(index["weight_map"].size(), tensors.size());
  for (size_t i = 0; i < want_shards.size(); ++i) {
    std::string name = "model-0000" + std::to_string(i + 1) + "-of-00005.safetensors";
    EXPECT_EQ(written[i], tmp.file(name));
    SafetensorsFile shard = SafetensorsFile::open(written[i]);
    std::vector<std::string> got;
    for (const auto& e : shard.entries()) got.push_back(e.name);
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, want_shards[i]) << name;
    EXPECT_EQ(shard.metadata().at("format"), "pt");
    for (const auto& tensor : got) EXPECT_EQ(index["weight_map"][tensor], name);
  }

  CheckpointTensors ckpt = CheckpointTensors::open(tmp.path());
  EXPECT_EQ(ckpt.files().size(), want_shards.size());
  EXPECT_EQ(ckpt.names().size(), tensors.size());
  EXPECT_EQ(ckpt.file_of("big").entries().size(), 1u);
  for (const auto& [name, want] : tensors) {
    EXPECT_TRUE(testing::bitwise_equal(ckpt.view(name), want, name));
    EXPECT_EQ(ckpt.entry(name).shape, want.shape());
    EXPECT_TRUE(testing::bitwise_equal(ckpt.load(name, DType::f32), want.to(DType::f32), name));
  }
  EXPECT_TRUE(throws_error_with([&] { ckpt.view("nope"); }, {"'nope'", "checkpoint"}));
}

TEST(SafetensorsCheckpoint, ShardPlanAndNamesForStreamingWriters) {
  using Plan = std::vector<std::vector<size_t>>;
  EXPECT_EQ(plan_checkpoint_shards({16, 16, 16, 16, 120, 16, 16, 16}, 40),
            (Plan{{0, 1}, {4}, {2, 3}, {5, 6}, {7}}));
  EXPECT_EQ(plan_checkpoint_shards({5, 5}, 10), (Plan{{0, 1}}));
  EXPECT_EQ(plan_checkpoint_shards({}, 10), (Plan{{}}));
  EXPECT_EQ(plan_checkpoint_shards({50}, 10), (Plan{{0}}));
  EXPECT_EQ(checkpoint_shard_name(0, 1), "model.safetensors");
  EXPECT_EQ(checkpoint_shard_name(2, 16), "model-00003-of-00016.safetensors");

  TempDir tmp;
  Tensor t = Tensor::from_values({2}, DType::f32, {1.0, 2.0});
  save_safetensors(tmp.file(checkpoint_shard_name(0, 2)), {{"a", t}});
  save_safetensors(tmp.file(checkpoint_shard_name(1, 2)), {{"b", t}});
  save_checkpoint_index(tmp.path(), {{"a", checkpoint_shard_name(0, 2)},
                                     {"b", checkpoint_shard_name(1, 2)}},
                        16);
  EXPECT_EQ(testing::read_bytes(tmp.file("model.safetensors.index.json")),
            "{\n  \"metadata\": {\n    \"total_size\": 16\n  },\n  \"weight_map\": {\n"
            "    \"a\": \"model-00001-of-00002.safetensors\",\n"
            "    \"b\": \"model-00002-of-00002.safetensors\"\n  }\n}\n");
  EXPECT_EQ(CheckpointTensors::open(tmp.path()).names(), (std::vector<std::string>{"a", "b"}));
}

TEST(SafetensorsCheckpoint, ResavingRemovesTheOtherLayoutsFiles) {
  TempDir tmp;
  NamedTensors tensors = shard_tensors();
  save_checkpoint_tensors(tmp.path(), tensors, 40);
  save_checkpoint_tensors(tmp.path(), tensors);
  EXPECT_EQ(file_names(tmp.path()), (std::vector<std::string>{"model.safetensors"}));
  testing::write_bytes(tmp.file("config.json"), "{}");  // not ours: must survive
  save_checkpoint_tensors(tmp.path(), tensors, 200);
  std::vector<std::string> names = file_names(tmp.path());
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "model-00001-of-00002.safetensors",
                                             "model-00002-of-00002.safetensors",
                                             "model.safetensors.index.json"}));
  EXPECT_EQ(CheckpointTensors::open(tmp.path()).names().size(), tensors.size());
}

TEST(SafetensorsCheckpoint, IndexErrorsNameTheRuleAndTheTensor) {
  TempDir tmp;
  NamedTensors tensors = shard_tensors();
  save_checkpoint_tensors(tmp.path(), tensors, 40);
  const std::string index_path = tmp.file("model.safetensors.index.json");
  const nlohmann::json good = read_json(index_path);
  auto open = [&] { CheckpointTensors::open(tmp.path()); };

  nlohmann::json moved = good;  // t0 really lives in shard 1
  moved["weight_map"]["t0"] = "model-00003-of-00005.safetensors";
  write_json(index_path, moved);
  EXPECT_TRUE(throws_error_with(open, {"'t0'", "missing from it", "index.json"}));

  nlohmann::json unlisted = good;
  unlisted["weight_map"].erase("t5");  // its shard stays listed through t4
  write_json(index_path, unlisted);
  EXPECT_TRUE(throws_error_with(open, {"'t5'", "not listed"}));

  nlohmann::json traversal = good;
  traversal["weight_map"]["t0"] = "../model-00001-of-00005.safetensors";
  write_json(index_path, traversal);
  EXPECT_TRUE(throws_error_with(open, {"not a plain file name"}));

  write_json(index_path, nlohmann::json{{"metadata", {{"total_size", 1}}}});
  EXPECT_TRUE(throws_error_with(open, {"weight_map"}));
  testing::write_bytes(index_path, "{\"weight_map\": {\"t0\": ");
  EXPECT_TRUE(throws_error_with(open, {"not valid JSON", "index.json"}));

  // Unknown metadata keys are ignored.
  nlohmann::json extra = good;
  extra["metadata"]["format"] = {{"nested", {1, 2, 3}}};
  write_json(index_path, extra);
  EXPECT_NO_THROW(open());

  write_json(index_path, good);
  fs::remove(tmp.file("model-00004-of-00005.safetensors"));
  EXPECT_TRUE(throws_error_with(open, {"model-00004-of-00005.safetensors", "does not exist"}));
}

TEST(SafetensorsCheckpoint, ATensorInTwoShardsIsAnError) {
  TempDir tmp;
  Tensor t = Tensor::from_values({2}, DType::f32, {1.0, 2.0});
  save_safetensors(tmp.file("a.safetensors"), {{"x", t}, {"y", t}});
  save_safetensors(tmp.file("b.safetensors"), {{"x", t}});
  write_json(tmp.file("model.safetensors.index.json"),
             {{"weight_map", {{"x", "a.safetensors"}, {"y", "b.safetensors"}}}});
  EXPECT_TRUE(throws_error_with([&] { CheckpointTensors::open(tmp.path()); },
                                {"'x'", "two shards", "a.safetensors", "b.safetensors"}));
}

// transformers loads model.safetensors first when an index lies beside it;
// TierMoE read the index.
TEST(SafetensorsCheckpoint, ASingleFileBesideAnIndexWinsAsInTransformers) {
  TempDir tmp;
  save_safetensors(tmp.file("a.safetensors"), {{"x", Tensor::from_values({1}, DType::f32, {1})}});
  write_json(tmp.file("model.safetensors.index.json"), {{"weight_map", {{"x", "a.safetensors"}}}});
  save_safetensors(tmp.file("model.safetensors"),
                   {{"x", Tensor::from_values({1}, DType::f32, {2})}});
  CheckpointTensors ck = CheckpointTensors::open(tmp.path());
  EXPECT_EQ(ck.load("x", DType::f32).get(0), 2.0);
}

// A shard linked to /dev/zero or to a directory says what stands there.
TEST(SafetensorsCheckpoint, AShardThatIsNoFileSaysWhatItIs) {
  TempDir tmp;
  write_json(tmp.file("model.safetensors.index.json"), {{"weight_map", {{"x", "a.safetensors"}}}});
  fs::create_symlink("/dev/zero", tmp.file("a.safetensors"));
  EXPECT_TRUE(throws_error_with([&] { CheckpointTensors::open(tmp.path()); },
                                {"\"a.safetensors\" listed in", "character device"}));
  fs::remove(tmp.file("a.safetensors"));
  fs::create_directories(tmp.file("a.safetensors"));
  EXPECT_TRUE(throws_error_with([&] { CheckpointTensors::open(tmp.path()); },
                                {"\"a.safetensors\" listed in", "directory"}));
}

TEST(SafetensorsCheckpoint, MissingOrEmptyDirectoryIsAClearError) {
  TempDir tmp;
  EXPECT_TRUE(throws_error_with([&] { CheckpointTensors::open(tmp.path()); },
                                {"no model.safetensors"}));
  EXPECT_TRUE(throws_error_with([&] { CheckpointTensors::open(tmp.file("absent")); },
                                {"does not exist", "absent"}));
  // A damaged shard reports the shard's own file.
  testing::write_bytes(tmp.file("model.safetensors"), "short");
  EXPECT_TRUE(throws_error_with([&] { CheckpointTensors::open(tmp.path()); },
                                {"too short", "model.safetensors"}));
}

TEST(SafetensorsCheckpoint, WriterRefusesBadInput) {
  TempDir tmp;
  Tensor t = Tensor::from_values({1}, DType::f32, {1.0});
  EXPECT_TRUE(throws_error_with(
      [&] { save_checkpoint_tensors(tmp.path(), {{"x", t}, {"x", t}}, 1000); },
      {"duplicate", "'x'"}));
  EXPECT_TRUE(throws_error_with([&] { save_checkpoint_tensors(tmp.path(), {{"x", t}}, 0); },
                                {"max_shard_bytes"}));
  EXPECT_TRUE(file_names(tmp.path()).empty());
}

}  // namespace
}  // namespace tiermoe
