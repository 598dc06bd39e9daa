#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "tiermoe/core/error.h"
#include "tiermoe/kernels/cpu_isa.h"

namespace tiermoe {
namespace {

constexpr CpuIsa kAll[] = {CpuIsa::avx2, CpuIsa::onednn};

std::string names(const auto& isas, const char* sep) {
  std::string s;
  for (CpuIsa isa : isas) s += (s.empty() ? "" : sep) + std::string(cpu_isa_name(isa));
  return s;
}

CpuIsa best_supported() { return CpuIsa::avx2; }

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

bool cpu_isa_supported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx2:
      // The x86-64-v3 baseline the whole build assumes.
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuIsa::onednn:
      return true;
  }
  return false;
}

std::string cpu_isa_missing(CpuIsa isa) {
  if (cpu_isa_supported(isa)) return "nothing is missing";
  return "this CPU has no AVX2/FMA (TierMoE needs x86-64-v3)";
}

std::vector<CpuIsa> cpu_isas_supported() {
  std::vector<CpuIsa> v;
  for (CpuIsa isa : kAll) {
    if (isa != CpuIsa::onednn && cpu_isa_supported(isa)) v.push_back(isa);
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
