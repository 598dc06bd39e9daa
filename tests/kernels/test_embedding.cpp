#include <gtest/gtest.h>

#include <cstring>  // testing.h uses std::memcmp without including it
#include <vector>

#include "common/testing.h"
#include "tiermoe/kernels/embedding.h"

using namespace tiermoe;
using namespace tiermoe::testing;

namespace {

DType grad_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

std::vector<int32_t> random_ids(int64_t n, int64_t V, Rng& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = int32_t(rng.below(uint64_t(V)));
  return ids;
}

}  // namespace

// Forward is a copy; backward adds each table row's tokens in increasing
// token order in both twins, so they agree bit for bit.
TEST(Embedding, CpuMatchesRefBitwise) {
  Rng rng(21);
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    for (auto [T, V, D] : {std::tuple{1, 1, 1}, {3, 5, 7}, {17, 4, 64}, {300, 50, 130}}) {
      Tensor table = random_tensor({V, D}, dt, rng);
      std::vector<int32_t> ids = random_ids(T, V, rng);
      Tensor out_ref = Tensor::empty({T, D}, dt), out_cpu = Tensor::empty({T, D}, dt);
      ref::embedding_forward(out_ref, table, ids);
      cpu::embedding_forward(out_cpu, table, ids);
      EXPECT_TRUE(bitwise_equal(out_cpu, out_ref, "embedding out " + table.str()));
      for (int64_t t = 0; t < T; ++t) {
        ASSERT_EQ(out_cpu.get(t * D + D - 1), table.get(ids[size_t(t)] * D + D - 1));
      }

      Tensor dout = random_tensor({T, D}, dt, rng);
      Tensor dtable_ref = random_tensor({V, D}, grad_dtype(dt), rng),
             dtable_cpu = dtable_ref.clone();
      for (bool acc : {true, false}) {
        ref::embedding_backward(dtable_ref, dout, ids, acc);
        cpu::embedding_backward(dtable_cpu, dout, ids, acc);
        EXPECT_TRUE(bitwise_equal(dtable_cpu, dtable_ref, "embedding dtable " + table.str()));
      }
    }
  }
}

TEST(Embedding, BackwardSumsRepeatedIdsAndZerosUnusedRows) {
  Tensor dout = Tensor::from_values({3, 2}, DType::f32, {1, 2, 10, 20, 100, 200});
  std::vector<int32_t> ids = {2, 0, 2};
  Tensor dtable = Tensor::empty({4, 2}, DType::f32);
  dtable.fill(7);
  cpu::embedding_backward(dtable, dout, ids);
  EXPECT_EQ(dtable.to_vector(), (std::vector<double>{10, 20, 0, 0, 101, 202, 0, 0}));
  cpu::embedding_backward(dtable, dout, ids, /*accumulate=*/true);
  EXPECT_EQ(dtable.to_vector(), (std::vector<double>{20, 40, 0, 0, 202, 404, 0, 0}));
}

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  Rng rng(22);
  Tensor table = random_tensor({6, 5}, DType::f64, rng);
  std::vector<int32_t> ids = {1, 4, 1, 0, 5, 1, 4};
  Tensor r = random_tensor({7, 5}, DType::f64, rng);
  Tensor out = Tensor::empty({7, 5}, DType::f64);
  auto loss = [&] {
    cpu::embedding_forward(out, table, ids);
    double s = 0;
    for (int64_t i = 0; i < out.numel(); ++i) s += out.get(i) * r.get(i);
    return s;
  };
  for (bool use_cpu : {false, true}) {
    Tensor dtable = Tensor::empty({6, 5}, DType::f64);
    use_cpu ? cpu::embedding_backward(dtable, r, ids) : ref::embedding_backward(dtable, r, ids);
    EXPECT_TRUE(
        fd_check(loss, table, dtable, use_cpu ? "cpu dtable" : "ref dtable", 1e-6, 1e-8, 30));
  }
}

TEST(Embedding, OutOfRangeIdNamesPositionAndValue) {
  Tensor table = Tensor::zeros({10, 4}, DType::f32);
  Tensor out = Tensor::empty({3, 4}, DType::f32);
  Tensor dtable = Tensor::empty({10, 4}, DType::f32);
  for (std::vector<int32_t> ids :
       {std::vector<int32_t>{1, 2, 10}, std::vector<int32_t>{1, 2, -1}}) {
    for (int twin = 0; twin < 2; ++twin) {
      try {
        twin ? cpu::embedding_forward(out, table, ids) : ref::embedding_forward(out, table, ids);
        FAIL() << "id " << ids[2] << " accepted";
      } catch (const Error& e) {
        EXPECT_NE(e.message().find("ids_T[2] = " + std::to_string(ids[2])), std::string::npos)
            << e.what();
        EXPECT_EQ(e.where(), "embedding_forward");
      }
      EXPECT_THROW(twin ? cpu::embedding_backward(dtable, out, ids)
                        : ref::embedding_backward(dtable, out, ids),
                   Error);
    }
  }
}

TEST(Embedding, RejectsBadShapesAndDtypes) {
  Tensor table = Tensor::zeros({10, 4}, DType::bf16);
  std::vector<int32_t> ids = {1, 2};
  Tensor out_rows = Tensor::empty({3, 4}, DType::bf16);
  EXPECT_THROW(cpu::embedding_forward(out_rows, table, ids), Error);
  Tensor out_f32 = Tensor::empty({2, 4}, DType::f32);
  EXPECT_THROW(cpu::embedding_forward(out_f32, table, ids), Error);
  Tensor dout = Tensor::zeros({2, 4}, DType::bf16);
  Tensor dtable_bf16 = Tensor::zeros({10, 4}, DType::bf16);  // grads of a bf16 table are f32
  EXPECT_THROW(cpu::embedding_backward(dtable_bf16, dout, ids), Error);
  EXPECT_THROW(ref::embedding_backward(dtable_bf16, dout, ids), Error);
}
