#pragma once
// The fused image-preprocessing kernel (kernel table: preprocess_images): uint8 NHWC on the device
// -> normalised NCHW float32 / float16 / bfloat16 with per-sample crop and flip, one thread per
// output element. The per-pixel function is shared with the CPU twin (backend/cpu/preprocess.hpp)
// through backend/preprocess_math.hpp.
#if defined(__CUDACC__)
#include "ember/backend/cuda/kernels/common.cuh"
#include "ember/backend/cuda/kernels/launch.cuh"
#include "ember/backend/preprocess_math.hpp"

namespace ember::cuda_impl {
namespace {

template <class T>
__global__ void preprocess_images_kernel(PreprocessArgs a, const uint8_t* x, const int32_t* params, T* y) {
  const int64_t total = a.n * a.c * a.out_h * a.out_w;
  EMBER_GRID_STRIDE_LOOP(o, total) {
    const int64_t ox = o % a.out_w, oy = (o / a.out_w) % a.out_h, ch = (o / (a.out_w * a.out_h)) % a.c;
    const int64_t i = o / (a.out_w * a.out_h * a.c);
    y[o] = T(preprocess_math::pixel(a, x, params, i, ch, oy, ox));
  }
}

// The kernel table's preprocess_images: float32, float16 or bfloat16 output.
inline void launch_preprocess_images(const LaunchContext& c, const PreprocessArgs& a, const uint8_t* x,
                                     const int32_t* params, void* y) {
  const int64_t total = a.n * a.c * a.out_h * a.out_w;
  if (total <= 0) return;
  DeviceGuard g(c.device);
  const unsigned grid = grid_for(total, c.sm_count);
  switch (a.out_dtype) {
    case DType::Float32:
      preprocess_images_kernel<float><<<grid, kThreads, 0, c.stream>>>(a, x, params, static_cast<float*>(y));
      break;
    case DType::Float16:
      preprocess_images_kernel<half><<<grid, kThreads, 0, c.stream>>>(a, x, params, static_cast<half*>(y));
      break;
    case DType::BFloat16:
      preprocess_images_kernel<bfloat16><<<grid, kThreads, 0, c.stream>>>(a, x, params, static_cast<bfloat16*>(y));
      break;
    default:
      throw DTypeError(::ember::detail::str_cat("preprocess_images: output dtype ", dtype_name(a.out_dtype),
                                                " (float32, float16 or bfloat16) on cuda:", c.device));
  }
  EMBER_CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
