// Runs the built tiermoe binary (TIERMOE_CLI_PATH) as a user would and checks
// its files, output and exit codes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sys/wait.h>

#include "cli_fixture.h"
#include "common/testing.h"
#include "tiermoe/io/hf_names.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/io/safetensors.h"

namespace tiermoe {
namespace {

TEST_F(Cli, InitTinyWritesTheHfTensorsForEveryDtype) {
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    const std::string name(dtype_name(dt));
    fs::path out = init(name, {"--dtype", name, "--seed", "3"});
    ModelConfig config = load_model_config(out.string());
    ModelConfig want = preset("tiny");
    EXPECT_EQ(config.torch_dtype, dt == DType::bf16 ? "bfloat16"
                                  : dt == DType::f32 ? "float32"
                                                     : "float64");
    want.torch_dtype = config.torch_dtype;
    EXPECT_EQ(config.to_json(), want.to_json());

    CheckpointTensors ckpt = CheckpointTensors::open(out.string());
    const auto expected = hf_tensors(config);
    std::set<std::string> expected_names;
    for (const HfTensor& t : expected) {
      expected_names.insert(t.name);
      ASSERT_TRUE(ckpt.contains(t.name)) << t.name;
      const SafetensorsEntry& e = ckpt.entry(t.name);
      EXPECT_EQ(e.shape, t.shape) << t.name;
      EXPECT_EQ(e.dtype, safetensors_dtype_name(dt)) << t.name;
      if (t.role == HfRole::norm) {
        Tensor w = ckpt.view(t.name);
        for (int64_t i = 0; i < w.numel(); ++i) ASSERT_EQ(w.get(i), 1.0) << t.name;
      }
    }
    auto names = ckpt.names();
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected_names);

    // The embedding (16384 values) looks like normal(0, initializer_range).
    Tensor emb = ckpt.view("model.embed_tokens.weight");
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < emb.numel(); ++i) sum += emb.get(i), sq += emb.get(i) * emb.get(i);
    const double n = double(emb.numel()), mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
    EXPECT_LT(std::abs(mean), 5 * 0.02 / std::sqrt(n)) << name;
    EXPECT_NEAR(sd, 0.02, 0.001) << name;
  }
}

TEST_F(Cli, InitIsReproducibleFromTheSeed) {
  fs::path a = init("a", {"--seed", "11"});
  fs::path b = init("b", {"--seed", "11"});
  fs::path c = init("c", {"--seed", "12"});
  EXPECT_EQ(slurp(a / "model.safetensors"), slurp(b / "model.safetensors"));
  EXPECT_EQ(slurp(a / "config.json"), slurp(b / "config.json"));
  EXPECT_NE(slurp(a / "model.safetensors"), slurp(c / "model.safetensors"));
}

TEST_F(Cli, InitRoundTripsBitExactThroughTheReader) {
  for (DType dt : {DType::bf16, DType::f64}) {
    const std::string name(dtype_name(dt));
    fs::path out = init(name, {"--dtype", name, "--seed", "5"});
    ModelConfig config = load_model_config(out.string());
    CheckpointTensors ckpt = CheckpointTensors::open(out.string());
    for (const HfTensor& t : hf_tensors(config)) {
      ASSERT_TRUE(testing::bitwise_equal(ckpt.view(t.name), init_hf_tensor(t, config, 5, dt),
                                         t.name));
    }
  }
}

TEST_F(Cli, InitLayersOverridesThePresetAndKeepsTheFirstLayers) {
  fs::path deep = init("deep", {"--layers", "3", "--seed", "9"});
  fs::path base = init("base", {"--seed", "9"});
  EXPECT_EQ(load_model_config(deep.string()).num_hidden_layers, 3);
  CheckpointTensors d = CheckpointTensors::open(deep.string());
  CheckpointTensors b = CheckpointTensors::open(base.string());
  EXPECT_TRUE(d.contains("model.layers.2.mlp.experts.7.down_proj.weight"));
  EXPECT_FALSE(b.contains("model.layers.2.input_layernorm.weight"));
  for (const std::string& name : b.names()) {
    ASSERT_TRUE(testing::bitwise_equal(d.view(name), b.view(name), name));
  }
}

TEST_F(Cli, InitShardsAboveTheLimitAndForceReplacesTheShards) {
  fs::path one = init("one", {"--dtype", "f32"});
  fs::path sharded = init("sharded", {"--dtype", "f32", "--max-shard-size", "100KB"});
  EXPECT_TRUE(fs::exists(sharded / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(sharded / "model.safetensors"));
  CheckpointTensors s = CheckpointTensors::open(sharded.string());
  CheckpointTensors o = CheckpointTensors::open(one.string());
  EXPECT_GT(s.files().size(), 5u);  // ~630 KB of f32 in shards of at most 100 KB
  for (const auto& f : s.files()) EXPECT_LE(fs::file_size(f.path()), 100'000u + 16'384u);
  EXPECT_EQ(s.names(), o.names());
  for (const std::string& name : o.names()) {
    ASSERT_TRUE(testing::bitwise_equal(s.view(name), o.view(name), name));
  }
  // --force over a sharded checkpoint leaves one file and no stale shard.
  RunResult r = run({"init", "--preset", "tiny", "--out", sharded.string(), "--force"});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(sharded)) left.push_back(e.path().filename());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"config.json", "model.safetensors"}));
}

TEST_F(Cli, InitRefusesAnExistingCheckpointWithoutForce) {
  fs::path out = init("ckpt");
  std::string before = slurp(out / "model.safetensors");
  RunResult r = run({"init", "--preset", "tiny", "--out", out.string(), "--seed", "1"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "error: ")) << r.err;
  EXPECT_TRUE(contains(r.err, "--force")) << r.err;
  EXPECT_EQ(slurp(out / "model.safetensors"), before);
  r = run({"init", "--preset", "tiny", "--out", out.string(), "--seed", "1", "--force"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(slurp(out / "model.safetensors"), before);
}

TEST_F(Cli, InspectCheckpointListsTensorsAndCounts) {
  fs::path out = init("ckpt");
  const ModelConfig config = load_model_config(out.string());
  const ParamCounts counts = param_counts(config);

  RunResult r = run({"inspect", out.string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  for (const HfTensor& t : hf_tensors(config)) {
    EXPECT_TRUE(contains(r.out, t.name + " ")) << t.name;
  }
  const std::string row = "model.layers.1.mlp.experts.7.down_proj.weight ";
  const size_t at = r.out.find(row);
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  EXPECT_TRUE(contains(line, " BF16 ") && contains(line, " [64, 32] ") && line.ends_with(" 4096"))
      << line;
  EXPECT_TRUE(contains(r.out, "qwen3_moe, 2 layers (MoE layers: all)")) << r.out;
  EXPECT_TRUE(contains(r.out, "tensors match config.json")) << r.out;
  EXPECT_TRUE(contains(r.out, "metadata format=pt")) << r.out;

  r = run({"inspect", out.string(), "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["kind"], "checkpoint");
  EXPECT_EQ(j["tensor_count"], hf_tensors(config).size());
  EXPECT_EQ(j["tensors"].size(), hf_tensors(config).size());
  EXPECT_EQ(j["tensors"][0]["name"], "model.embed_tokens.weight");  // module order
  EXPECT_EQ(j["tensors"][0]["shape"], (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(j["tensors"][0]["bytes"], 256 * 64 * 2);
  EXPECT_EQ(j["params"]["total"], counts.total);
  EXPECT_EQ(j["params"]["tensors_total"], counts.total);
  EXPECT_EQ(j["params"]["per_expert"], counts.per_expert);
  EXPECT_EQ(j["params"]["active_per_token"], counts.active_per_token);
  EXPECT_EQ(j["params"]["tensors_experts"], counts.experts);
  EXPECT_EQ(j["config"]["num_experts"], 8);
  EXPECT_EQ(j["config"]["moe_layers"], (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(j["consistent"], true);
}

TEST_F(Cli, InspectSafetensorsFile) {
  fs::path out = init("ckpt", {"--dtype", "f64"});
  RunResult r = run({"inspect", (out / "model.safetensors").string(), "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["kind"], "safetensors");
  EXPECT_FALSE(j.contains("config"));
  EXPECT_EQ(j["files"][0]["metadata"]["format"], "pt");
  for (const auto& t : j["tensors"]) EXPECT_EQ(t["dtype"], "F64");
  EXPECT_EQ(j["tensor_params"], param_counts(preset("tiny")).total);
}

TEST_F(Cli, InspectReportsACheckpointThatDoesNotMatchItsConfig) {
  fs::path out = init("ckpt");
  ModelConfig fewer = load_model_config(out.string());
  fewer.num_experts = 6;  // experts 6 and 7 are now unexpected, routers the wrong shape
  save_model_config(fewer, (out / "config.json").string());
  RunResult r = run({"inspect", out.string(), "--summary"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.out, "unexpected  model.layers.0.mlp.experts.7.up_proj.weight")) << r.out;
  EXPECT_TRUE(contains(r.out, "shape       model.layers.1.mlp.gate.weight: expected [6, 64], "
                              "got [8, 64]"))
      << r.out;
  EXPECT_TRUE(contains(r.err, "error: the checkpoint does not match its config.json")) << r.err;
}

// transformers 5's save_pretrained(save_original_format=False) stores each MoE
// layer's experts fused: gate_up_proj [E, 2F, D] (gate rows first) and
// down_proj [E, D, F]. eval and train read it; inspect must accept it too.
TEST_F(Cli, InspectAcceptsTheFusedExpertLayout) {
  fs::path out = init("ckpt");
  const ModelConfig c = load_model_config(out.string());
  const int64_t E = c.num_experts, F = c.moe_intermediate_size, D = c.hidden_size;
  NamedTensors fused;
  {
    CheckpointTensors ck = CheckpointTensors::open(out.string());
    for (const std::string& name : ck.names()) {
      if (!contains(name, ".experts.")) fused.emplace_back(name, ck.view(name).clone());
    }
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
      Tensor gu = Tensor::empty({E, 2 * F, D}, DType::bf16);
      Tensor down = Tensor::empty({E, D, F}, DType::bf16);
      for (int64_t e = 0; e < E; ++e) {
        const std::string ep = p + std::to_string(e) + ".";
        gu.select(e).rows(0, F).copy_from(ck.view(ep + "gate_proj.weight"));
        gu.select(e).rows(F, 2 * F).copy_from(ck.view(ep + "up_proj.weight"));
        down.select(e).copy_from(ck.view(ep + "down_proj.weight"));
      }
      fused.emplace_back(p + "gate_up_proj", gu);
      fused.emplace_back(p + "down_proj", down);
    }
  }
  save_checkpoint_tensors(out.string(), fused);
  RunResult r = run({"inspect", out.string(), "--json"});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["consistent"], true) << j["mismatches"].dump();
  EXPECT_EQ(j["params"]["tensors_experts"], param_counts(c).experts);
  EXPECT_EQ(j["params"]["tensors_total"], param_counts(c).total);

  // A fused tensor of the wrong shape is still named.
  for (auto& [name, t] : fused) {
    if (name == "model.layers.1.mlp.experts.down_proj") t = Tensor::zeros({E, D, F - 1}, DType::bf16);
  }
  save_checkpoint_tensors(out.string(), fused);
  r = run({"inspect", out.string(), "--summary"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.out, "shape       model.layers.1.mlp.experts.down_proj: expected [8, 64, 32]"))
      << r.out;
}

// A tied config that also stores lm_head.weight loads (transformers ties or
// unties it by its values), so inspect does not call the head unexpected.
TEST_F(Cli, InspectAcceptsAStoredHeadBesideATiedConfig) {
  fs::path out = init("ckpt");
  ModelConfig c = load_model_config(out.string());
  ASSERT_FALSE(c.tie_word_embeddings);
  c.tie_word_embeddings = true;
  save_model_config(c, (out / "config.json").string());
  RunResult r = run({"inspect", out.string(), "--json", "--summary"});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["consistent"], true);
}

TEST_F(Cli, InspectOfAMalformedFileFailsWithTheReadersError) {
  std::ofstream(path("bad.safetensors"), std::ios::binary) << "not a safetensors file";
  RunResult r = run({"inspect", path("bad.safetensors").string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "error: ")) << r.err;
  EXPECT_TRUE(contains(r.err, path("bad.safetensors").string())) << r.err;

  fs::path out = init("ckpt");
  fs::resize_file(out / "model.safetensors", fs::file_size(out / "model.safetensors") - 10);
  r = run({"inspect", out.string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "model.safetensors")) << r.err;

  r = run({"inspect", path("missing").string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "error: ")) << r.err;
}

TEST_F(Cli, HelpAndVersionWorkEverywhere) {
  const std::string version = std::string("tiermoe ") + TIERMOE_VERSION + "\n";
  for (std::vector<std::string> args :
       {std::vector<std::string>{"--version"}, {"init", "--version"}, {"inspect", "--version"}}) {
    RunResult r = run(args);
    EXPECT_EQ(r.rc, 0) << args[0];
    EXPECT_EQ(r.out, version);
  }
  RunResult r = run({"--help"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_TRUE(contains(r.out, "init") && contains(r.out, "inspect")) << r.out;
  r = run({"init", "--help"});
  EXPECT_EQ(r.rc, 0);
  for (const char* flag : {"--preset", "--out", "--seed", "--dtype", "--layers",
                           "--max-shard-size", "--force"}) {
    EXPECT_TRUE(contains(r.out, flag)) << flag << "\n" << r.out;
  }
  r = run({"inspect", "--help"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_TRUE(contains(r.out, "--json")) << r.out;
}

TEST_F(Cli, BadFlagsGiveClearErrors) {
  const std::string out = path("x").string();
  struct Case {
    std::vector<std::string> args;
    int rc;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"init", "--preset", "huge", "--out", out}, 1, "unknown preset 'huge'"},
      {{"init", "--preset", "huge", "--out", out},
       1,
       "tiny, tiny-qwen2-moe, tiny-glm4-moe, tiny-gpt-oss, tiny-deepseek-v3, tiny-glm4-moe-lite, "
       "tiny-deepseek-v2, tiny-minimax-m2, tiny-qwen3.5-moe, small, qwen3-30b-a3b, "
       "qwen2-57b-a14b, glm-4.5-air, gpt-oss-20b, gpt-oss-120b, deepseek-v3, kimi-k2, "
       "glm-4.7-flash, deepseek-v2, deepseek-v2-lite, minimax-m2, qwen3.5-35b-a3b"},
      {{"init", "--preset", "tiny", "--out", out, "--dtype", "f16"}, 1, "unknown dtype 'f16'"},
      {{"init", "--preset", "tiny", "--out", out, "--layers", "0"}, 2, "--layers"},
      {{"init", "--preset", "tiny", "--out", out, "--max-shard-size", "lots"},
       1,
       "cannot read 'lots' as a byte count"},
      {{"init", "--preset", "tiny", "--out", out, "--seed", "-3"}, 2, "--seed"},
      {{"init", "--preset", "tiny"}, 2, "--out is required"},
      {{"init", "--preset", "tiny", "--out", out, "--bogus"}, 2, "--bogus"},
      {{"frobnicate"}, 2, "A subcommand is required"},
      {{}, 2, "subcommand"},
  };
  for (const Case& c : cases) {
    RunResult r = run(c.args);
    std::string shown;
    for (const auto& a : c.args) shown += a + " ";
    EXPECT_EQ(r.rc, c.rc) << shown << "\n" << r.err;
    EXPECT_TRUE(contains(r.err, c.message)) << shown << "\n" << r.err;
    EXPECT_TRUE(r.err.starts_with("error: ")) << r.err;
  }
  EXPECT_FALSE(fs::exists(path("x") / "config.json"));
}

// Qwen3.5's release as shipped: inspect reads its text model (the config's
// text_config, the weights under model.language_model.) and counts the
// vision tower and the mtp. tensor apart, as tensors the model does not read.
TEST_F(Cli, InspectOfAMultimodalReleaseCountsWhatTheModelDoesNotRead) {
  const std::string dir = std::string(TIERMOE_TEST_DATA_DIR) + "/families/qwen3_5_moe_multimodal";
  RunResult r = run({"inspect", dir, "--json", "--summary"});
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["consistent"], true) << j["mismatches"].dump();
  const ModelConfig c = load_model_config(dir);
  const int64_t unread = j["params"]["tensors_unread"];
  EXPECT_GT(unread, 0);
  EXPECT_EQ(int64_t(j["params"]["tensors_total"]) - unread, param_counts(c).total);
  r = run({"inspect", dir, "--summary"});
  EXPECT_TRUE(contains(r.out, "in tensors the model does not read")) << r.out;
}

}  // namespace
}  // namespace tiermoe
