#pragma once
// Running a test on one of the machine's GEMM ISAs (kernels/cpu_isa.h).
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

}  // namespace tiermoe::testing
