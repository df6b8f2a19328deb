#pragma once
// What the launch_* functions of the kernel headers share: the LaunchContext they queue on
// (launch_context.hpp), the device guard, the dispatch of a kernel-table dtype to the element type
// of a kernel, and the common shape of a launch (launch_typed).
#if defined(__CUDACC__)
#include <cstdint>
#include <utility>

#include "ember/backend/cuda/kernels/common.cuh"
#include "ember/backend/cuda/launch_context.hpp"
#include "ember/backend/cuda/runtime.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/error.hpp"

namespace ember::cuda_impl {
namespace {

using ::ember::cuda::DeviceGuard;
using ::ember::cuda::LaunchContext;

// Every dtype (like ember::dispatch_dtype).
template <class F>
void dispatch_all(DType t, F&& f) {
  dispatch_dtype(t, std::forward<F>(f));
}

// Floating types only; any other dtype is a DTypeError naming the op, the dtype and the device.
template <class F>
void dispatch_floating(DType t, const char* op, int device, F&& f) {
  switch (t) {
    case DType::Float32: f(float{}); return;
    case DType::Float64: f(double{}); return;
    case DType::Float16: f(half{}); return;
    case DType::BFloat16: f(bfloat16{}); return;
    default:
      throw DTypeError(::ember::detail::str_cat(op, ": unsupported dtype ", dtype_name(t), " on cuda:", device,
                                                " (float32, float64, float16 and bfloat16 are supported)"));
  }
}

// By element size, for kernels that only move elements: f(unsigned integer of that size).
template <class F>
void dispatch_bits(DType t, F&& f) {
  switch (dtype_size(t)) {
    case 1: f(uint8_t{}); return;
    case 2: f(uint16_t{}); return;
    case 4: f(uint32_t{}); return;
    case 8: f(uint64_t{}); return;
    default: throw DTypeError(::ember::detail::str_cat("unknown dtype ", static_cast<int>(t), " on cuda"));
  }
}

// The shape of most launches: nothing when there are no elements (n <= 0); else the device made
// current, launch(T{}) for the element type of `t`, and the launch checked. The element types:
// every dtype (dispatch_all), unsigned integers of the dtype's size (dispatch_bits), or floating
// dtypes only (dispatch_floating: another dtype is a DTypeError naming `op`).
enum class Elements { All, Bits, Floating };

template <Elements E, class F>
inline void launch_typed(const LaunchContext& c, DType t, int64_t n, const char* op, F&& launch) {
  if (n <= 0) return;
  DeviceGuard g(c.device);
  if constexpr (E == Elements::All) {
    dispatch_all(t, launch);
  } else if constexpr (E == Elements::Bits) {
    dispatch_bits(t, launch);
  } else {
    dispatch_floating(t, op, c.device, launch);
  }
  EMBER_CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
