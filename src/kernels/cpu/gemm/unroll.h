#pragma once
// unroll<N>(fn) calls fn(std::integral_constant<int, i>{}) for i = 0..N-1,
// expanded at compile time. The microkernels index their accumulator arrays
// with these constants, so the compiler keeps every accumulator in a
// register; with plain loops GCC 12 spills them to the stack on every k.
// A template only (see microkernel.h on the real-ISA translation units).
#include <type_traits>
#include <utility>

namespace tiermoe::cpu::gemm {

template <int N, class Fn>
[[gnu::always_inline]] inline void unroll(Fn&& fn) {
  [&]<int... I>(std::integer_sequence<int, I...>) { (fn(std::integral_constant<int, I>{}), ...); }
  (std::make_integer_sequence<int, N>{});
}

}  // namespace tiermoe::cpu::gemm
