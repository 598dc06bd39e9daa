#pragma once
// Compute dtypes and bf16. bf16 is the top half of an IEEE f32; conversion
// from f32 rounds to nearest, ties to even, and keeps NaN a (quiet) NaN.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace tiermoe {

enum class DType : uint8_t { f64, f32, bf16 };

struct bf16 {
  uint16_t bits = 0;
};

inline float bf16_to_float(bf16 v) { return std::bit_cast<float>(uint32_t(v.bits) << 16); }

inline bf16 float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x0040u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bf16{uint16_t(u >> 16)};
}

size_t dtype_size(DType dt);
std::string_view dtype_name(DType dt);  // "f64", "f32", "bf16"
// Parses "f64" | "f32" | "bf16" (also "float64", "float32", "bfloat16");
// throws Error naming `where` otherwise.
DType parse_dtype(std::string_view s, std::string_view where = "--dtype");

template <class T>
inline constexpr DType dtype_of = [] {
  if constexpr (std::is_same_v<T, double>) return DType::f64;
  else if constexpr (std::is_same_v<T, float>) return DType::f32;
  else {
    static_assert(std::is_same_v<T, bf16>, "TierMoE dtypes are double, float and bf16");
    return DType::bf16;
  }
}();

// The type arithmetic runs in: f64 stays f64, f32 and bf16 accumulate in f32.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Load/store between a storage type and its accumulation type.
template <class T>
inline acc_t<T> load(T v) {
  if constexpr (std::is_same_v<T, bf16>) return bf16_to_float(v);
  else return v;
}
template <class T>
inline T store(acc_t<T> v) {
  if constexpr (std::is_same_v<T, bf16>) return float_to_bf16(v);
  else return v;
}
// Rounds a value through T and back (the cast a real T tensor would apply).
template <class T>
inline acc_t<T> round_to(acc_t<T> v) { return load<T>(store<T>(v)); }

// Calls fn.template operator()<T>() with T the C++ type of `dt`:
//   visit_dtype(x.dtype(), [&]<class T>() { ... });
template <class Fn>
decltype(auto) visit_dtype(DType dt, Fn&& fn) {
  switch (dt) {
    case DType::f64: return fn.template operator()<double>();
    case DType::f32: return fn.template operator()<float>();
    case DType::bf16: return fn.template operator()<bf16>();
  }
  __builtin_unreachable();
}

}  // namespace tiermoe
