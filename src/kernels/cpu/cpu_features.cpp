#include "tiermoe/kernels/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace tiermoe {
namespace {

struct Regs {
  uint32_t a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(uint32_t leaf, uint32_t subleaf) {
  Regs r;
  if (!__get_cpuid_count(leaf, subleaf, &r.a, &r.b, &r.c, &r.d)) return Regs{};
  return r;
}

bool bit(uint32_t v, int i) { return (v >> i) & 1u; }

// The register state the OS saves on context switches. A CPU feature whose
// state the OS does not save is unusable, whatever CPUID says.
uint64_t xcr0() {
  if (!bit(cpuid(1, 0).c, 27)) return 0;  // OSXSAVE: xgetbv not available
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

// XCR0: SSE | AVX | opmask | ZMM_Hi256 | Hi16_ZMM.
constexpr uint64_t kAvx512State = 0x2 | 0x4 | 0x20 | 0x40 | 0x80;
// XCR0: XTILECFG | XTILEDATA.
constexpr uint64_t kAmxState = (uint64_t(1) << 17) | (uint64_t(1) << 18);

constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl(ARCH_REQ_XCOMP_PERM, feature)
constexpr long kXfeatureXtiledata = 18;

}  // namespace

bool has_avx512f() {
  static const bool yes = bit(cpuid(7, 0).b, 16) && (xcr0() & kAvx512State) == kAvx512State;
  return yes;
}

bool has_avx512bw() {
  static const bool yes = has_avx512f() && bit(cpuid(7, 0).b, 30);
  return yes;
}

bool has_avx512_bf16() {
  static const bool yes = has_avx512f() && bit(cpuid(7, 1).a, 5);
  return yes;
}

bool has_amx_bf16() {
  static const bool yes = [] {
    Regs r = cpuid(7, 0);
    bool amx_tile = bit(r.d, 24), amx_bf16 = bit(r.d, 22);
    return amx_tile && amx_bf16 && (xcr0() & kAmxState) == kAmxState;
  }();
  return yes;
}

bool request_amx_permission() {
  // A function-local static is initialised exactly once even when many
  // threads get here at the same time.
  static const bool granted =
      has_amx_bf16() && syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
}

}  // namespace tiermoe
