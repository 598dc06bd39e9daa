// tiermoe quantize and init --experts: a family checkpoint's routed experts
// written at int4 and int8 in compressed-tensors' pack-quantized format (and
// gpt-oss's in MXFP4); TierMoE reads the file back to the very run that
// quantizes at load (eval --experts), bit for bit; bad flags and sources are
// refused before anything is written.
// (tests/python/test_quantize_interop.py reads the files with transformers
// and compressed-tensors.)
#include <nlohmann/json.hpp>

#include "cli_fixture.h"
#include "tiermoe/io/mxfp4.h"
#include "tiermoe/io/safetensors.h"

namespace tiermoe {
namespace {

const std::string kFamily = std::string(TIERMOE_TEST_DATA_DIR) + "/families/qwen3_moe_yarn";

class CliQuantize : public Cli {
 protected:
  double eval_loss(const std::string& model, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {
        "eval", "--model", model, "--data", kFamily + "/tokens.npy", "--batch", "2", "--seq-len",
        "8",    "--dtype", "f32", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const RunResult r = run(args);
    EXPECT_EQ(r.rc, 0) << r.err;
    return r.rc == 0 ? nlohmann::json::parse(r.out).at("loss").get<double>() : -1.0;
  }
};

TEST_F(CliQuantize, WritesWhatTheLoadTimeQuantizationRuns) {
  for (const char* f : {"int4", "int8"}) {
    SCOPED_TRACE(f);
    const std::string out = path(std::string("q_") + f).string();
    const RunResult r =
        run({"quantize", "--model", kFamily, "--out", out, "--experts", f, "--group", "16"});
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_TRUE(r.out.find("24 expert matrices at " + std::string(f)) != std::string::npos)
        << r.out;
    const nlohmann::json config = nlohmann::json::parse(slurp(out + "/config.json"));
    const nlohmann::json& q = config.at("quantization_config");
    EXPECT_EQ(q.at("quant_method"), "compressed-tensors");
    EXPECT_EQ(q.at("config_groups").at("group_0").at("weights").at("num_bits"),
              std::string(f) == "int4" ? 4 : 8);
    const SafetensorsFile file = SafetensorsFile::open(out + "/model.safetensors");
    const std::string m = "model.layers.1.mlp.experts.3.down_proj.";
    EXPECT_FALSE(file.contains(m + "weight"));
    EXPECT_EQ(file.entry(m + "weight_packed").dtype, "I32");
    EXPECT_EQ(file.entry(m + "weight_scale").shape, (Shape{32, 1}));  // D rows, F / 16 groups
    EXPECT_EQ(file.entry("model.layers.0.self_attn.q_proj.weight").dtype, "F64");  // as stored
    // inspect counts each packed matrix as its parameters.
    const RunResult in = run({"inspect", out, "--json", "--summary"});
    ASSERT_EQ(in.rc, 0) << in.out << in.err;
    const nlohmann::json j = nlohmann::json::parse(in.out);
    EXPECT_TRUE(j.at("consistent").get<bool>());
    EXPECT_EQ(j.at("stored_at_low_width").at(f).at("matrices"), 24);
    EXPECT_EQ(j.at("params").at("tensors_total"), j.at("params").at("total"));
    // The file runs exactly as quantizing at load does.
    EXPECT_EQ(eval_loss(out), eval_loss(kFamily, {"--experts", f, "--experts-group", "16"}));
    EXPECT_NE(eval_loss(out), eval_loss(kFamily));
  }
}

// init --experts packs each expert as it is drawn: the very files quantize
// writes from init's bf16 checkpoint of the same seed.
TEST_F(CliQuantize, InitWritesWhatQuantizeWritesFromTheSameDraw) {
  const std::vector<std::string> init = {"init",   "--preset", "tiny",    "--layers", "2",
                                         "--seed", "5",        "--dtype", "bf16"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = init;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const std::string bf16 = path("bf16").string(), q = path("q").string(),
                    direct = path("d").string();
  ASSERT_EQ(run(with({"--out", bf16})).rc, 0);
  ASSERT_EQ(run({"quantize", "--model", bf16, "--out", q, "--experts", "int4", "--group", "32"}).rc,
            0);
  const RunResult r = run(with({"--out", direct, "--experts", "int4", "--group", "32"}));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(r.out.find("(routed experts int4 g32)") != std::string::npos) << r.out;
  EXPECT_EQ(slurp(q + "/model.safetensors"), slurp(direct + "/model.safetensors"));
  EXPECT_EQ(slurp(q + "/config.json"), slurp(direct + "/config.json"));
  EXPECT_LT(fs::file_size(direct + "/model.safetensors"),
            fs::file_size(bf16 + "/model.safetensors"));
  const RunResult bad =
      run(with({"--out", path("x").string(), "--experts", "int4", "--group", "7"}));
  EXPECT_TRUE(bad.err.find("--group 7 does not divide") != std::string::npos) << bad.err;
}

// gpt-oss as its releases ship it: init --experts mxfp4 writes the fused
// experts' blocks and scales, each within the format's step of the bf16
// draw of the same seed; TierMoE reads them (inspect, a LoRA-style eval).
TEST_F(CliQuantize, InitWritesGptOssExpertsInMxfp4) {
  const std::string bf16 = path("bf16").string(), mx = path("mx").string();
  const std::vector<std::string> init = {"init", "--preset", "tiny-gpt-oss", "--seed",
                                         "2",    "--dtype",  "bf16",         "--out"};
  auto args = [&](const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> a = init;
    a.push_back(out);
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  ASSERT_EQ(run(args(bf16, {})).rc, 0);
  const RunResult r = run(args(mx, {"--experts", "mxfp4"}));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(slurp(mx + "/config.json"))
                .at("quantization_config")
                .at("quant_method"),
            "mxfp4");
  const CheckpointTensors drawn = CheckpointTensors::open(bf16),
                          packed = CheckpointTensors::open(mx);
  int stacks = 0;
  for (const std::string& name : drawn.names()) {
    if (!name.ends_with("experts.gate_up_proj") && !name.ends_with("experts.down_proj")) continue;
    ++stacks;
    const Tensor w = drawn.load(name, DType::f32);          // [E, in, out]
    const Tensor d = load_mxfp4(packed, name, DType::f32);  // [E, out, in]
    const int64_t E = w.size(0), K = w.size(1), R = w.size(2);
    ASSERT_EQ(d.shape(), (Shape{E, R, K}));
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t o = 0; o < R; ++o) {
        for (int64_t b = 0; b < K / 32; ++b) {
          double amax = 0;
          for (int64_t k = b * 32; k < b * 32 + 32; ++k)
            amax = std::max(amax, std::abs(w.get((e * K + k) * R + o)));
          for (int64_t k = b * 32; k < b * 32 + 32; ++k) {
            // Half of the top step (2 x 2^e, 2^e <= amax / 4), or the saturation.
            ASSERT_LE(std::abs(d.get((e * R + o) * K + k) - w.get((e * K + k) * R + o)), amax / 2)
                << name << " expert " << e << " row " << o << " col " << k;
          }
        }
      }
    }
  }
  EXPECT_EQ(stacks, 4);  // 2 layers x (gate_up, down)
  const RunResult in = run({"inspect", mx, "--summary"});
  EXPECT_EQ(in.rc, 0) << in.out << in.err;
  // A LoRA run over it in bf16 maps the blocks as stored, and the plan says
  // so (it once subtracted transposed copies that MXFP4 experts never make).
  const std::string lora_out = path("lora").string();
  const RunResult lora = run({"train",  "--model",         mx,     "--lora-rank", "2", "--dtype",
                              "bf16",   "--steps",         "2",    "--batch",     "2", "--seq-len",
                              "16",     "--corpus-tokens", "4096", "--threads",   "2", "--out",
                              lora_out, "--json"});
  ASSERT_EQ(lora.rc, 0) << lora.err;
  const nlohmann::json plan = last_json_line(lora.out).at("memory_plan");
  for (const auto& [tag, m] : plan.items()) {
    if (tag == "total") continue;
    const double predicted = m.at("predicted").get<double>(), measured = m.at("measured");
    if (measured == 0) {
      EXPECT_EQ(predicted, 0) << tag;
    } else {
      EXPECT_NEAR(predicted / measured, 1.0, 0.10) << tag;
    }
  }
  const RunResult bad =
      run({"init", "--preset", "tiny", "--out", path("t").string(), "--experts", "mxfp4"});
  EXPECT_TRUE(bad.err.find("--experts mxfp4 is not written for qwen3_moe") != std::string::npos)
      << bad.err;
}

TEST_F(CliQuantize, BadFlagsAndSourcesAreRefused) {
  const std::string out = path("q").string();
  RunResult r =
      run({"quantize", "--model", kFamily, "--out", out, "--experts", "int4", "--group", "5"});
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(r.err.find("--group 5 does not divide") != std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out + "/config.json"));
  r = run({"quantize", "--model", kFamily, "--out", out, "--experts", "fp8"});
  EXPECT_TRUE(r.err.find("--experts fp8 is not written by quantize") != std::string::npos) << r.err;
  ASSERT_EQ(
      run({"quantize", "--model", kFamily, "--out", out, "--experts", "int4", "--group", "16"}).rc,
      0);
  r = run({"quantize", "--model", kFamily, "--out", out, "--experts", "int4", "--group", "16"});
  EXPECT_TRUE(r.err.find("already holds a checkpoint") != std::string::npos) << r.err;
  r = run({"quantize", "--model", out, "--out", path("qq").string(), "--experts", "int4"});
  EXPECT_TRUE(r.err.find("already ships quantized weights (compressed-tensors)") !=
              std::string::npos)
      << r.err;
  // A run asked to quantize experts the checkpoint ships quantized.
  r = run({"eval", "--model", out, "--data", kFamily + "/tokens.npy", "--batch", "1", "--seq-len",
           "8", "--experts", "int8"});
  EXPECT_TRUE(r.err.find("already ships") != std::string::npos) << r.err;
}

}  // namespace
}  // namespace tiermoe
