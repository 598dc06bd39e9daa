#include "tiermoe/core/tensor.h"

#include "tiermoe/core/allocator.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace tiermoe {

struct Tensor::Storage {
  void* ptr = nullptr;
  size_t bytes = 0;
  MemTag tag = MemTag::activations;
  MemoryTracker* tracker = nullptr;   // null for external memory
  std::shared_ptr<void> owner;        // keeps external memory alive

  ~Storage() {
    if (tracker) {
      tracker->on_free(tag, bytes);
      HostAllocator::process().deallocate(ptr, bytes);
    }
  }
};

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    TIERMOE_CHECK(d >= 0, "negative dimension in shape " + shape_str(shape), "", "");
    TIERMOE_CHECK(!__builtin_mul_overflow(n, d, &n), "shape " + shape_str(shape) + " overflows",
                  "", "");
  }
  return n;
}

Tensor Tensor::empty(Shape shape, DType dtype, MemTag tag, MemoryTracker& tracker) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  auto st = std::make_shared<Storage>();
  st->bytes = t.nbytes();
  st->ptr = HostAllocator::process().allocate(st->bytes);
  if (!st->ptr) {
    throw Error("out of host memory allocating " + std::to_string(st->bytes) + " bytes for " +
                    t.str(),
                std::string(mem_tag_name(tag)), "reduce --tokens/--batch or the model size");
  }
  st->tag = tag;
  st->tracker = &tracker;
  tracker.on_alloc(tag, st->bytes);
  t.storage_ = std::move(st);
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, MemTag tag, MemoryTracker& tracker) {
  Tensor t = empty(std::move(shape), dtype, tag, tracker);
  t.zero();
  return t;
}

Tensor Tensor::from_external(void* data, Shape shape, DType dtype, std::shared_ptr<void> owner) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  auto st = std::make_shared<Storage>();
  st->ptr = data;
  st->bytes = t.nbytes();
  st->owner = std::move(owner);
  t.storage_ = std::move(st);
  return t;
}

Tensor Tensor::from_values(Shape shape, DType dtype, const std::vector<double>& values,
                           MemTag tag) {
  Tensor t = empty(std::move(shape), dtype, tag);
  TIERMOE_CHECK(int64_t(values.size()) == t.numel(),
                "from_values: " + std::to_string(values.size()) + " values for " + t.str(), "", "");
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, values[size_t(i)]);
  return t;
}

int64_t Tensor::size(int64_t i) const {
  int64_t d = dim();
  if (i < 0) i += d;
  TIERMOE_ASSERT(i >= 0 && i < d, "dimension ", i, " of ", str());
  return shape_[size_t(i)];
}

std::string Tensor::str() const {
  if (!defined()) return "undefined";
  return std::string(dtype_name(dtype_)) + shape_str(shape_);
}

void* Tensor::base() const {
  TIERMOE_ASSERT(storage_, "use of an undefined tensor");
  return static_cast<char*>(storage_->ptr) + offset_;
}

void Tensor::check_type(DType want) const {
  TIERMOE_ASSERT(defined(), "use of an undefined tensor");
  TIERMOE_ASSERT(dtype_ == want, "tensor ", str(), " accessed as ", dtype_name(want));
}

double Tensor::get(int64_t i) const {
  TIERMOE_ASSERT(i >= 0 && i < numel_, "index ", i, " of ", str());
  return visit_dtype(dtype_, [&]<class T>() -> double {
    return double(load<T>(static_cast<const T*>(base())[i]));
  });
}

void Tensor::set(int64_t i, double v) {
  TIERMOE_ASSERT(i >= 0 && i < numel_, "index ", i, " of ", str());
  visit_dtype(dtype_, [&]<class T>() {
    static_cast<T*>(base())[i] = store<T>(acc_t<T>(v));
  });
}

std::vector<double> Tensor::to_vector() const {
  std::vector<double> out(static_cast<size_t>(numel_));
  for (int64_t i = 0; i < numel_; ++i) out[size_t(i)] = get(i);
  return out;
}

Tensor Tensor::view(Shape shape) const {
  int64_t n = shape_numel(shape);
  TIERMOE_ASSERT(n == numel_, "view ", shape_str(shape), " of ", str());
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  TIERMOE_ASSERT(dim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "rows [", begin,
                 ", ", end, ") of ", str());
  int64_t row = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  Tensor t = *this;
  t.offset_ += size_t(begin * row) * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  t.numel_ = (end - begin) * row;
  return t;
}

Tensor Tensor::squeeze0() const {
  Tensor t = *this;
  t.shape_.erase(t.shape_.begin());
  return t;
}

Tensor Tensor::clone(MemTag tag, MemoryTracker& tracker) const { return to(dtype_, tag, tracker); }

Tensor Tensor::to(DType dtype, MemTag tag, MemoryTracker& tracker) const {
  Tensor t = empty(shape_, dtype, tag, tracker);
  t.copy_from(*this);
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  TIERMOE_ASSERT(src.numel() == numel_, "copy ", src.str(), " into ", str());
  if (src.dtype_ == dtype_) {
    if (nbytes()) std::memmove(base(), src.base(), nbytes());
    return;
  }
  visit_dtype(dtype_, [&]<class To>() {
    visit_dtype(src.dtype_, [&]<class From>() {
      const From* s = static_cast<const From*>(src.base());
      To* d = static_cast<To*>(base());
      for (int64_t i = 0; i < numel_; ++i) {
        // f64 -> bf16 goes through f32, as torch's conversion does.
        double v = double(load<From>(s[i]));
        if constexpr (std::is_same_v<To, bf16>) d[i] = float_to_bf16(float(v));
        else d[i] = To(v);
      }
    });
  });
}

void Tensor::zero() {
  if (nbytes()) std::memset(base(), 0, nbytes());
}

void Tensor::fill(double v) {
  visit_dtype(dtype_, [&]<class T>() {
    T x = store<T>(acc_t<T>(v));
    T* d = static_cast<T*>(base());
    for (int64_t i = 0; i < numel_; ++i) d[i] = x;
  });
}

MemTag Tensor::tag() const {
  TIERMOE_ASSERT(defined(), "tag of an undefined tensor");
  return storage_->tag;
}

void Tensor::retag(MemTag tag) {
  TIERMOE_ASSERT(defined(), "retag of an undefined tensor");
  if (storage_->tracker) storage_->tracker->on_retag(storage_->tag, tag, storage_->bytes);
  storage_->tag = tag;
}

bool Tensor::owns_storage() const { return storage_ && storage_->tracker != nullptr; }

void check_shape(const Tensor& t, const Shape& want, std::string_view name) {
  TIERMOE_CHECK(t.defined() && t.shape() == want,
                std::string(name) + ": expected shape " + shape_str(want) + ", got " + t.str(), "",
                "");
}

void check_dtype(const Tensor& t, DType want, std::string_view name) {
  TIERMOE_CHECK(t.defined() && t.dtype() == want,
                std::string(name) + ": expected dtype " + std::string(dtype_name(want)) +
                    ", got " + t.str(),
                "", "");
}

void check_same_dtype(const Tensor& a, const Tensor& b, std::string_view a_name,
                      std::string_view b_name) {
  TIERMOE_CHECK(a.dtype() == b.dtype(),
                std::string(a_name) + " is " + a.str() + " but " + std::string(b_name) + " is " +
                    b.str(),
                "", "all operands of a kernel share one compute dtype");
}

}  // namespace tiermoe
