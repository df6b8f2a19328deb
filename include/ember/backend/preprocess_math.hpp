#pragma once
// The per-pixel function of the fused image preprocessing (the kernel table's preprocess_images),
// host/device code shared by the CPU kernel (backend/cpu/preprocess.hpp) and the CUDA kernel
// (backend/cuda/kernels/preprocess.cuh), so that both compute the same numbers, and the same numbers
// as the CPU transforms ToFloat -> RandomCrop -> RandomHorizontalFlip -> Normalize.
#include <cstdint>

#include "ember/core/backend.hpp"
#include "ember/core/macros.hpp"

namespace ember::preprocess_math {

// (x * scale - mean) * inv_std with every operation rounded separately (no FMA contraction on
// the device), as ToFloat and Normalize do on the CPU.
EMBER_HD inline float normalise(float x, float scale, float mean, float inv_std) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(__fsub_rn(__fmul_rn(x, scale), mean), inv_std);
#else
  volatile float v = x * scale;  // volatile: no contraction into an FMA on hosts that have one
  volatile float d = v - mean;
  return d * inv_std;
#endif
}

// Output element (i, ch, oy, ox) of the batch. params: int32 [n, 3] = top, left, flip.
EMBER_HD inline float pixel(const PreprocessArgs& a, const uint8_t* x, const int32_t* params, int64_t i, int64_t ch,
                            int64_t oy, int64_t ox) {
  const int64_t top = params[3 * i], left = params[3 * i + 1];
  const bool flip = params[3 * i + 2] != 0;
  const int64_t sy = top + oy, sx = left + (flip ? a.out_w - 1 - ox : ox);
  float v = 0.0f;
  if (sy >= 0 && sy < a.h && sx >= 0 && sx < a.w) v = static_cast<float>(x[((i * a.h + sy) * a.w + sx) * a.c + ch]);
  return normalise(v, a.scale, a.mean[ch], a.inv_std[ch]);
}

}  // namespace ember::preprocess_math
