// Device-side image preprocessing (data/device_preprocess.hpp; kernel table preprocess_images):
// the fused uint8 NHWC -> normalised NCHW kernel with per-sample crop and flip equals the CPU
// transforms (ToFloat, RandomCrop, RandomHorizontalFlip, Normalize) for the same seed, bit for bit
// in float32 and after rounding in float16 / bfloat16: on the CPU twin, through the pretend cuda:0
// in CI, and on a real GPU (EMBER_REQUIRE_GPU) against the CPU twin.
#include <catch2/catch.hpp>

#include <cstring>
#include <iostream>

#include "ember/data/device_preprocess.hpp"
#include "ember/data/transforms.hpp"
#include "gpu_skip.hpp"
#include "pretend_gpu.hpp"

using namespace ember;
using namespace ember::data;
using Catch::Matchers::Contains;

namespace {

Tensor<uint8_t> images(int64_t n, int64_t h, int64_t w, int64_t c) {
  std::vector<uint8_t> v(static_cast<size_t>(n * h * w * c));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>((i * 131 + i / 7) % 256);
  return c == 1 ? Tensor<uint8_t>::from_vector(v, {n, h, w}) : Tensor<uint8_t>::from_vector(v, {n, h, w, c});
}

DevicePreprocessOptions options(int64_t c, DType out = DType::Float32) {
  DevicePreprocessOptions o;
  o.out_h = 6;
  o.out_w = 5;
  o.random_crop = true;
  o.padding = 2;
  o.flip = true;
  o.flip_p = 0.5;
  o.mean = c == 3 ? std::vector<float>{0.4f, 0.5f, 0.6f} : std::vector<float>{0.3f};
  o.std = c == 3 ? std::vector<float>{0.2f, 0.25f, 0.3f} : std::vector<float>{0.35f};
  o.out_dtype = out;
  return o;
}

// The CPU transforms, sample by sample, stacked: the reference.
std::vector<float> reference(const Tensor<uint8_t>& x, const std::vector<int64_t>& indices, uint64_t seed,
                             uint64_t epoch, const DevicePreprocessOptions& o) {
  Compose tf({ToFloat{}, RandomCrop{o.out_h, o.out_w, o.padding}, RandomHorizontalFlip{o.flip_p}, Normalize{o.mean, o.std}});
  std::vector<float> all;
  for (int64_t i = 0; i < x.size(0); ++i) {
    SampleRandom rng(seed, epoch, indices[static_cast<size_t>(i)]);
    Example e = tf(Example{{"image", x.select(i)}}, rng);
    auto v = e.get<float>("image").to_vector();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

}  // namespace

TEST_CASE("preprocess_images: the CPU twin equals the CPU transforms bit for bit (gray and RGB)", "[data][preprocess]") {
  for (int64_t c : {1, 3}) {
    auto x = images(9, 7, 8, c);
    std::vector<int64_t> idx = {4, 0, 17, 3, 99, 5, 6, 7, 1000};
    auto o = options(c);
    AnyTensor y = preprocess_images(x, idx, 21, 3, o);
    CHECK(y.shape() == Shape{9, c, 6, 5});
    CHECK(bits(Tensor<float>(y).to_vector()) == bits(reference(x, idx, 21, 3, o)));
    // float16 / bfloat16: the float32 result rounded.
    for (DType t : {DType::Float16, DType::BFloat16}) {
      AnyTensor yl = preprocess_images(x, idx, 21, 3, options(c, t));
      CHECK(yl.dtype() == t);
      CHECK(yl.to_double_vector() == y.to(t).to_double_vector());
    }
  }
  // Without crop and flip: a centred window, plain normalisation.
  auto x = images(2, 4, 4, 1);
  DevicePreprocessOptions plain;
  AnyTensor y = preprocess_images(x, {0, 1}, 0, 0, plain);
  auto xv = x.to_vector();
  auto yv = Tensor<float>(y).to_vector();
  for (size_t i = 0; i < xv.size(); ++i) CHECK(yv[i] == static_cast<float>(xv[i]) * (1.0f / 255.0f));
}

TEST_CASE("preprocess_images: through the pretend cuda:0, from a loader shipping uint8", "[data][preprocess][device]") {
  testing::PretendGpu gpu;
  if (!gpu.active) {
    std::cout << "SKIPPED: a real GPU is present; the pretend-device test runs only without one" << std::endl;
    return;
  }
  auto x = images(12, 7, 8, 3);
  std::vector<int64_t> labels(12);
  for (int64_t i = 0; i < 12; ++i) labels[static_cast<size_t>(i)] = i;
  TensorDataset ds({{"image", x}, {"label", Tensor<int64_t>::from_vector(labels)}});
  const auto o = options(3);
  DataLoader dev(ds, {.batch_size = 5, .shuffle = true, .seed = 8, .num_workers = 2, .device = Device::cuda(0)});
  DataLoader host(ds, {.batch_size = 5, .shuffle = true, .seed = 8,
                       .transform = Compose({ToFloat{}, RandomCrop{6, 5, 2}, RandomHorizontalFlip{0.5},
                                             Normalize{o.mean, o.std}})});
  for (int e = 0; e < 2; ++e) {
    auto h = host.begin();
    for (Batch& b : dev) {
      REQUIRE(h != host.end());
      CHECK(b["image"].device() == Device::cuda(0));
      CHECK(b["image"].dtype() == DType::UInt8);
      AnyTensor y = preprocess_batch(b, "image", 8, o);
      CHECK(y.device() == Device::cuda(0));
      CHECK(bits(Tensor<float>(y.to(Device::cpu())).to_vector()) == bits(h->get<float>("image").to_vector()));
      ++h;
    }
  }
}

TEST_CASE("preprocess_images: bad inputs name the rule", "[data][preprocess]") {
  auto x = images(2, 4, 4, 1);
  CHECK_THROWS_AS(preprocess_images(Tensor<float>::zeros({2, 4, 4}), {0, 1}, 0, 0, {}), DTypeError);
  CHECK_THROWS_AS(preprocess_images(x, {0}, 0, 0, {}), ValueError);
  CHECK_THAT([&] {
    try {
      preprocess_images(x, {0, 1}, 0, 0, {.out_h = 9, .out_w = 9});
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string();
  }(), Contains("9x9 window with padding 0 does not fit 4x4 images"));
  CHECK_THROWS_AS(preprocess_images(x, {0, 1}, 0, 0, {.mean = {0, 0}, .std = {1, 1}}), ValueError);
  CHECK_THROWS_AS(preprocess_images(x, {0, 1}, 0, 0, {.std = {0}}), ValueError);
  CHECK_THROWS_AS(preprocess_images(x, {0, 1}, 0, 0, {.out_dtype = DType::Int32}), DTypeError);
  CHECK_THROWS_AS(preprocess_images(images(1, 2, 2, 5), {0}, 0, 0, {}), ShapeError);
}

TEST_CASE("preprocess_images: the CUDA kernel equals the CPU twin (float32 bitwise, float16, bfloat16)",
          "[data][preprocess][gpu]") {
  EMBER_REQUIRE_GPU();
  for (int64_t c : {1, 3}) {
    auto x = images(33, 29, 31, c);
    std::vector<int64_t> idx(33);
    for (int64_t i = 0; i < 33; ++i) idx[static_cast<size_t>(i)] = 7 * i + 1;
    for (DType t : {DType::Float32, DType::Float16, DType::BFloat16}) {
      auto o = options(c, t);
      o.out_h = 24;
      o.out_w = 28;
      o.padding = 4;
      AnyTensor cpu = preprocess_images(x, idx, 5, 2, o);
      AnyTensor gpu = preprocess_images(x.to(Device::cuda(0)), idx, 5, 2, o);
      CHECK(gpu.device() == Device::cuda(0));
      AnyTensor back = gpu.to(Device::cpu());
      REQUIRE(back.nbytes() == cpu.nbytes());
      CHECK(std::memcmp(back.data_ptr(), cpu.data_ptr(), cpu.nbytes()) == 0);
    }
  }
}

TEST_CASE("DataLoader on a real GPU: pinned staging and copy-stream uploads deliver the host's bytes",
          "[data][loader][gpu]") {
  EMBER_REQUIRE_GPU();
  auto x = images(40, 7, 8, 3);
  std::vector<int64_t> labels(40);
  for (int64_t i = 0; i < 40; ++i) labels[static_cast<size_t>(i)] = i;
  TensorDataset ds({{"image", x}, {"label", Tensor<int64_t>::from_vector(labels)}});
  const Transform tf = Compose({ToFloat{}, RandomCrop{6, 5, 2}, RandomHorizontalFlip{0.5}});
  DataLoader host(ds, {.batch_size = 6, .shuffle = true, .seed = 4, .transform = tf});
  DataLoader dev(ds, {.batch_size = 6, .shuffle = true, .seed = 4, .num_workers = 2, .prefetch = 2,
                      .device = Device::cuda(0), .transform = tf});
  for (int e = 0; e < 3; ++e) {
    auto h = host.begin();
    for (Batch& b : dev) {
      REQUIRE(h != host.end());
      // A kernel queued right after next() must see the upload (the event orders it): compute on
      // the device, then compare on the host.
      AnyTensor doubled = ember::op::add(b["image"], b["image"]);
      CHECK(Tensor<float>(doubled.to(Device::cpu())).to_vector() ==
            Tensor<float>(ember::op::add(h->data["image"], h->data["image"])).to_vector());
      CHECK(Tensor<int64_t>(b["label"].to(Device::cpu())).to_vector() == h->get<int64_t>("label").to_vector());
      ++h;
    }
  }
}
