#pragma once
// Tensor shapes: up to kMaxDims dimensions, stored inline (no heap).
#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "ember/core/checked_math.hpp"
#include "ember/core/error.hpp"

namespace ember {

inline constexpr int kMaxDims = 8;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.end()); }
  // Implicit, so that a std::vector<int64_t> serves wherever a Shape is asked for
  // (Tensor<float>::from_vector(values, dims), zeros(dims), reshape(dims)).
  Shape(const std::vector<int64_t>& dims) { assign(dims.begin(), dims.end()); }  // NOLINT(google-explicit-constructor)

  int dim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t& operator[](int i) { return dims_[static_cast<size_t>(i)]; }
  // The element count. A shape whose count overflows int64 can be built (its dims are valid), but
  // never silently wraps: numel() raises; checked_numel(op) raises naming the op (what factories,
  // reshape, expand and broadcasting call first).
  int64_t numel() const { return checked_numel("shape"); }
  int64_t checked_numel(const char* op) const {
    const int64_t n = checked::product_or_overflow(dims_.data(), ndim_);
    EMBER_CHECK(n >= 0, ShapeError, op, ": shape ", str(), " has more elements than int64 can count");
    return n;
  }
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + ndim_; }
  std::vector<int64_t> vec() const { return std::vector<int64_t>(begin(), end()); }

  void push_back(int64_t d) {
    EMBER_CHECK(ndim_ < kMaxDims, ShapeError, "shape: more than ", kMaxDims, " dimensions");
    dims_[static_cast<size_t>(ndim_++)] = d;
  }
  // Contiguous row-major strides, in elements.
  std::array<int64_t, kMaxDims> strides() const {
    std::array<int64_t, kMaxDims> s{};
    int64_t acc = 1;
    for (int i = ndim_ - 1; i >= 0; --i) {
      s[static_cast<size_t>(i)] = acc;
      // Wraps (no UB) only for a shape with a zero dimension, whose strides nothing reads.
      __builtin_mul_overflow(acc, dims_[static_cast<size_t>(i)], &acc);
    }
    return s;
  }
  bool operator==(const Shape& o) const {
    if (ndim_ != o.ndim_) return false;
    for (int i = 0; i < ndim_; ++i)
      if (dims_[static_cast<size_t>(i)] != o.dims_[static_cast<size_t>(i)]) return false;
    return true;
  }
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < ndim_; ++i) s += (i ? ", " : "") + std::to_string(dims_[static_cast<size_t>(i)]);
    return s + "]";
  }

 private:
  template <class It>
  void assign(It b, It e) {
    for (; b != e; ++b) {
      EMBER_CHECK(*b >= 0, ShapeError, "shape: negative dimension ", *b);
      push_back(*b);
    }
  }
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

inline std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }

// Normalises a possibly negative dimension index against a rank; names the op in the error.
inline int normalize_dim(int d, int ndim, const char* op) {
  int r = d < 0 ? d + ndim : d;
  EMBER_CHECK(r >= 0 && r < ndim, IndexError, op, ": dimension ", d, " out of range for a tensor of rank ", ndim);
  return r;
}

}  // namespace ember
