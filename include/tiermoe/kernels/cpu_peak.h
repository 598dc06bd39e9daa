#pragma once
// The multiply-add peak a benchmark sets its kernels against, measured on
// this machine in the same run: each of `threads` threads runs the ISA's
// instruction (FMA, VDPBF16PS or TDPBF16PS) in a register-only loop for
// about `seconds`, and the flops of all of them are divided by the wall
// time. Returns flop/s; 0 for the emulated ISAs and onednn (nothing of
// theirs to measure). Error for an ISA this machine lacks.
#include "tiermoe/core/dtype.h"
#include "tiermoe/kernels/cpu_isa.h"

namespace tiermoe {

double measure_peak_flops(CpuIsa isa, DType dt, int threads, double seconds = 0.2);

}  // namespace tiermoe
