#pragma once
// What the CPU we run on can do, from CPUID and the OS's enabled register
// state (XCR0), so kernels compiled for x86-64-v3 can dispatch to AVX-512 or
// AMX code at run time. Each answer is computed once and cached.
namespace tiermoe {

bool has_avx512f();      // AVX-512 Foundation, and the OS saves ZMM state
bool has_avx512bw();     // AVX-512 byte and word instructions (vpermw)
bool has_avx512_bf16();  // vdpbf16ps / vcvtne2ps2bf16 (AVX512_BF16)
bool has_amx_bf16();     // AMX tiles with bf16 dot products, enabled in XCR0

// Linux hands out the (8 KiB) AMX tile-data state only to processes that ask
// for it; an AMX instruction before that faults. Asks once per process
// (thread-safe) and returns whether AMX bf16 is usable now. False, without a
// system call, on CPUs without AMX.
bool request_amx_permission();

}  // namespace tiermoe
