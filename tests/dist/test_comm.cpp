// LocalComm and the ordered sum: one rank's collectives are copies, and
// fold_sum adds exactly as a loop over the partials would.
#include <gtest/gtest.h>

#include <vector>

#include "common/testing.h"
#include "tiermoe/dist/comm.h"

namespace tiermoe {
namespace {

using testing::bitwise_equal;

TEST(LocalComm, CollectivesAreCopiesAndCounted) {
  LocalComm comm;
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.rank(), 0);
  std::vector<int32_t> send = {1, 2, 3}, recv(3, 0);
  const std::vector<size_t> bytes = {12};
  comm.alltoallv(send.data(), bytes, recv.data(), bytes, "test");
  EXPECT_EQ(recv, send);
  EXPECT_EQ(comm.allgather_value(int64_t(7), "test"), std::vector<int64_t>({7}));
  EXPECT_EQ(comm.stats()[CommOp::alltoallv].calls, 1);
  EXPECT_EQ(comm.stats()[CommOp::allgather].calls, 1);
  // A rank's block to itself is no traffic.
  EXPECT_EQ(comm.stats()[CommOp::alltoallv].bytes_sent, 0u);
  const std::vector<size_t> wrong = {8};
  EXPECT_THROW(comm.alltoallv(send.data(), bytes, recv.data(), wrong, "test"), Error);
  const std::vector<size_t> two = {4, 4};
  EXPECT_THROW(comm.alltoallv(send.data(), two, recv.data(), two, "test"), Error);
}

TEST(LocalComm, FoldSumEqualsAddingThePartialsInOrder) {
  LocalComm comm;
  Rng rng(3);
  for (DType dt : {DType::f32, DType::f64}) {
    // A size past one chunk, so the chunking is exercised.
    const int64_t n = (int64_t(8) << 20) / int64_t(dtype_size(dt)) + 17;
    Tensor p0 = testing::random_tensor({n}, dt, rng), p1 = testing::random_tensor({n}, dt, rng);
    Tensor acc = Tensor::empty({n}, dt);
    comm.fold_sum(acc, p0, /*accumulate=*/false, "test");
    EXPECT_TRUE(bitwise_equal(acc, p0, "first fold"));
    comm.fold_sum(acc, p1, /*accumulate=*/true, "test");
    Tensor want = p0.clone();
    visit_dtype(dt, [&]<class T>() {
      if constexpr (!std::is_same_v<T, bf16>) {
        T* w = want.data<T>();
        const T* b = p1.data<T>();
        for (int64_t i = 0; i < n; ++i) w[i] = T(w[i] + b[i]);
      }
    });
    EXPECT_TRUE(bitwise_equal(acc, want, "second fold"));
  }
  Tensor b = Tensor::zeros({4}, DType::bf16), f = Tensor::zeros({4}, DType::f32);
  EXPECT_THROW(comm.fold_sum(b, b, false, "test"), Error);
  EXPECT_THROW(comm.fold_sum(f, Tensor::zeros({5}, DType::f32), false, "test"), Error);
}

}  // namespace
}  // namespace tiermoe
