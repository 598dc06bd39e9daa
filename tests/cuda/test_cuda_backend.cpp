// The CUDA backend in every build: it is built exactly when CMake found the
// toolkit, --device cuda is parsed and, without a backend or a GPU, refused
// with an error naming the flag and a hint, by the library and by the CLI.
#include <gtest/gtest.h>

#include "cli/cli_fixture.h"
#include "gpu.h"
#include "tiermoe/core/error.h"

namespace tiermoe {
namespace {

// make test's build links the real backend whenever CMake found a CUDA
// compiler (TIERMOE_EXPECT_CUDA comes from CMake's own decision).
TEST(CudaBackend, IsBuiltExactlyWhenCMakeFoundTheToolkit) {
  EXPECT_EQ(cuda_backend_built(), bool(TIERMOE_EXPECT_CUDA));
  std::string why;
  const int n = cuda_device_count(&why);
  EXPECT_GE(n, 0);
  if (n == 0) {
    EXPECT_FALSE(why.empty());
  }
  RecordProperty("cuda_devices", n);
}

TEST(CudaBackend, DeviceChoicesParse) {
  using Kind = DeviceChoice::Kind;
  EXPECT_EQ(parse_device_choice("none").kind, Kind::none);
  EXPECT_EQ(parse_device_choice("cpu").kind, Kind::cpu);
  const DeviceChoice c = parse_device_choice("cuda");
  EXPECT_EQ(c.kind, Kind::cuda);
  EXPECT_EQ(c.ordinal, 0);
  EXPECT_EQ(parse_device_choice("cuda:3").ordinal, 3);
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1x", "CUDA", ""}) {
    try {
      parse_device_choice(bad, "--device");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.where(), "--device") << bad;
      EXPECT_NE(e.hint().find("cuda:N"), std::string::npos) << bad;
    }
  }
}

TEST(CudaBackend, WithoutAGpuMakingADeviceSaysWhyAndNamesTheFlag) {
  std::string why;
  if (cuda_device_count(&why) > 0) GTEST_SKIP() << "a GPU is present: the GPU tests cover it";
  try {
    make_cuda_device(CudaDeviceConfig{}, "--device cuda");
    ADD_FAILURE() << "made a CUDA device without a GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "--device cuda");
    EXPECT_EQ(e.message(), why);
    EXPECT_NE(e.hint().find("--device cpu"), std::string::npos) << e.hint();
  }
}

class CudaCli : public Cli {};

TEST_F(CudaCli, TrainOnCudaWithoutAGpuIsAClearError) {
  std::string why;
  if (cuda_device_count(&why) > 0) GTEST_SKIP() << "a GPU is present: the GPU tests cover it";
  const RunResult r = run({"train", "--preset", "tiny", "--steps", "1", "--device", "cuda",
                           "--device-memory", "64MiB"});
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("--device cuda"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no CUDA"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--device cpu"), std::string::npos) << r.err;  // the hint

  const RunResult bad = run({"train", "--preset", "tiny", "--steps", "1", "--device", "cuda:x",
                             "--device-memory", "64MiB"});
  EXPECT_EQ(bad.rc, 1) << bad.err;
  EXPECT_NE(bad.err.find("unknown --device 'cuda:x'"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace tiermoe
