#pragma once
// Tensors crossing between Python (PyTorch, or any DLPack producer) and the
// engine, without a copy either way:
//   in:  a C-contiguous CPU array becomes a Tensor view of the caller's
//        memory. The view does not keep the array alive: the Python side
//        holds it for as long as the engine may read it (tiermoe/_ops.py keeps
//        every input an op's saved state points into on the autograd ctx).
//   out: an engine Tensor leaves as a DLPack array that shares its storage
//        and keeps it alive until the consumer (torch.from_dlpack) frees it.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "tiermoe/core/tensor.h"

namespace tiermoe::py {

namespace nb = nanobind;

// Any dtype, CPU, C-contiguous; dtype and shape are checked on conversion.
using Array = nb::ndarray<nb::device::cpu, nb::c_contig>;

// float64, float32 or bfloat16 -> a view; anything else is an Error naming
// `what` ("x_TD of model.layers.0.mlp.experts").
Tensor view_of(const Array& a, std::string_view what);
// An optional array (None -> an undefined Tensor).
Tensor view_of(const std::optional<Array>& a, std::string_view what);
// int64 or int32 [T, K] -> the engine's int32 ids (a copy: T*K ids).
std::vector<int32_t> ids_of(const Array& a, std::string_view what);

// The engine tensor as a DLPack array owning a reference to its storage.
nb::ndarray<> to_array(const Tensor& t);

}  // namespace tiermoe::py
