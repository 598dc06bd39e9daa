// tiermoe eval as outside tools run it (docs/architecture.md, the command-line contract): against
// the PyTorch twin fixtures of tests/data/model/ (README.md there), loss to
// 1e-9 relative and every gradient of --save-grads to
// 1e-9 * |want| + 1e-9 * max|want| of its tensor; the f32 and bf16 runs near
// the f64 one; and clear errors, with nothing written, for bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli_fixture.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/io/tokens.h"

namespace tiermoe {
namespace {

const std::string kFixtures = std::string(TIERMOE_TEST_DATA_DIR) + "/model/";

nlohmann::json expected_of(const std::string& fixture) {
  return nlohmann::json::parse(slurp(kFixtures + fixture + "/expected.json"));
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(t.get(i)));
  return m;
}

// The worst element, over all tensors, of |got - want| / (rtol * |want| +
// floor * max|want| of its tensor); <= 1 passes. Names, shapes and the file's
// dtype are checked on the way.
struct GradComparison {
  double worst = 0;
  std::string worst_at = "(none)";
  double relative_l2 = 0;  // ||got - want|| / ||want|| over all tensors together
};

GradComparison compare_grads(const std::string& got_path, const std::string& want_path,
                             const std::string& want_dtype, double rtol, double floor) {
  GradComparison c;
  SafetensorsFile got = SafetensorsFile::open(got_path);
  SafetensorsFile want = SafetensorsFile::open(want_path);
  std::vector<std::string> got_names, want_names;
  for (const auto& e : got.entries()) got_names.push_back(e.name);
  for (const auto& e : want.entries()) want_names.push_back(e.name);
  std::sort(got_names.begin(), got_names.end());
  std::sort(want_names.begin(), want_names.end());
  EXPECT_EQ(got_names, want_names) << "the gradient name sets differ";

  double diff_sq = 0, want_sq = 0;
  for (const std::string& name : want_names) {
    if (!got.contains(name)) continue;
    EXPECT_EQ(got.entry(name).dtype, want_dtype) << name;
    Tensor g = got.load(name, DType::f64), w = want.load(name, DType::f64);
    if (g.shape() != w.shape()) {
      ADD_FAILURE() << name << ": shapes differ";
      continue;
    }
    const double scale = max_abs(w);
    for (int64_t i = 0; i < w.numel(); ++i) {
      diff_sq += (g.get(i) - w.get(i)) * (g.get(i) - w.get(i));
      want_sq += w.get(i) * w.get(i);
      const double tol = rtol * std::abs(w.get(i)) + floor * scale;
      // Exact agreement passes even where the tolerance is 0 (an expert no
      // token reached has an all-zero gradient).
      const double diff = std::abs(g.get(i) - w.get(i));
      const double frac = diff == 0 ? 0.0 : diff / tol;
      if (!(frac <= c.worst)) {  // NaN counts as worst
        c.worst = std::isnan(frac) ? INFINITY : frac;
        char buf[256];
        std::snprintf(buf, sizeof buf, "%s[%lld]: got %.17g, want %.17g (tensor max|want| %.3g)",
                      name.c_str(), static_cast<long long>(i), g.get(i), w.get(i), scale);
        c.worst_at = buf;
      }
    }
  }
  c.relative_l2 = std::sqrt(diff_sq / want_sq);
  return c;
}

class CliEval : public Cli {
 protected:
  // `tiermoe eval` on a fixture (its tokens unless `data` is given).
  RunResult eval(const std::string& fixture, std::vector<std::string> extra,
                 const std::string& data = {}) const {
    const std::string tokens = data.empty() ? kFixtures + fixture + "/tokens.npy" : data;
    std::vector<std::string> args = {"eval",      "--model", kFixtures + fixture, "--data", tokens,
                                     "--seq-len", "16",      "--batch",           "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args);
  }

  void check_twin(const std::string& fixture) {
    SCOPED_TRACE(fixture);
    const nlohmann::json expected = expected_of(fixture);
    ASSERT_EQ(expected.at("seq_len"), 16);
    ASSERT_EQ(expected.at("batch"), 2);
    const std::string grads = path("grads.safetensors").string();
    RunResult r = eval(fixture, {"--dtype", "f64", "--save-grads", grads, "--json"});
    ASSERT_EQ(r.rc, 0) << r.err;
    const nlohmann::json j = last_json_line(r.out);

    const double want_loss = expected.at("loss"), want_ce = expected.at("ce");
    EXPECT_NEAR(j.at("loss").get<double>(), want_loss, 1e-9 * want_loss);
    EXPECT_NEAR(j.at("ce").get<double>(), want_ce, 1e-9 * want_ce);
    EXPECT_EQ(j.at("aux_in_loss").get<bool>(), !expected.at("aux").is_null());
    if (!expected.at("aux").is_null()) {
      const double want_aux = expected.at("aux");
      EXPECT_NEAR(j.at("aux").get<double>(), want_aux, 1e-9 * want_aux);
    }
    EXPECT_EQ(j.at("tokens"), 32);
    EXPECT_EQ(j.at("batch"), 2);
    EXPECT_EQ(j.at("seq_len"), 16);
    EXPECT_EQ(j.at("dtype"), "f64");
    EXPECT_EQ(j.at("model"), kFixtures + fixture);
    EXPECT_EQ(j.at("data"), kFixtures + fixture + "/tokens.npy");
    EXPECT_GE(j.at("seconds").get<double>(), 0.0);

    GradComparison c =
        compare_grads(grads, kFixtures + fixture + "/grads.safetensors", "F64", 1e-9, 1e-9);
    EXPECT_LE(c.worst, 1.0) << "worst gradient element: " << c.worst_at;
    std::printf(
        "  %s: loss %.17g (twin %.17g); worst gradient element at %.3g of its "
        "tolerance: %s\n",
        fixture.c_str(), j.at("loss").get<double>(), want_loss, c.worst, c.worst_at.c_str());
  }
};

TEST_F(CliEval, MoeMatchesThePytorchTwin) { check_twin("moe"); }
TEST_F(CliEval, DenseTiedAuxMatchesThePytorchTwin) { check_twin("dense_tied_aux"); }

// SFT data through the same contract: eval takes the JSON Lines train takes,
// and --save-grads writes the gradients of the packed (or padded) rows, equal
// to the PyTorch twin's (tests/data/model/README.md, the sft_* cases).
TEST_F(CliEval, SftRowsMatchThePytorchTwin) {
  for (const char* c : {"sft_moe_packed", "sft_dense_tied_aux_packed", "sft_moe_padded"}) {
    SCOPED_TRACE(c);
    const nlohmann::json e = expected_of(c);
    const std::string model = e.at("model"), grads = path("sft_grads.safetensors").string();
    std::vector<std::string> extra = {"--dtype", "f64", "--save-grads", grads, "--json"};
    if (!e.at("packing").get<bool>()) extra.push_back("--no-packing");
    RunResult r = eval(model, extra, kFixtures + e.at("data").get<std::string>());
    ASSERT_EQ(r.rc, 0) << r.err;
    const nlohmann::json j = last_json_line(r.out);
    const double want = e.at("loss");
    EXPECT_NEAR(j.at("loss").get<double>(), want, 1e-9 * want);
    EXPECT_EQ(j.at("tokens"), e.at("counted_targets"));
    GradComparison g = compare_grads(grads, kFixtures + c + "/grads.safetensors", "F64", 1e-9, 1e-9);
    EXPECT_LE(g.worst, 1.0) << "worst gradient element: " << g.worst_at;
  }
}

// The comparisons bite: a window one token short shifts every window after
// the first, and the loss and the gradients move far outside the tolerances.
TEST_F(CliEval, ShiftedWindowsGiveAnotherLossAndGradients) {
  const double want_loss = expected_of("moe").at("loss");
  const std::string grads = path("grads.safetensors").string();
  RunResult r =
      run({"eval", "--model", kFixtures + "moe", "--data", kFixtures + "moe/tokens.npy",
           "--seq-len", "15", "--batch", "2", "--dtype", "f64", "--save-grads", grads, "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const double loss = last_json_line(r.out).at("loss");
  EXPECT_GT(std::abs(loss - want_loss), 1e-6 * want_loss) << loss;
  GradComparison c = compare_grads(grads, kFixtures + "moe/grads.safetensors", "F64", 1e-9, 1e-9);
  EXPECT_GT(c.worst, 1e3) << c.worst_at;
}

// The human-readable form prints the same loss, to full precision.
// Every family's transformers fixture (tests/data/families/, the MXFP4
// gpt-oss): --save-grads writes exactly the trainable parameters' gradients,
// under their HF names and in their checkpoint shapes (gpt-oss's x-major
// experts; no entry for DeepSeek-V3's and GLM-4.5's selection-only bias),
// equal to transformers' f64 gradients.
TEST_F(CliEval, SaveGradsWritesEveryFamilysGradientsAsTransformersHoldsThem) {
  const std::string data = std::string(TIERMOE_TEST_DATA_DIR);
  const std::pair<std::string, std::string> fixtures[] = {
      {data + "/families/qwen2_moe", ""},      {data + "/families/glm4_moe", ""},
      {data + "/families/qwen3_moe_yarn", ""}, {data + "/families/gpt_oss", ""},
      {data + "/families/deepseek_v3", ""},    {data + "/families/deepseek_v3_q_proj", ""},
      {data + "/families/qwen3_moe_int4", ""}, {data + "/families/deepseek_v3_fp8", ""},
      {data + "/families/glm4_moe_lite", ""},  {data + "/families/deepseek_v2", ""},
      {data + "/families/minimax_m2", ""},     {data + "/families/minimax_m2_fp8", ""},
      {data + "/families/qwen3_5_moe", ""},    {data + "/mxfp4/model", data + "/mxfp4"}};
  for (const auto& [model, files] : fixtures) {
    SCOPED_TRACE(model);
    const std::string dir = files.empty() ? model : files;
    const std::string grads = path("grads.safetensors").string();
    const RunResult r = run({"eval", "--model", model, "--data", dir + "/tokens.npy", "--seq-len",
                             "8", "--batch", "2", "--dtype", "f64", "--save-grads", grads});
    ASSERT_EQ(r.rc, 0) << r.err;
    const GradComparison c =
        compare_grads(grads, dir + "/grads_eval.safetensors", "F64", 1e-9, 1e-9);
    EXPECT_LE(c.worst, 1.0) << "worst gradient element: " << c.worst_at;
  }
}

TEST_F(CliEval, PlainOutputPrintsTheLoss) {
  RunResult r = eval("dense_tied_aux", {});
  ASSERT_EQ(r.rc, 0) << r.err;
  const double want_loss = expected_of("dense_tied_aux").at("loss");
  ASSERT_TRUE(r.out.starts_with("loss ")) << r.out;
  EXPECT_NEAR(std::stod(r.out.substr(5)), want_loss, 1e-9 * want_loss) << r.out;
  EXPECT_TRUE(contains(r.out, "aux")) << r.out;
}

// f32 and bf16 compute: loss near the f64 twin, gradients in the file's dtype
// and near the f64 ones. The tolerances are 10-100x what these fixtures show
// (see the printout). bf16 gets no per-element check: its router logits are
// too coarse for top-k margins of ~1e-4 (README), so a few tokens pick
// another expert and that expert's gradient elements move by up to ~60% of
// their tensor's max; the gradient as a whole stays within ~1%.
struct LowPrecisionCase {
  const char* dtype;
  const char* st_dtype;
  double loss_rtol;     // relative to the f64 loss
  double grad_l2_rtol;  // ||got - want|| / ||want|| over all gradients
  double grad_floor;    // per element, of its tensor's max|want|; 0: not checked
};

TEST_F(CliEval, LowerPrecisionsStayNearF64) {
  for (const LowPrecisionCase& lp : {LowPrecisionCase{"f32", "F32", 1e-6, 1e-5, 1e-4},
                                     LowPrecisionCase{"bf16", "BF16", 1e-3, 0.1, 0}}) {
    for (const std::string fixture : {"moe", "dense_tied_aux"}) {
      SCOPED_TRACE(fixture + " " + lp.dtype);
      const std::string grads = path(std::string(lp.dtype) + ".safetensors").string();
      RunResult r = eval(fixture, {"--dtype", lp.dtype, "--save-grads", grads, "--json"});
      ASSERT_EQ(r.rc, 0) << r.err;
      const nlohmann::json j = last_json_line(r.out);
      EXPECT_EQ(j.at("dtype"), lp.dtype);
      const double want_loss = expected_of(fixture).at("loss");
      const double loss = j.at("loss");
      EXPECT_NEAR(loss, want_loss, lp.loss_rtol * want_loss);
      const double floor = lp.grad_floor > 0 ? lp.grad_floor : 1;  // 1: only for the printout
      GradComparison c =
          compare_grads(grads, kFixtures + fixture + "/grads.safetensors", lp.st_dtype, 0, floor);
      EXPECT_LE(c.relative_l2, lp.grad_l2_rtol);
      if (lp.grad_floor > 0) {
        EXPECT_LE(c.worst, 1.0) << "worst gradient element: " << c.worst_at;
      }
      std::printf(
          "  %s %s: loss relative error %.3g; gradients' relative L2 error %.3g; worst "
          "element %.3g of its tensor's max|g|: %s\n",
          fixture.c_str(), lp.dtype, std::abs(loss - want_loss) / want_loss, c.relative_l2,
          c.worst * floor, c.worst_at.c_str());
    }
  }
}

// --- bad input: exit 1, an error naming the culprit, no gradient file ---

void expect_failure(const RunResult& r, const std::vector<std::string>& mentions,
                    const fs::path& not_written) {
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  for (const auto& m : mentions) {
    EXPECT_TRUE(contains(r.err, m)) << "missing '" << m << "' in " << r.err;
  }
  EXPECT_FALSE(fs::exists(not_written));
  EXPECT_FALSE(fs::exists(not_written.string() + ".tmp"));
}

std::vector<int32_t> fixture_tokens() { return read_tokens(kFixtures + "moe/tokens.npy"); }

TEST_F(CliEval, ShortDataNamesTheFileAndTheCounts) {
  std::vector<int32_t> tokens = fixture_tokens();
  tokens.resize(32);  // B*L: one short of the last target
  const std::string data = path("short.npy").string();
  write_npy_tokens(data, tokens, TokenDType::i32);
  const fs::path grads = path("grads.safetensors");
  RunResult r = eval("moe", {"--save-grads", grads.string(), "--json"}, data);
  expect_failure(r, {data, "33 tokens", "holds 32"}, grads);
}

TEST_F(CliEval, TokenOutsideTheVocabularyNamesItsOffset) {
  std::vector<int32_t> tokens = fixture_tokens();
  tokens[7] = 256;  // vocab_size is 256
  const std::string data = path("oov.npy").string();
  write_npy_tokens(data, tokens, TokenDType::i32);
  const fs::path grads = path("grads.safetensors");
  RunResult r = eval("moe", {"--save-grads", grads.string()}, data);
  expect_failure(r, {data, "offset 7", "256"}, grads);
}

TEST_F(CliEval, MissingModelDirectoryIsNamed) {
  const std::string model = path("no_such_model").string();
  const fs::path grads = path("grads.safetensors");
  RunResult r = run({"eval", "--model", model, "--data", kFixtures + "moe/tokens.npy", "--seq-len",
                     "16", "--batch", "2", "--save-grads", grads.string()});
  expect_failure(r, {model, "--model"}, grads);
}

TEST_F(CliEval, CheckpointMissingATensorNamesIt) {
  const fs::path model = path("model");
  fs::create_directories(model);
  fs::copy_file(kFixtures + "moe/config.json", model / "config.json");
  const std::string dropped = "model.layers.1.self_attn.k_norm.weight";
  {
    SafetensorsFile full = SafetensorsFile::open(kFixtures + "moe/model.safetensors");
    NamedTensors kept;
    for (const auto& e : full.entries()) {
      if (e.name != dropped) kept.emplace_back(e.name, full.load(e.name, DType::f64));
    }
    save_safetensors((model / "model.safetensors").string(), kept);
  }
  const fs::path grads = path("grads.safetensors");
  RunResult r = run({"eval", "--model", model.string(), "--data", kFixtures + "moe/tokens.npy",
                     "--seq-len", "16", "--batch", "2", "--save-grads", grads.string()});
  expect_failure(r, {dropped}, grads);
}

TEST_F(CliEval, SaveGradsIntoAMissingDirectoryFailsFirst) {
  const fs::path grads = path("no_such_dir") / "grads.safetensors";
  RunResult r = eval("moe", {"--save-grads", grads.string()});
  expect_failure(r, {path("no_such_dir").string(), "--save-grads"}, grads);
  EXPECT_FALSE(fs::exists(path("no_such_dir")));
}

}  // namespace
}  // namespace tiermoe
