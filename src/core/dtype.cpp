#include "tiermoe/core/dtype.h"

#include <string>

#include "tiermoe/core/error.h"

namespace tiermoe {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::f64: return 8;
    case DType::f32: return 4;
    case DType::bf16: return 2;
  }
  __builtin_unreachable();
}

std::string_view dtype_name(DType dt) {
  switch (dt) {
    case DType::f64: return "f64";
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
  }
  __builtin_unreachable();
}

DType parse_dtype(std::string_view s, std::string_view where) {
  if (s == "f64" || s == "float64") return DType::f64;
  if (s == "f32" || s == "float32") return DType::f32;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  throw Error("unknown dtype '" + std::string(s) + "'", std::string(where),
              "use one of f64, f32, bf16");
}

}  // namespace tiermoe
