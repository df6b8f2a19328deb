#pragma once
// The fused image-preprocessing kernel (kernel table: preprocess_images): uint8 NHWC on the device
// -> normalised NCHW float32 / float16 / bfloat16 with per-sample crop and flip, one thread per
// output element. The per-pixel function is shared with the CPU twin (backend/cpu/preprocess.hpp).
#if defined(__CUDACC__)
#include "ember/backend/cpu/preprocess.hpp"
#include "ember/backend/cuda/kernels/common.cuh"

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

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
