#pragma once
// Image preprocessing on the device (the DALI idea): the loader ships raw uint8 [N, H, W, C]
// batches (a quarter of the bytes of float32) and one fused kernel (kernel table:
// preprocess_images; backend/cuda/kernels/preprocess.cuh, CPU twin backend/cpu/preprocess.hpp)
// writes normalised float32 / float16 / bfloat16 [N, C, out_h, out_w] with a per-sample random
// crop and flip.
//
// The per-sample crop offsets and flips are drawn on the host from SampleRandom(seed, epoch,
// index) in the order RandomCrop and RandomHorizontalFlip draw them, so the result equals the CPU
// transforms Compose({ToFloat, RandomCrop{out_h, out_w, padding}, RandomHorizontalFlip{flip_p},
// Normalize{mean, std}}) for the same seed (bit for bit in float32).
//
//   data::DataLoader loader(ds, {.batch_size = 256, .device = Device::cuda(0)});   // uint8 batches
//   for (data::Batch& b : loader) {
//     auto x = data::preprocess_batch(b, "image", seed, {.random_crop = true, .padding = 4, .flip = true,
//                                                        .mean = {0.49f, 0.48f, 0.45f}, .std = {0.25f, 0.24f, 0.26f}});
#include <cstdint>
#include <string>
#include <vector>

#include "ember/core/backend_registry.hpp"
#include "ember/core/error.hpp"
#include "ember/core/tensor.hpp"
#include "ember/data/dataloader.hpp"
#include "ember/data/sample_random.hpp"

namespace ember::data {

struct DevicePreprocessOptions {
  int64_t out_h = 0, out_w = 0;  // output size; 0: the input's
  bool random_crop = false;      // a random out_h x out_w window of the image padded by `padding`
  int64_t padding = 0;
  bool flip = false;             // horizontal flip with probability flip_p
  double flip_p = 0.5;
  std::vector<float> mean{0.0f}, std{1.0f};  // per channel, or one for all
  float scale = 1.0f / 255.0f;   // applied before the normalisation (ToFloat's)
  DType out_dtype = DType::Float32;
};

// (top, left, flip) per sample: int32 [n * 3]. Without random_crop the window is centred.
inline std::vector<int32_t> preprocess_params(const std::vector<int64_t>& indices, uint64_t seed, uint64_t epoch,
                                              int64_t h, int64_t w, const DevicePreprocessOptions& o) {
  const int64_t oh = o.out_h ? o.out_h : h, ow = o.out_w ? o.out_w : w;
  EMBER_CHECK(o.padding >= 0 && oh >= 1 && ow >= 1 && oh <= h + 2 * o.padding && ow <= w + 2 * o.padding, ValueError,
              "preprocess: a ", oh, "x", ow, " window with padding ", o.padding, " does not fit ", h, "x", w, " images");
  std::vector<int32_t> p;
  p.reserve(indices.size() * 3);
  for (int64_t idx : indices) {
    SampleRandom rng(seed, epoch, idx);
    int64_t top = (h - oh) / 2, left = (w - ow) / 2;
    if (o.random_crop) {
      top = rng.randint(0, h + 2 * o.padding - oh) - o.padding;
      left = rng.randint(0, w + 2 * o.padding - ow) - o.padding;
    }
    const bool flip = o.flip && rng.bernoulli(o.flip_p);
    p.push_back(static_cast<int32_t>(top));
    p.push_back(static_cast<int32_t>(left));
    p.push_back(flip ? 1 : 0);
  }
  return p;
}

// images: uint8 [n, h, w, c] (c <= 4) or [n, h, w], on any device; indices/epoch key the draws.
inline AnyTensor preprocess_images(const AnyTensor& images, const std::vector<int64_t>& indices, uint64_t seed,
                                   uint64_t epoch, const DevicePreprocessOptions& o) {
  EMBER_CHECK(images.dtype() == DType::UInt8 && (images.dim() == 3 || images.dim() == 4), DTypeError,
              "preprocess: images must be uint8 [N, H, W, C] or [N, H, W], got ", dtype_name(images.dtype()), " ",
              images.shape().str());
  const int64_t n = images.size(0), h = images.size(1), w = images.size(2), c = images.dim() == 4 ? images.size(3) : 1;
  EMBER_CHECK(c >= 1 && c <= 4, ShapeError, "preprocess: ", c, " channels (1 to 4 are supported)");
  EMBER_CHECK(static_cast<int64_t>(indices.size()) == n, ValueError, "preprocess: ", indices.size(),
              " sample indices for a batch of ", n);
  EMBER_CHECK((o.mean.size() == 1 || static_cast<int64_t>(o.mean.size()) == c) && o.mean.size() == o.std.size(),
              ValueError, "preprocess: ", o.mean.size(), " means and ", o.std.size(), " stds for ", c, " channels");
  EMBER_CHECK(o.out_dtype == DType::Float32 || o.out_dtype == DType::Float16 || o.out_dtype == DType::BFloat16,
              DTypeError, "preprocess: output dtype ", dtype_name(o.out_dtype), " (float32, float16 or bfloat16)");
  PreprocessArgs a;
  a.n = n, a.h = h, a.w = w, a.c = c;
  a.out_h = o.out_h ? o.out_h : h;
  a.out_w = o.out_w ? o.out_w : w;
  a.out_dtype = o.out_dtype;
  a.scale = o.scale;
  for (int64_t k = 0; k < c; ++k) {
    const size_t j = o.mean.size() == 1 ? 0 : static_cast<size_t>(k);
    EMBER_CHECK(o.std[j] != 0.0f, ValueError, "preprocess: std of channel ", k, " is 0");
    a.mean[k] = o.mean[j];
    a.inv_std[k] = 1.0f / o.std[j];
  }
  auto params = Tensor<int32_t>::from_vector(preprocess_params(indices, seed, epoch, h, w, o), {n, 3}, images.device());
  AnyTensor out = AnyTensor::empty({n, c, a.out_h, a.out_w}, o.out_dtype, images.device());
  if (n > 0)
    images.backend().preprocess_images(a, static_cast<const uint8_t*>(images.data_ptr()),
                                         static_cast<const int32_t*>(params.data_ptr()), out.data_ptr());
  return out;
}

// The batch's field, with the batch's indices and epoch.
inline AnyTensor preprocess_batch(const Batch& b, const std::string& field, uint64_t seed,
                                  const DevicePreprocessOptions& o) {
  return preprocess_images(b[field], b.indices, seed, b.epoch, o);
}

}  // namespace ember::data
