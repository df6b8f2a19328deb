#pragma once
// Device-to-device copies on a device's ember stream (the kernel table's copy and copy_2d; cast and
// strided_copy use them for what is already contiguous): stream-ordered, no synchronisation.
#include <cstddef>

#include "ember/backend/cuda/launch_context.hpp"
#include "ember/backend/cuda/runtime.hpp"

namespace ember::cuda {

inline void copy_device(const LaunchContext& c, void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  DeviceGuard g(c.device);
  const char* d = static_cast<const char*>(dst);
  const char* s = static_cast<const char*>(src);
  if (d < s + bytes && s < d + bytes) {  // overlapping (memmove semantics): go through a temporary
    void* tmp = c.scratch(bytes);
    cudaError_t e = cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, c.stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, c.stream);
    c.release(tmp, bytes);
    internal::check_cuda(e, "cudaMemcpyAsync (overlapping copy)", __FILE__, __LINE__);
    return;
  }
  EMBER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c.stream));
}

// `rows` rows of `row_bytes`, each at its pitch.
inline void copy_device_2d(const LaunchContext& c, void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                           size_t row_bytes, size_t rows) {
  if (rows == 0 || row_bytes == 0) return;
  if (rows == 1 || (dst_pitch == row_bytes && src_pitch == row_bytes)) {
    copy_device(c, dst, src, rows == 1 ? row_bytes : row_bytes * rows);
    return;
  }
  DeviceGuard g(c.device);
  cudaError_t e =
      cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice, c.stream);
  if (e == cudaErrorInvalidPitchValue || e == cudaErrorInvalidValue) {
    // Pitches beyond what the copy engine takes (cudaDevAttrMaxPitch): one copy per row.
    (void)cudaGetLastError();
    for (size_t r = 0; r < rows; ++r)
      EMBER_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + r * dst_pitch,
                                       static_cast<const char*>(src) + r * src_pitch, row_bytes,
                                       cudaMemcpyDeviceToDevice, c.stream));
    return;
  }
  internal::check_cuda(e, "cudaMemcpy2DAsync", __FILE__, __LINE__);
}

}  // namespace ember::cuda
