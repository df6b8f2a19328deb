#pragma once
// Checked size arithmetic: every shape, element-count and byte-count computation that could
// overflow goes through these, so that an absurd size is a ShapeError or an OutOfMemory naming the
// op, never a wrapped count (a [2^32, 2^32] tensor with numel() 0, 2^62 floats in a 0-byte
// buffer, a loop that never ends). Each function takes the op's name for its message.
//
// Also the narrowing of a 64-bit size to the int that a BLAS, cuDNN or MPI call takes.
#include <climits>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "ember/core/error.hpp"

namespace ember::checked {

// The largest byte count ember will try to allocate: what ptrdiff_t (and the allocators' int64
// statistics) can hold. Anything larger cannot exist on any machine.
inline constexpr uint64_t kMaxBytes = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// a + b for sizes; ShapeError naming `op` and `what` when the sum overflows int64.
inline int64_t add(int64_t a, int64_t b, const char* op, const char* what = "size") {
  int64_t r;
  EMBER_CHECK(!__builtin_add_overflow(a, b, &r), ShapeError, op, ": ", what, " overflows int64 (", a, " + ", b, ")");
  return r;
}

// a * b for sizes; ShapeError naming `op` and `what` when the product overflows int64.
inline int64_t mul(int64_t a, int64_t b, const char* op, const char* what = "size") {
  int64_t r;
  EMBER_CHECK(!__builtin_mul_overflow(a, b, &r), ShapeError, op, ": ", what, " overflows int64 (", a, " * ", b, ")");
  return r;
}

// The product of `n` non-negative dimensions, or -1 when it overflows int64. A zero dimension
// anywhere makes it 0, whatever the others.
inline int64_t product_or_overflow(const int64_t* dims, int n) {
  for (int i = 0; i < n; ++i)
    if (dims[i] == 0) return 0;
  int64_t p = 1;
  for (int i = 0; i < n; ++i)
    if (__builtin_mul_overflow(p, dims[i], &p)) return -1;
  return p;
}

// Bytes of `numel` elements of `elem_size` bytes: OutOfMemory naming `op` when the count cannot
// be allocated anywhere (more than kMaxBytes), with the figures.
inline size_t nbytes(int64_t numel, size_t elem_size, const char* op) {
  uint64_t b;
  const bool overflow = numel < 0 || __builtin_mul_overflow(static_cast<uint64_t>(numel), elem_size, &b) ||
                        b > kMaxBytes;
  if (overflow)
    throw OutOfMemory(::ember::detail::str_cat(op, ": ", numel, " elements of ", elem_size,
                                               " bytes need more than 2^63 bytes; no device can hold them"),
                      -1, -1, -1);
  return static_cast<size_t>(b);
}

// A 64-bit size narrowed to the int a library call takes (BLAS, cuDNN descriptors): ShapeError
// naming the op and the library when it does not fit, rather than a silently wrapped dimension.
inline int to_int(int64_t v, const char* op, const char* what) {
  EMBER_CHECK(v >= INT_MIN && v <= INT_MAX, ShapeError, op, ": ", what, " = ", v,
              " does not fit the 32-bit int the library call takes (at most ", INT_MAX, ")");
  return static_cast<int>(v);
}

}  // namespace ember::checked
