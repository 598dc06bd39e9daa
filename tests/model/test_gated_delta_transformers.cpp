// The gated delta rule (kernels/gated_delta.h) against transformers' own
// kernel, Qwen3.5-MoE's torch_recurrent_gated_delta_rule with
// use_qk_l2norm_in_kernel, in f64 on the inputs and gradients
// scripts/fixtures/make_gated_delta_fixture.py saved (with the model tests,
// which read safetensors files).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common/testing.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/kernels/gated_delta.h"

using namespace tiermoe;
using namespace tiermoe::testing;

namespace {

struct Inputs {
  Tensor q, k, v, g, beta;
};

Tensor load_f64(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsEntry& e = f.entry(name);
  Tensor t = Tensor::empty(e.shape, DType::f64);
  const auto bytes = f.bytes(name);
  std::memcpy(t.data<double>(), bytes.data(), bytes.size());
  return t;
}

// transformers' torch_recurrent_gated_delta_rule with use_qk_l2norm_in_kernel:
// q and k through l2norm (q also times Dk^-0.5), then the rule; backward the
// same way round. Output and every gradient to 1e-12.
TEST(GatedDelta, EqualsTransformersKernelInF64) {
  const SafetensorsFile f = SafetensorsFile::open(std::string(TIERMOE_TEST_DATA_DIR) +
                                                  "/gated_delta/recurrent.safetensors");
  Inputs in{load_f64(f, "q"), load_f64(f, "k"), load_f64(f, "v"), load_f64(f, "g"),
            load_f64(f, "beta")};
  const Tensor P = load_f64(f, "P");
  const double scale = 1.0 / std::sqrt(double(in.q.size(3)));
  auto run = [&](const Inputs& x, Tensor& out, Tensor* grads) {
    Tensor qn = Tensor::empty(x.q.shape(), DType::f64), kn = Tensor::empty(x.k.shape(), DType::f64);
    ref::l2norm_forward(qn, x.q, scale);
    ref::l2norm_forward(kn, x.k, 1.0);
    out = Tensor::empty(x.v.shape(), DType::f64);
    ref::gated_delta_forward(out, qn, kn, x.v, x.g, x.beta);
    if (!grads) return;
    Tensor dqn = Tensor::empty(qn.shape(), DType::f64), dkn = Tensor::empty(kn.shape(), DType::f64);
    grads[2] = Tensor::empty(x.v.shape(), DType::f64);
    grads[3] = Tensor::empty(x.g.shape(), DType::f64);
    grads[4] = Tensor::empty(x.beta.shape(), DType::f64);
    ref::gated_delta_backward(dqn, dkn, grads[2], grads[3], grads[4], P, qn, kn, x.v, x.g, x.beta);
    grads[0] = Tensor::empty(x.q.shape(), DType::f64);
    grads[1] = Tensor::empty(x.k.shape(), DType::f64);
    ref::l2norm_backward(grads[0], dqn, x.q, scale);
    ref::l2norm_backward(grads[1], dkn, x.k, 1.0);
  };
  Tensor out;
  Tensor grads[5];
  run(in, out, grads);
  EXPECT_TRUE(all_close(out, load_f64(f, "out"), 1e-12, 1e-14, "out"));
  const char* names[] = {"dq", "dk", "dv", "dg", "dbeta"};
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(all_close(grads[i], load_f64(f, names[i]), 1e-11, 1e-13, names[i]));
  }
  // The comparison sees the write strength: beta doubled is far off.
  for (int64_t i = 0; i < in.beta.numel(); ++i) in.beta.set(i, 2 * in.beta.get(i));
  Tensor off;
  run(in, off, nullptr);
  EXPECT_FALSE(all_close(off, load_f64(f, "out"), 1e-6, 1e-8, "out with beta doubled"));
}

}  // namespace
