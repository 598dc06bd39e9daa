// Token windows: eval batches follow the `eval` contract, the training
// sampler visits every window once per epoch, and its position round-trips
// so a resumed run sees the same batches.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "tiermoe/core/error.h"
#include "tiermoe/core/random.h"
#include "tiermoe/io/tokens.h"
#include "tiermoe/train/data.h"

namespace tiermoe {
namespace {

std::vector<int32_t> random_tokens(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> out(n);
  for (auto& t : out) t = static_cast<int32_t>(rng.below(50000));
  return out;
}

// Tokens 0, 1, 2, ...: a window's first input names where it starts.
std::vector<int32_t> counting_tokens(int64_t n) {
  std::vector<int32_t> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(i);
  return out;
}

// Returns the Error's message and where, or fails the test if none is thrown.
template <class F>
Error error_from(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a tiermoe::Error";
  return Error("none");
}

TEST(TokenWindows, EvalBatchFollowsTheContract) {
  const int64_t B = 3, L = 5;
  for (int64_t extra : {0, 1, 7}) {  // exactly B*L+1 tokens, and more
    const auto tokens = random_tokens(B * L + 1 + extra, 1 + extra);
    TokenWindows data(tokens, "tokens.npy");
    const TokenBatch batch = data.eval_batch(B, L);
    ASSERT_EQ(batch.batch, B);
    ASSERT_EQ(batch.seq_len, L);
    ASSERT_EQ(batch.inputs_BL.size(), static_cast<size_t>(B * L));
    ASSERT_EQ(batch.targets_BL.size(), static_cast<size_t>(B * L));
    for (int64_t i = 0; i < B; ++i) {
      for (int64_t j = 0; j < L; ++j) {
        EXPECT_EQ(batch.inputs_BL[i * L + j], tokens[i * L + j]) << i << "," << j;
        EXPECT_EQ(batch.targets_BL[i * L + j], tokens[i * L + j + 1]) << i << "," << j;
      }
    }
  }
}

TEST(TokenWindows, EvalBatchOnShortDataNamesTheFileAndTheCounts) {
  TokenWindows data(random_tokens(15, 2), "data/short.bin");
  const Error e = error_from([&] { data.eval_batch(3, 5); });
  EXPECT_EQ(e.where(), "data/short.bin");
  EXPECT_NE(e.message().find("16"), std::string::npos) << e.message();  // needed
  EXPECT_NE(e.message().find("15"), std::string::npos) << e.message();  // held
  EXPECT_FALSE(e.hint().empty());
  EXPECT_THROW(data.eval_batch(0, 5), Error);
  EXPECT_THROW(data.eval_batch(2, 0), Error);
}

TEST(TokenWindows, FromFileReadsTokensAndNamesThePath) {
  const auto path = (std::filesystem::temp_directory_path() /
                     ("tiermoe_test_data_" + std::to_string(::getpid()) + ".npy"))
                        .string();
  const auto tokens = random_tokens(21, 3);
  write_npy_tokens(path, tokens, TokenDType::u16);
  TokenWindows data = TokenWindows::from_file(path);
  std::filesystem::remove(path);
  EXPECT_EQ(std::vector<int32_t>(data.tokens().begin(), data.tokens().end()), tokens);
  EXPECT_EQ(data.num_windows(4), 5);
  EXPECT_EQ(error_from([&] { data.eval_batch(6, 4); }).where(), path);
}

TEST(WindowSampler, SequentialWalkWrapsIntoTheNextEpoch) {
  TokenWindows data(counting_tokens(14), "counting");  // 3 windows of 4 (13 tokens would do)
  WindowSampler s(data, {.seq_len = 4, .shuffle = false});
  ASSERT_EQ(s.num_windows(), 3);
  const TokenBatch b0 = s.next_batch(2), b1 = s.next_batch(2);
  EXPECT_EQ(b0.inputs_BL, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(b0.targets_BL, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(b1.inputs_BL, (std::vector<int32_t>{8, 9, 10, 11, 0, 1, 2, 3}));
  EXPECT_EQ(b1.targets_BL, (std::vector<int32_t>{9, 10, 11, 12, 1, 2, 3, 4}));
  EXPECT_EQ(s.position().epoch, 1);
  EXPECT_EQ(s.position().index, 1);
}

// The window ids of one epoch, read off the first input of each window.
std::vector<int32_t> one_epoch(WindowSampler& s, int64_t L) {
  std::vector<int32_t> starts;
  for (int64_t w = 0; w < s.num_windows(); ++w) starts.push_back(s.next_batch(1).inputs_BL[0] / L);
  return starts;
}

TEST(WindowSampler, ShuffledEpochsArePermutationsThatDifferPerEpochAndSeed) {
  const int64_t L = 3, W = 40;
  TokenWindows data(counting_tokens(W * L + 1), "counting");
  WindowSampler a(data, {.seq_len = L, .seed = 9}), b(data, {.seq_len = L, .seed = 9}),
      c(data, {.seq_len = L, .seed = 10});
  const auto a0 = one_epoch(a, L), a1 = one_epoch(a, L);
  std::vector<int32_t> all(W);
  for (int64_t w = 0; w < W; ++w) all[w] = static_cast<int32_t>(w);
  for (const auto& epoch : {a0, a1}) {
    auto sorted = epoch;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, all);
  }
  EXPECT_NE(a0, all);  // shuffled (40! orders; identity is not one a test should meet)
  EXPECT_NE(a0, a1);
  EXPECT_EQ(one_epoch(b, L), a0);
  EXPECT_NE(one_epoch(c, L), a0);
}

TEST(WindowSampler, PositionRoundTripsBitwise) {
  TokenWindows data(random_tokens(10 * 8 + 5, 4), "random");  // 10 windows of 8
  for (bool shuffle : {true, false}) {
    WindowSampler a(data, {.seq_len = 8, .shuffle = shuffle, .seed = 3});
    for (int i = 0; i < 7; ++i) a.next_batch(3);  // 21 windows: into the third epoch
    const SamplerPosition saved = a.position();
    EXPECT_EQ(saved.epoch, 2);
    EXPECT_EQ(saved.index, 1);
    std::vector<TokenBatch> want;
    for (int i = 0; i < 5; ++i) want.push_back(a.next_batch(3));

    // A fresh sampler with other options adopts the saved seed and order.
    WindowSampler b(data, {.seq_len = 8, .shuffle = !shuffle, .seed = 99});
    b.set_position(saved);
    EXPECT_EQ(b.position(), saved);
    a.set_position(saved);
    for (int i = 0; i < 5; ++i) {
      const TokenBatch got_a = a.next_batch(3), got_b = b.next_batch(3);
      EXPECT_EQ(got_a.inputs_BL, want[i].inputs_BL) << "batch " << i;
      EXPECT_EQ(got_a.targets_BL, want[i].targets_BL) << "batch " << i;
      EXPECT_EQ(got_b.inputs_BL, want[i].inputs_BL) << "batch " << i;
      EXPECT_EQ(got_b.targets_BL, want[i].targets_BL) << "batch " << i;
    }
  }
}

TEST(WindowSampler, RejectsAMismatchedPosition) {
  TokenWindows data(random_tokens(41, 5), "train.bin"), other(random_tokens(33, 5), "other.bin");
  WindowSampler s(data, {.seq_len = 4});  // 10 windows
  const SamplerPosition p = s.position();

  WindowSampler wrong_len(data, {.seq_len = 5});
  const Error e = error_from([&] { wrong_len.set_position(p); });
  EXPECT_EQ(e.where(), "train.bin");
  EXPECT_NE(e.hint().find("--seq-len 4"), std::string::npos) << e.hint();

  WindowSampler wrong_data(other, {.seq_len = 4});  // 8 windows
  EXPECT_EQ(error_from([&] { wrong_data.set_position(p); }).where(), "other.bin");

  SamplerPosition past_end = p;
  past_end.index = 10;
  EXPECT_THROW(s.set_position(past_end), Error);
  SamplerPosition negative = p;
  negative.epoch = -1;
  EXPECT_THROW(s.set_position(negative), Error);
}

TEST(WindowSampler, DataShorterThanOneWindowIsAnError) {
  TokenWindows exact(random_tokens(9, 6), "exact.bin");
  WindowSampler one(exact, {.seq_len = 8});
  EXPECT_EQ(one.num_windows(), 1);
  EXPECT_EQ(one.next_batch(2).inputs_BL.size(), 16u);  // the one window, twice

  TokenWindows short_data(random_tokens(8, 6), "short.bin");
  const Error e = error_from([&] { WindowSampler s(short_data, {.seq_len = 8}); });
  EXPECT_EQ(e.where(), "short.bin");
  EXPECT_NE(e.message().find("8 tokens"), std::string::npos) << e.message();
  TokenWindows empty({}, "empty.bin");
  EXPECT_EQ(empty.num_windows(8), 0);
  EXPECT_THROW(WindowSampler(empty, {.seq_len = 8}), Error);
  EXPECT_THROW(WindowSampler(exact, {.seq_len = 0}), Error);
  EXPECT_THROW(one.next_batch(0), Error);
}

}  // namespace
}  // namespace tiermoe
