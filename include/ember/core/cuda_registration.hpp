#pragma once
// Where the CUDA backend registers itself: the per-device factory and the device count that the
// nvcc-compiled translation unit (backend/cuda/ember_cuda.cu) fills at start-up, and the queries
// on them. Apart from core/backend_registry.hpp (backend_for, which adds the CPU backend when it
// is header-only), so that the nvcc unit includes the kernel table and this, and no CPU kernel.
#include "ember/core/backend.hpp"

namespace ember {

namespace detail {
inline int& cuda_device_count_slot() {
  static int count = 0;
  return count;
}
inline Backend* (*&cuda_backend_factory())(int) {
  static Backend* (*factory)(int) = nullptr;
  return factory;
}
}  // namespace detail

// Called by the nvcc-compiled translation unit at start-up.
inline void register_cuda_backend(Backend* (*for_device)(int), int device_count) {
  detail::cuda_backend_factory() = for_device;
  detail::cuda_device_count_slot() = device_count;
}

namespace cuda {
// True when the CUDA backend was compiled into this program (ember::cuda linked).
inline bool is_compiled() { return detail::cuda_backend_factory() != nullptr; }
// Number of usable CUDA devices; 0 without a GPU or without the CUDA backend.
inline int device_count() { return detail::cuda_device_count_slot(); }
inline bool is_available() { return device_count() > 0; }
}  // namespace cuda

}  // namespace ember
