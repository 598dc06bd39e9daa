#pragma once
// Running a test on one of the machine's GEMM ISAs (kernels/cpu_isa.h).
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "tiermoe/kernels/cpu_isa.h"

namespace tiermoe::testing {

// Sets the process's ISA for a scope and puts it back.
class ScopedIsa {
 public:
  explicit ScopedIsa(CpuIsa isa) : saved_(cpu_isa()) { set_cpu_isa(isa); }
  ~ScopedIsa() { set_cpu_isa(saved_); }

 private:
  CpuIsa saved_;
};

// A test parameterised over cases that each name an ISA (`Case::isa`): it runs
// on that ISA, or skips saying why the machine cannot run it.
template <class Case>
class IsaTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const CpuIsa isa = this->GetParam().isa;
    if (!cpu_isa_supported(isa)) {
      GTEST_SKIP() << "ISA " << cpu_isa_name(isa) << " not run: " << cpu_isa_missing(isa);
    }
    scoped_.emplace(isa);
  }
  void TearDown() override { scoped_.reset(); }

 private:
  std::optional<ScopedIsa> scoped_;
};

// A case that is only its ISA, every GEMM ISA (the emulations included) as
// parameters, and their names as test names ("avx512bf16_emu").
struct IsaOnly {
  CpuIsa isa;
};
inline auto all_isas() {
  return ::testing::Values(IsaOnly{CpuIsa::avx2}, IsaOnly{CpuIsa::avx512},
                           IsaOnly{CpuIsa::avx512bf16}, IsaOnly{CpuIsa::amx},
                           IsaOnly{CpuIsa::avx512_emu}, IsaOnly{CpuIsa::avx512bf16_emu},
                           IsaOnly{CpuIsa::amx_emu});
}
inline std::string isa_param_name(const ::testing::TestParamInfo<IsaOnly>& info) {
  std::string n(cpu_isa_name(info.param.isa));
  for (char& ch : n) ch = ch == '-' ? '_' : ch;
  return n;
}

}  // namespace tiermoe::testing
