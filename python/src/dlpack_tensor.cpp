#include "dlpack_tensor.h"

#include <string>

namespace tiermoe::py {

namespace {

DType dtype_of_array(const Array& a, std::string_view what) {
  const nb::dlpack::dtype d = a.dtype();
  if (d.lanes == 1) {
    if (d.code == uint8_t(nb::dlpack::dtype_code::Float) && d.bits == 64) return DType::f64;
    if (d.code == uint8_t(nb::dlpack::dtype_code::Float) && d.bits == 32) return DType::f32;
    if (d.code == uint8_t(nb::dlpack::dtype_code::Bfloat) && d.bits == 16) return DType::bf16;
  }
  throw Error(detail::str_of("unsupported dtype (DLPack code ", int(d.code), ", ", int(d.bits),
                             " bits)"),
              std::string(what), "TierMoE computes in torch.float64, torch.float32 or torch.bfloat16");
}

Shape shape_of(const Array& a) {
  Shape s(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) s[i] = int64_t(a.shape(i));
  return s;
}

nb::dlpack::dtype dlpack_dtype(DType dt) {
  switch (dt) {
    case DType::f64: return nb::dtype<double>();
    case DType::f32: return nb::dtype<float>();
    case DType::bf16: return {uint8_t(nb::dlpack::dtype_code::Bfloat), 16, 1};
  }
  __builtin_unreachable();
}

}  // namespace

Tensor view_of(const Array& a, std::string_view what) {
  return Tensor::from_external(a.data(), shape_of(a), dtype_of_array(a, what), nullptr);
}

Tensor view_of(const std::optional<Array>& a, std::string_view what) {
  return a ? view_of(*a, what) : Tensor();
}

std::vector<int32_t> ids_of(const Array& a, std::string_view what) {
  const nb::dlpack::dtype d = a.dtype();
  TIERMOE_CHECK(d.code == uint8_t(nb::dlpack::dtype_code::Int) && (d.bits == 64 || d.bits == 32) &&
                    d.lanes == 1,
                "expert ids must be int64 or int32", std::string(what),
                "pass top_k_index as transformers' routers return it (torch.long)");
  std::vector<int32_t> ids(a.size());
  if (d.bits == 64) {
    const auto* p = static_cast<const int64_t*>(a.data());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(p[i]);
  } else {
    const auto* p = static_cast<const int32_t*>(a.data());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = p[i];
  }
  return ids;
}

nb::ndarray<> to_array(const Tensor& t) {
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  // The capsule owns a Tensor sharing the storage; DLPack's deleter frees it.
  auto* keep = new Tensor(t);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  return nb::ndarray<>(const_cast<void*>(t.raw()), shape.size(), shape.data(), owner, nullptr,
                       dlpack_dtype(t.dtype()), nb::device::cpu::value);
}

}  // namespace tiermoe::py
