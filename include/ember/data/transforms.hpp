#pragma once
// CPU sample transforms for the DataLoader (data/dataloader.hpp): uint8 -> float, random crop with
// padding, horizontal flip, per-channel normalisation, and Compose. Each is a callable
// Example(Example, SampleRandom&) acting on one field ("image" by default); the random ones draw
// from the sample's SampleRandom (seed, epoch, index), so results do not depend on the worker.
//
// Layout: ToFloat turns uint8 [H, W] or [H, W, C] (what the IDX and image readers give) into
// float32 [C, H, W]; the other transforms take [C, H, W] (float32 or uint8).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/core/tensor.hpp"
#include "ember/data/dataset.hpp"
#include "ember/data/sample_random.hpp"

namespace ember::data {

namespace detail {
inline void check_chw(const AnyTensor& t, const char* op, const std::string& field) {
  EMBER_CHECK(t.dim() == 3, ShapeError, op, ": field '", field, "' must be [C, H, W], got ", t.shape().str(),
              " (apply ToFloat first to uint8 [H, W] or [H, W, C] images)");
  EMBER_CHECK(t.dtype() == DType::Float32 || t.dtype() == DType::UInt8, DTypeError, op, ": field '", field,
              "' must be float32 or uint8, got ", dtype_name(t.dtype()));
}
}  // namespace detail

// uint8 [H, W] / [H, W, C] -> float32 [C, H, W], times `scale` (1/255: values in [0, 1]).
struct ToFloat {
  std::string field = "image";
  float scale = 1.0f / 255.0f;
  Example operator()(Example ex, SampleRandom&) const {
    const AnyTensor& t = ex[field];
    EMBER_CHECK(t.dtype() == DType::UInt8, DTypeError, "ToFloat: field '", field, "' must be uint8, got ",
                dtype_name(t.dtype()));
    EMBER_CHECK(t.dim() == 2 || t.dim() == 3, ShapeError, "ToFloat: field '", field,
                "' must be [H, W] or [H, W, C], got ", t.shape().str());
    const int64_t h = t.size(0), w = t.size(1), c = t.dim() == 3 ? t.size(2) : 1;
    Tensor<float> out = Tensor<float>::empty({c, h, w});
    const auto* src = static_cast<const uint8_t*>(t.data_ptr());
    float* dst = out.data();
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x)
        for (int64_t k = 0; k < c; ++k) dst[(k * h + y) * w + x] = static_cast<float>(src[(y * w + x) * c + k]) * scale;
    ex.set(field, out);
    return ex;
  }
};

// Pads [C, H, W] by `padding` zeros on every side, then takes a random size_h x size_w window
// (top drawn first, then left: randint(0, H + 2p - size_h), randint(0, W + 2p - size_w)).
struct RandomCrop {
  int64_t size_h = 0, size_w = 0;
  int64_t padding = 0;
  std::string field = "image";
  Example operator()(Example ex, SampleRandom& rng) const {
    const AnyTensor& t = ex[field];
    detail::check_chw(t, "RandomCrop", field);
    const int64_t c = t.size(0), h = t.size(1), w = t.size(2);
    EMBER_CHECK(padding >= 0 && size_h >= 1 && size_w >= 1 && size_h <= h + 2 * padding && size_w <= w + 2 * padding,
                ValueError, "RandomCrop: a ", size_h, "x", size_w, " window with padding ", padding,
                " does not fit field '", field, "' of shape ", t.shape().str());
    const int64_t top = rng.randint(0, h + 2 * padding - size_h) - padding;
    const int64_t left = rng.randint(0, w + 2 * padding - size_w) - padding;
    AnyTensor out = AnyTensor::zeros({c, size_h, size_w}, t.dtype());
    const size_t es = dtype_size(t.dtype());
    const auto* src = static_cast<const uint8_t*>(t.data_ptr());
    auto* dst = static_cast<uint8_t*>(out.data_ptr());
    const int64_t x0 = std::max<int64_t>(0, -left), x1 = std::min<int64_t>(size_w, w - left);
    for (int64_t k = 0; k < c; ++k)
      for (int64_t y = 0; y < size_h; ++y) {
        const int64_t sy = top + y;
        if (sy < 0 || sy >= h || x1 <= x0) continue;
        std::memcpy(dst + ((k * size_h + y) * size_w + x0) * es, src + ((k * h + sy) * w + left + x0) * es,
                    static_cast<size_t>(x1 - x0) * es);
      }
    ex.set(field, std::move(out));
    return ex;
  }
};

// Mirrors [C, H, W] along W with probability p (one uniform draw).
struct RandomHorizontalFlip {
  double p = 0.5;
  std::string field = "image";
  Example operator()(Example ex, SampleRandom& rng) const {
    const AnyTensor& t = ex[field];
    detail::check_chw(t, "RandomHorizontalFlip", field);
    if (!rng.bernoulli(p)) return ex;
    const int64_t c = t.size(0), h = t.size(1), w = t.size(2);
    AnyTensor out = AnyTensor::empty(t.shape(), t.dtype());
    const size_t es = dtype_size(t.dtype());
    const auto* src = static_cast<const uint8_t*>(t.data_ptr());
    auto* dst = static_cast<uint8_t*>(out.data_ptr());
    for (int64_t r = 0; r < c * h; ++r)
      for (int64_t x = 0; x < w; ++x) std::memcpy(dst + (r * w + x) * es, src + (r * w + (w - 1 - x)) * es, es);
    ex.set(field, std::move(out));
    return ex;
  }
};

// (x - mean[c]) / std[c] on float32 [C, H, W]; one mean/std broadcasts to every channel.
struct Normalize {
  std::vector<float> mean, std;
  std::string field = "image";
  Example operator()(Example ex, SampleRandom&) const {
    const AnyTensor& t = ex[field];
    EMBER_CHECK(t.dim() == 3 && t.dtype() == DType::Float32, ShapeError, "Normalize: field '", field,
                "' must be float32 [C, H, W], got ", dtype_name(t.dtype()), " ", t.shape().str());
    const int64_t c = t.size(0), hw = t.size(1) * t.size(2);
    EMBER_CHECK((mean.size() == 1 || static_cast<int64_t>(mean.size()) == c) && mean.size() == std.size(), ValueError,
                "Normalize: ", mean.size(), " means and ", std.size(), " stds for ", c, " channels");
    Tensor<float> out = Tensor<float>::empty(t.shape());
    const auto* src = static_cast<const float*>(t.data_ptr());
    float* dst = out.data();
    for (int64_t k = 0; k < c; ++k) {
      const float m = mean[mean.size() == 1 ? 0 : static_cast<size_t>(k)];
      const float s = std[std.size() == 1 ? 0 : static_cast<size_t>(k)];
      EMBER_CHECK(s != 0.0f, ValueError, "Normalize: std of channel ", k, " is 0");
      const float inv = 1.0f / s;
      for (int64_t i = 0; i < hw; ++i) dst[k * hw + i] = (src[k * hw + i] - m) * inv;
    }
    ex.set(field, out);
    return ex;
  }
};

// Applies transforms in order (each draws from the same sample stream, in order).
class Compose {
 public:
  Compose(std::vector<std::function<Example(Example, SampleRandom&)>> steps) : steps_(std::move(steps)) {}
  Example operator()(Example ex, SampleRandom& rng) const {
    for (const auto& s : steps_) ex = s(std::move(ex), rng);
    return ex;
  }

 private:
  std::vector<std::function<Example(Example, SampleRandom&)>> steps_;
};

}  // namespace ember::data
