#pragma once
// A dense, contiguous, row-major tensor: dtype, shape and storage. A tensor
// either owns its storage (allocated through a MemoryTracker, 64-byte aligned
// for AMX/AVX-512 loads) or is a view into another tensor or external memory
// (e.g. an mmap'ed safetensors file). Copies share storage, like torch.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "tiermoe/core/dtype.h"
#include "tiermoe/core/error.h"
#include "tiermoe/core/memory.h"

namespace tiermoe {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& shape);  // "[2, 3]"
int64_t shape_numel(const Shape& shape);    // throws on negative dims or overflow

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false

  static Tensor empty(Shape shape, DType dtype, MemTag tag = MemTag::activations,
                      MemoryTracker& tracker = MemoryTracker::process());
  static Tensor zeros(Shape shape, DType dtype, MemTag tag = MemTag::activations,
                      MemoryTracker& tracker = MemoryTracker::process());
  // A view of memory owned by someone else; `owner` is kept alive as long as
  // any view of it. Not counted by a tracker (the owner accounts for it).
  static Tensor from_external(void* data, Shape shape, DType dtype, std::shared_ptr<void> owner);
  // A new tensor holding `values` converted to `dtype` (tests, small tables).
  static Tensor from_values(Shape shape, DType dtype, const std::vector<double>& values,
                            MemTag tag = MemTag::activations);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t size(int64_t i) const;  // negative i counts from the end
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return size_t(numel_) * dtype_size(dtype_); }
  std::string str() const;  // "bf16[2, 3]"

  void* raw() { return base(); }
  const void* raw() const { return base(); }
  template <class T>
  T* data() {
    check_type(dtype_of<T>);
    return static_cast<T*>(base());
  }
  template <class T>
  const T* data() const {
    check_type(dtype_of<T>);
    return static_cast<const T*>(base());
  }

  // Element access through double, for tests, tables and reference code.
  double get(int64_t flat) const;
  void set(int64_t flat, double v);
  std::vector<double> to_vector() const;

  // Views share storage.
  Tensor view(Shape shape) const;                    // same numel
  Tensor rows(int64_t begin, int64_t end) const;     // narrow dimension 0
  Tensor select(int64_t i) const { return rows(i, i + 1).squeeze0(); }

  // Copies.
  Tensor clone(MemTag tag = MemTag::activations,
               MemoryTracker& tracker = MemoryTracker::process()) const;
  Tensor to(DType dtype, MemTag tag = MemTag::activations,
            MemoryTracker& tracker = MemoryTracker::process()) const;
  void copy_from(const Tensor& src);  // same numel; converts dtype (bf16 rounds to nearest even)
  void zero();
  void fill(double v);

  // Storage bookkeeping.
  MemTag tag() const;
  // Re-accounts the whole storage under another tag (e.g. kept for backward).
  void retag(MemTag tag);
  bool owns_storage() const;
  bool same_storage(const Tensor& other) const { return storage_ == other.storage_; }
  long use_count() const { return storage_.use_count(); }

 private:
  struct Storage;
  Tensor squeeze0() const;
  void* base() const;
  void check_type(DType want) const;

  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes from the start of storage
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
};

// Shape checks with messages that name the tensor: "x_TD: expected [4, 8], got [4, 9]".
void check_shape(const Tensor& t, const Shape& want, std::string_view name);
void check_dtype(const Tensor& t, DType want, std::string_view name);
void check_same_dtype(const Tensor& a, const Tensor& b, std::string_view a_name,
                      std::string_view b_name);

}  // namespace tiermoe
