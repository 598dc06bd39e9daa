#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "tiermoe/core/error.h"
#include "tiermoe/kernels/cpu_features.h"
#include "tiermoe/kernels/cpu_isa.h"

namespace tiermoe {
namespace {

constexpr CpuIsa kAll[] = {CpuIsa::avx2,    CpuIsa::avx512,     CpuIsa::avx512bf16,
                           CpuIsa::amx,     CpuIsa::avx512_emu, CpuIsa::avx512bf16_emu,
                           CpuIsa::amx_emu, CpuIsa::onednn};

std::string names(const auto& isas, const char* sep) {
  std::string s;
  for (CpuIsa isa : isas) s += (s.empty() ? "" : sep) + std::string(cpu_isa_name(isa));
  return s;
}

CpuIsa best_supported() {
  for (CpuIsa isa : {CpuIsa::amx, CpuIsa::avx512bf16, CpuIsa::avx512}) {
    if (cpu_isa_supported(isa)) return isa;
  }
  return CpuIsa::avx2;
}

CpuIsa checked(CpuIsa isa, std::string_view where) {
  TIERMOE_CHECK(
      cpu_isa_supported(isa),
      detail::str_of(where, " asks for ", cpu_isa_name(isa), ", but ", cpu_isa_missing(isa)),
      std::string(where),
      "unset it to use the best this CPU has, or pick one this machine supports: " +
          names(cpu_isas_supported(), ", "));
  return isa;
}

// Decided once (the first cpu_isa() call, or set_cpu_isa), read by every GEMM.
std::atomic<int> g_isa{-1};
std::mutex g_isa_mutex;

}  // namespace

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx2:
      return "avx2";
    case CpuIsa::avx512:
      return "avx512";
    case CpuIsa::avx512bf16:
      return "avx512bf16";
    case CpuIsa::amx:
      return "amx";
    case CpuIsa::avx512_emu:
      return "avx512-emu";
    case CpuIsa::avx512bf16_emu:
      return "avx512bf16-emu";
    case CpuIsa::amx_emu:
      return "amx-emu";
    case CpuIsa::onednn:
      return "onednn";
  }
  return "?";
}

CpuIsa parse_cpu_isa(std::string_view name, std::string_view where) {
  for (CpuIsa isa : kAll) {
    if (cpu_isa_name(isa) == name) return isa;
  }
  throw Error(detail::str_of(where, ": unknown ISA '", name, "'"), std::string(where),
              "one of " + names(kAll, "|"));
}

bool cpu_isa_emulated(CpuIsa isa) {
  return isa == CpuIsa::avx512_emu || isa == CpuIsa::avx512bf16_emu || isa == CpuIsa::amx_emu;
}

CpuIsa cpu_isa_real(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx512_emu:
      return CpuIsa::avx512;
    case CpuIsa::avx512bf16_emu:
      return CpuIsa::avx512bf16;
    case CpuIsa::amx_emu:
      return CpuIsa::amx;
    default:
      return isa;
  }
}

bool cpu_isa_supported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx2:
      // The x86-64-v3 baseline the whole build assumes.
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuIsa::avx512:
      return has_avx512f();
    case CpuIsa::avx512bf16:
      return has_avx512_bf16();
    case CpuIsa::amx:
      // Its f32 products run the avx512 kernel.
      return has_avx512f() && request_amx_permission();
    case CpuIsa::avx512_emu:
    case CpuIsa::avx512bf16_emu:
    case CpuIsa::amx_emu:
    case CpuIsa::onednn:
      return true;
  }
  return false;
}

std::string cpu_isa_missing(CpuIsa isa) {
  if (cpu_isa_supported(isa)) return "nothing is missing";
  switch (isa) {
    case CpuIsa::avx2:
      return "this CPU has no AVX2/FMA (TierMoE needs x86-64-v3)";
    case CpuIsa::avx512:
      return "this CPU has no AVX-512 (CPUID avx512f clear, or the OS does not save ZMM state)";
    case CpuIsa::avx512bf16:
      return "this CPU has no AVX-512 BF16 (CPUID avx512_bf16 clear, or no AVX-512)";
    case CpuIsa::amx:
      if (!has_amx_bf16()) {
        return "this CPU has no AMX-BF16 (CPUID amx_tile/amx_bf16 clear, or the OS does not "
               "enable tile state)";
      }
      if (!has_avx512f()) return "this CPU has AMX but no AVX-512 for the f32 products";
      return "the OS refused AMX tile-data permission (arch_prctl; Linux 5.16+ needed)";
    default:
      return "unsupported";
  }
}

std::vector<CpuIsa> cpu_isas_supported() {
  std::vector<CpuIsa> v;
  for (CpuIsa isa : kAll) {
    if (isa != CpuIsa::onednn && !cpu_isa_emulated(isa) && cpu_isa_supported(isa)) v.push_back(isa);
  }
  for (CpuIsa isa : kAll) {
    if (cpu_isa_emulated(isa)) v.push_back(isa);
  }
  return v;
}

CpuIsa cpu_isa() {
  int v = g_isa.load(std::memory_order_acquire);
  if (v >= 0) return CpuIsa(v);
  std::lock_guard lock(g_isa_mutex);
  v = g_isa.load(std::memory_order_relaxed);
  if (v >= 0) return CpuIsa(v);
  const char* env = std::getenv("TIERMOE_ISA");
  CpuIsa isa = (env && *env) ? checked(parse_cpu_isa(env), "TIERMOE_ISA") : best_supported();
  g_isa.store(int(isa), std::memory_order_release);
  return isa;
}

void set_cpu_isa(CpuIsa isa) {
  checked(isa, "set_cpu_isa");
  std::lock_guard lock(g_isa_mutex);
  g_isa.store(int(isa), std::memory_order_release);
}

}  // namespace tiermoe
