#pragma once
// The multiply-add peak a benchmark sets its kernels against, measured on
// this machine in the same run: each of `threads` threads runs the ISA's
// instruction (FMA, VDPBF16PS or TDPBF16PS) in a register-only loop for
// about `seconds`, and the flops of all of them are divided by the wall
// time. Returns flop/s; 0 for the emulated ISAs and onednn (nothing of
// theirs to measure). Error for an ISA this machine lacks.
#include <cstddef>

#include "tiermoe/core/dtype.h"
#include "tiermoe/kernels/cpu_isa.h"

namespace tiermoe {

double measure_peak_flops(CpuIsa isa, DType dt, int threads, double seconds = 0.2);

// The memory bandwidth the same benchmarks set their memory-bound kernels
// against: each of `threads` threads streams its own slice of a buffer of
// `bytes` (far larger than the last-level cache, first touched by the thread
// that reads it), summing it so the loads stay, for about `seconds`; the
// bytes read by all of them are divided by the wall time. Returns byte/s.
double measure_read_bandwidth(int threads, double seconds = 0.2, size_t bytes = size_t(512) << 20);

// A kernel's roofline at its arithmetic intensity: min(peak, bandwidth x
// flops / bytes), in flop/s; 0 when either rate is unknown (0).
double roofline_flops(double peak_flops, double bytes_per_s, double flops, double bytes);

}  // namespace tiermoe
