// tiermoe train with the device tier, as a user runs it: the same losses on
// --device cpu as on the host, the tier's figures in --json and --metrics,
// the routing profile written and read, and clear errors for bad flags.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cli_fixture.h"
#include "tiermoe/io/tokens.h"

namespace tiermoe {
namespace {

using nlohmann::json;

// The tier runs' small run: 4 steps of 4 x 16 tokens on 2 threads, JSON out.
std::vector<std::string> tier_quick(std::vector<std::string> extra) {
  std::vector<std::string> args = {"train",   "--batch", "4",          "--seq-len", "16",
                                   "--steps", "4",       "--threads",  "2",         "--corpus-tokens",
                                   "4096",    "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

class CliTrainTier : public Cli {
 protected:
  // `how` on the host, then with every expert placed on an 8 MiB cpu
  // device: the same losses, and the device did compute. The host run's
  // stderr.
  std::string device_gives_host_losses(const std::vector<std::string>& how) {
    const RunResult host = run(tier_quick(how));
    EXPECT_EQ(host.rc, 0) << host.err;
    std::vector<std::string> dev_args = how;
    for (const char* a : {"--device", "cpu", "--device-memory", "8MiB", "--placement", "device"}) {
      dev_args.push_back(a);
    }
    const RunResult dev = run(tier_quick(dev_args));
    EXPECT_EQ(dev.rc, 0) << dev.err;
    if (host.rc == 0 && dev.rc == 0) {
      EXPECT_EQ(last_json_line(host.out).at("losses"), last_json_line(dev.out).at("losses"));
      EXPECT_GT(last_json_line(dev.out).at("device_calls").get<int64_t>(), 0);
    }
    return host.err;
  }
};

TEST_F(CliTrainTier, CpuDeviceGivesTheHostLossesAndReportsItsWork) {
  const RunResult host = run(tier_quick({}));
  ASSERT_EQ(host.rc, 0) << host.err;
  const std::string metrics = path("m.jsonl").string(), profile = path("p.json").string();
  const RunResult dev = run(tier_quick({"--device", "cpu", "--device-memory", "8MiB", "--placement",
                                   "device", "--metrics", metrics, "--profile-out", profile}));
  ASSERT_EQ(dev.rc, 0) << dev.err;
  const json h = last_json_line(host.out), d = last_json_line(dev.out);
  EXPECT_EQ(h.at("losses"), d.at("losses"));
  for (const char* key : {"hot_fraction", "device_calls", "bytes_up", "bytes_down", "replacements"})
    EXPECT_TRUE(d.contains(key)) << key;
  EXPECT_GT(d.at("hot_fraction").get<double>(), 0.5);  // every expert fits in 8 MiB
  EXPECT_GT(d.at("device_calls").get<int64_t>(), 0);
  EXPECT_TRUE(contains(dev.err, "tier: cost model (measured)")) << dev.err;
  // One metrics line per step, each with the tier's per-layer figures.
  std::istringstream lines(slurp(metrics));
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    const json m = json::parse(line);
    EXPECT_EQ(m.at("tier").at("layers").size(), 2u);
    EXPECT_TRUE(m.at("tier").contains("drift"));
    ++n;
  }
  EXPECT_EQ(n, 4);
  // The profile plans a later run's first step (experts resident at once).
  const RunResult again = run(tier_quick({"--device", "cpu", "--device-memory", "8MiB", "--placement",
                                     "device", "--profile-in", profile}));
  ASSERT_EQ(again.rc, 0) << again.err;
  EXPECT_EQ(last_json_line(again.out).at("losses"), h.at("losses"));
  EXPECT_GT(last_json_line(again.out).at("hot_fraction").get<double>(),
            d.at("hot_fraction").get<double>());  // step 1 ran on the device too
}

// gpt-oss's experts (biases, the clamped GLU) on the device tier give the
// host's losses: fully trained from the preset (bf16, the re-uploads after
// each AdamW step), and frozen under LoRA over MXFP4 experts decoded at load.
TEST_F(CliTrainTier, GptOssOnTheCpuDeviceGivesTheHostLosses) {
  const std::string model = std::string(TIERMOE_TEST_DATA_DIR) + "/mxfp4/model";
  std::vector<int32_t> tokens(4096);  // its vocabulary is 64
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 37 + i / 7) % 64);
  const std::string data = path("tokens.npy").string();
  write_npy_tokens(data, tokens, TokenDType::i32);
  const std::vector<std::vector<std::string>> runs = {
      {"--preset", "tiny-gpt-oss", "--dtype", "bf16"},
      {"--model", model, "--data", data, "--lora-rank", "2", "--dtype", "f32"}};
  for (const auto& how : runs) {
    SCOPED_TRACE(how[1]);
    device_gives_host_losses(how);
  }
}

// Experts kept at int4 (dequantized for their uploads) on the device tier
// give the host's losses: SwiGLU experts and gpt-oss's biased, clamped
// ones. (An upload that outlived its dequantized source once let the device
// compute with freed memory.) Every expert is placed on the device: the
// cost model's choice depends on timings; the placement's moves are
// TierParity's and the Python tests'.
TEST_F(CliTrainTier, QuantizedExpertsOnTheCpuDeviceGiveTheHostLosses) {
  for (const char* preset : {"tiny", "tiny-gpt-oss"}) {
    SCOPED_TRACE(preset);
    const std::string err = device_gives_host_losses({"--preset", preset, "--lora-rank", "2",
                                                      "--dtype", "bf16", "--experts", "int4",
                                                      "--experts-group", "32"});
    EXPECT_TRUE(contains(err, "experts: int4 g32, frozen")) << err;
  }
}

// DeepSeek-V3's MoE (sigmoid router with its correction bias, the shared
// expert beside the routed ones) around latent attention: the device tier
// gives the host's losses, fully trained in bf16 and under LoRA; and the
// same model under GLM-4.7-Flash's family spec, with DeepSeek-V2's router,
// and MiniMax-M2's (the selection bias held by the block); and Qwen3.5-MoE's
// Gated DeltaNet around gated attention.
TEST_F(CliTrainTier, DeepseekV3OnTheCpuDeviceGivesTheHostLosses) {
  const std::vector<std::vector<std::string>> runs = {
      {"--preset", "tiny-deepseek-v3", "--dtype", "bf16"},
      {"--preset", "tiny-deepseek-v3", "--lora-rank", "2", "--dtype", "f32"},
      {"--preset", "tiny-glm4-moe-lite", "--lora-rank", "2", "--dtype", "bf16"},
      {"--preset", "tiny-deepseek-v2", "--lora-rank", "2", "--dtype", "bf16"},
      {"--preset", "tiny-minimax-m2", "--lora-rank", "2", "--dtype", "bf16"},
      {"--preset", "tiny-qwen3.5-moe", "--lora-rank", "2", "--dtype", "bf16"}};
  for (const auto& how : runs) {
    SCOPED_TRACE(how.size());
    const RunResult host = run(tier_quick(how));
    ASSERT_EQ(host.rc, 0) << host.err;
    std::vector<std::string> dev_args = how;
    for (const char* a : {"--device", "cpu", "--device-memory", "8MiB", "--placement", "device"}) {
      dev_args.push_back(a);
    }
    const RunResult dev = run(tier_quick(dev_args));
    ASSERT_EQ(dev.rc, 0) << dev.err;
    EXPECT_EQ(last_json_line(host.out).at("losses"), last_json_line(dev.out).at("losses"));
    EXPECT_GT(last_json_line(dev.out).at("device_calls").get<int64_t>(), 0);
  }
}

TEST_F(CliTrainTier, PlacementHostKeepsEveryExpertOnTheHost) {
  const RunResult r =
      run(tier_quick({"--device", "cpu", "--device-memory", "8MiB", "--placement", "host"}));
  ASSERT_EQ(r.rc, 0) << r.err;
  const json j = last_json_line(r.out);
  EXPECT_EQ(j.at("hot_fraction").get<double>(), 0.0);
  EXPECT_EQ(j.at("device_calls").get<int64_t>(), 0);
}

TEST_F(CliTrainTier, ExpertAdaptersKeepTheExpertsOnTheHostAndSaySo) {
  const RunResult r = run(tier_quick({"--device", "cpu", "--device-memory", "8MiB", "--placement",
                                 "device", "--lora-rank", "4", "--lora-targets", "gate_proj"}));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "all experts stay on the host")) << r.err;
  const json j = last_json_line(r.out);
  EXPECT_EQ(j.at("hot_fraction").get<double>(), 0.0);
  EXPECT_EQ(j.at("replacements").get<int64_t>(), 0);
}

TEST_F(CliTrainTier, BadFlagsAreClearErrors) {
  struct Bad {
    std::vector<std::string> args;
    const char* says;
  };
  const fs::path wrong = path("wrong.json");
  {
    std::ofstream(wrong) << R"({"format": "tiermoe-routing-profile", "version": 1, "decay": 0.9,
      "steps": 1, "layers": 1, "experts": 2, "rows": [[1, 2]]})";
  }
  for (const Bad& b : {Bad{{"--device", "gpu", "--device-memory", "1MiB"}, "unknown --device"},
                       Bad{{"--device", "cpu"}, "needs --device-memory"},
                       Bad{{"--device", "cpu", "--device-memory", "1MiB", "--placement", "up"},
                           "--placement"},
                       Bad{{"--device", "cpu", "--device-memory", "100KiB"}, "out of memory"},
                       Bad{{"--device", "cpu", "--device-memory", "8MiB", "--profile-in",
                            wrong.string()},
                           "routing profile"}}) {
    const RunResult r = run(tier_quick(b.args));
    EXPECT_EQ(r.rc, 1) << b.says;
    EXPECT_TRUE(contains(r.err, b.says)) << b.says << ": " << r.err;
  }
}

}  // namespace
}  // namespace tiermoe
