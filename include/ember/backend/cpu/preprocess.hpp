#pragma once
// Fused image preprocessing (the kernel table's preprocess_images; data/device_preprocess.hpp):
// uint8 NHWC -> normalised NCHW float32 / float16 / bfloat16 with a per-sample crop window (zero
// outside the image) and horizontal flip. The per-pixel function (backend/preprocess_math.hpp) is
// shared with the CUDA kernel (backend/cuda/kernels/preprocess.cuh), so both compute the same numbers.
#include <cstdint>

#include "ember/backend/preprocess_math.hpp"
#include "ember/core/backend.hpp"
#include "ember/core/half.hpp"

namespace ember::cpu {

template <class T>
void preprocess_images(const PreprocessArgs& a, const uint8_t* x, const int32_t* params, T* y) {
  for (int64_t i = 0; i < a.n; ++i)
    for (int64_t ch = 0; ch < a.c; ++ch)
      for (int64_t oy = 0; oy < a.out_h; ++oy)
        for (int64_t ox = 0; ox < a.out_w; ++ox)
          y[((i * a.c + ch) * a.out_h + oy) * a.out_w + ox] = T(preprocess_math::pixel(a, x, params, i, ch, oy, ox));
}

}  // namespace ember::cpu
