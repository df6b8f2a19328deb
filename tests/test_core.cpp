// Core: dtypes, half/bfloat16 conversion, shapes, factories, Philox, views, conversions, memory.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <sstream>
#include <thread>
#include <atomic>
#include <vector>

#include <ember/ember.hpp>
#include <ember/backend/cpu/allocator.hpp>

using namespace ember;

TEST_CASE("dtype names, sizes and mapping", "[core]") {
  CHECK(std::string(dtype_name(DType::Float32)) == "float32");
  CHECK(std::string(dtype_name(DType::BFloat16)) == "bfloat16");
  CHECK(dtype_size(DType::Float64) == 8);
  CHECK(dtype_size(DType::Float16) == 2);
  CHECK(dtype_size(DType::UInt8) == 1);
  CHECK(dtype_of<half> == DType::Float16);
  CHECK(dtype_of<int64_t> == DType::Int64);
  CHECK(is_floating(DType::BFloat16));
  CHECK_FALSE(is_floating(DType::Int32));
}

TEST_CASE("half conversion: exact bit patterns and rounding", "[core][half]") {
  CHECK(half(1.0f).bits == 0x3C00);
  CHECK(half(-2.0f).bits == 0xC000);
  CHECK(half(65504.0f).bits == 0x7BFF);           // largest finite
  CHECK(half(65520.0f).bits == 0x7C00);           // rounds to inf
  CHECK(half(5.9604644775390625e-8f).bits == 0x0001);  // smallest subnormal 2^-24
  CHECK(half(6.103515625e-05f).bits == 0x0400);   // smallest normal 2^-14
  CHECK(half(1.0f + 1.0f / 2048).bits == 0x3C00); // tie between 1 and 1+2^-10: to even (1)
  CHECK(half(1.0f + 3.0f / 2048).bits == 0x3C02); // tie between 1+2^-10 and 1+2^-9: to even
  CHECK(std::isnan(static_cast<float>(half(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isinf(static_cast<float>(half::from_bits(0xFC00))));
  // Every half value round-trips through float exactly.
  int mismatches = 0;
  for (uint32_t b = 0; b < 0x10000; ++b) {
    half h = half::from_bits(static_cast<uint16_t>(b));
    float f = h;
    if (std::isnan(f)) continue;
    if (half(f).bits != h.bits) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("bfloat16 conversion: exact bit patterns and rounding", "[core][half]") {
  CHECK(bfloat16(1.0f).bits == 0x3F80);
  CHECK(bfloat16(-1.0f).bits == 0xBF80);
  CHECK(bfloat16(1.0f + 1.0f / 256).bits == 0x3F80);   // tie to even
  CHECK(bfloat16(1.0f + 3.0f / 256).bits == 0x3F82);   // tie to even (up)
  CHECK(static_cast<float>(bfloat16::from_bits(0x4049)) == 3.140625f);
  CHECK(std::isnan(static_cast<float>(bfloat16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("shape basics and limits", "[core][shape]") {
  Shape s{2, 3, 4};
  CHECK(s.dim() == 3);
  CHECK(s.numel() == 24);
  CHECK(s.str() == "[2, 3, 4]");
  CHECK(s.strides()[0] == 12);
  CHECK(s.strides()[2] == 1);
  CHECK(Shape{}.numel() == 1);
  CHECK(Shape{1, 2, 3, 4, 5, 6, 7, 8}.dim() == 8);
  CHECK_THROWS_AS((Shape{1, 2, 3, 4, 5, 6, 7, 8, 9}), ShapeError);
  CHECK_THROWS_WITH((Shape{2, -1}), Catch::Contains("negative dimension -1"));
}

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors", "[core][random]") {
  using detail::Philox4x32;
  Philox4x32 r = detail::philox4x32_10(Philox4x32{{0, 0, 0, 0}}, 0, 0);
  CHECK(r.v[0] == 0x6627e8d5u);
  CHECK(r.v[1] == 0xe169c58du);
  CHECK(r.v[2] == 0xbc57ac4cu);
  CHECK(r.v[3] == 0x9b00dbd8u);
  r = detail::philox4x32_10(Philox4x32{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
  CHECK(r.v[0] == 0x408f276du);
  CHECK(r.v[1] == 0x41c83b0eu);
  CHECK(r.v[2] == 0xa20bc7c6u);
  CHECK(r.v[3] == 0x6d5451fdu);
  r = detail::philox4x32_10(Philox4x32{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  CHECK(r.v[0] == 0xd16cfe09u);
  CHECK(r.v[1] == 0x94fdccebu);
  CHECK(r.v[2] == 0x5001e420u);
  CHECK(r.v[3] == 0x24126ea1u);
}

TEST_CASE("rand and randn: reproducible by (seed, offset), right distribution", "[core][random]") {
  Generator g1(42), g2(42);
  auto a = Tensor<float>::rand({1000}, Device::cpu(), -2.0, 3.0, g1).to_vector();
  auto b = Tensor<float>::rand({1000}, Device::cpu(), -2.0, 3.0, g2).to_vector();
  CHECK(a == b);
  auto c = Tensor<float>::rand({1000}, Device::cpu(), -2.0, 3.0, g1).to_vector();  // next offset
  CHECK(a != c);
  double mean = 0;
  for (float v : a) {
    CHECK(v >= -2.0f);
    CHECK(v < 3.0f);
    mean += v;
  }
  CHECK(mean / 1000 == Approx(0.5).margin(0.15));
  // Element i of a draw equals the scalar Philox function at (seed, offset, i).
  Generator g3(7);
  uint64_t off = g3.offset();
  auto u = Tensor<double>::rand({9}, Device::cpu(), 0.0, 1.0, g3).to_vector();
  for (int i = 0; i < 9; ++i) CHECK(u[static_cast<size_t>(i)] == static_cast<double>(detail::philox_uniform(7, off, i)));
  CHECK(g3.offset() == off + 3);  // 9 numbers use 3 blocks of 4

  Generator gn(3);
  auto n = Tensor<double>::randn({20000}, Device::cpu(), 1.0, 2.0, gn).to_vector();
  double m = 0, v2 = 0;
  for (double x : n) m += x;
  m /= static_cast<double>(n.size());
  for (double x : n) v2 += (x - m) * (x - m);
  double sd = std::sqrt(v2 / static_cast<double>(n.size()));
  CHECK(m == Approx(1.0).margin(0.05));
  CHECK(sd == Approx(2.0).margin(0.05));
  manual_seed(5);
  auto d1 = Tensor<float>::randn({4}).to_vector();
  manual_seed(5);
  auto d2 = Tensor<float>::randn({4}).to_vector();
  CHECK(d1 == d2);
}

TEST_CASE("factories: zeros, ones, full, arange, from_vector, scalar", "[core][factory]") {
  CHECK(Tensor<float>::zeros({2, 2}).to_vector() == std::vector<float>(4, 0.0f));
  CHECK(Tensor<int32_t>::ones({3}).to_vector() == std::vector<int32_t>{1, 1, 1});
  CHECK(Tensor<double>::full({2}, 2.5).to_vector() == std::vector<double>{2.5, 2.5});
  CHECK(Tensor<int64_t>::arange(5).to_vector() == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(Tensor<float>::arange(1.0, 2.0, 0.25).to_vector() == std::vector<float>{1.0f, 1.25f, 1.5f, 1.75f});
  CHECK(Tensor<float>::arange(3.0, 0.0, -1.0).to_vector() == std::vector<float>{3, 2, 1});
  auto t = Tensor<float>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(t.shape() == Shape{2, 3});
  CHECK(t.data()[4] == 5.0f);
  CHECK(Tensor<double>::scalar(3.5).item() == 3.5);
  CHECK(Tensor<half>::full({2}, 0.1).to_vector()[0].bits == half(0.1f).bits);
  CHECK_THROWS_AS(Tensor<float>::from_vector({1, 2, 3}, {2, 2}), ShapeError);
  CHECK_THROWS_AS(Tensor<float>::arange(0.0, 1.0, 0.0), ValueError);
}

TEST_CASE("views share storage, clone copies", "[core][view]") {
  auto t = Tensor<float>::arange(12);
  auto r = t.reshape({3, 4});
  auto s = r.slice(1, 3);
  CHECK(s.shape() == Shape{2, 4});
  CHECK(s.to_vector() == std::vector<float>{4, 5, 6, 7, 8, 9, 10, 11});
  CHECK(r.select(2).to_vector() == std::vector<float>{8, 9, 10, 11});
  CHECK(r.select(-1).shape() == Shape{4});
  CHECK(r.reshape({-1, 6}).shape() == Shape{2, 6});
  t.data()[5] = 100.0f;
  CHECK(s.to_vector()[1] == 100.0f);  // a view sees the change
  auto c = t.clone();
  t.data()[0] = -1.0f;
  CHECK(c.to_vector()[0] == 0.0f);  // a clone does not
  CHECK_THROWS_AS(t.reshape({5, 5}), ShapeError);
  CHECK_THROWS_AS(r.slice(2, 5), IndexError);
}

TEST_CASE("dtype conversions through to<U>()", "[core][convert]") {
  auto f = Tensor<float>::from_vector({1.5f, -2.25f, 1000.0f, 0.1f});
  auto h = f.to<half>();
  CHECK(h.dtype() == DType::Float16);
  auto back = h.to<float>().to_vector();
  CHECK(back[0] == 1.5f);
  CHECK(back[1] == -2.25f);
  CHECK(back[2] == 1000.0f);
  CHECK(back[3] == static_cast<float>(half(0.1f)));
  auto b = f.to<bfloat16>().to<double>().to_vector();
  CHECK(b[0] == 1.5);
  CHECK(b[3] == Approx(0.1).epsilon(1e-2));
  auto i = Tensor<float>::from_vector({1.9f, -1.9f, 3.0f}).to<int32_t>().to_vector();
  CHECK(i == std::vector<int32_t>{1, -1, 3});  // truncation toward zero, as C++ and PyTorch
  auto u = Tensor<int64_t>::from_vector({0, 255, 7}).to<uint8_t>().to_vector();
  CHECK(u == std::vector<uint8_t>{0, 255, 7});
  CHECK_THROWS_AS(Tensor<double>(AnyTensor(f)), DTypeError);
}

TEST_CASE("item, to_vector and printing", "[core][print]") {
  auto t = Tensor<float>::from_vector({1, 2, 3, 4}, {2, 2});
  std::ostringstream os;
  os << t;
  CHECK(os.str().find("[[1, 2],") != std::string::npos);
  CHECK(os.str().find("dtype=float32") != std::string::npos);
  CHECK(os.str().find("device=cpu") != std::string::npos);
  auto big = Tensor<float>::zeros({2000});
  std::ostringstream ob;
  ob << big;
  CHECK(ob.str().find("...") != std::string::npos);
  CHECK(ob.str().size() < 200);
  CHECK_THROWS_AS(t.item(), ShapeError);
  CHECK(t.select(1).select(0).item() == 3.0f);
}

TEST_CASE("memory statistics count bytes held and the peak", "[core][memory]") {
  Backend& cpu = cpu_backend();
  cpu.reset_peak_memory();
  MemoryStats before = memory_stats();
  {
    auto a = Tensor<float>::zeros({1000});
    MemoryStats during = memory_stats();
    CHECK(during.current_bytes - before.current_bytes == 4000);
    CHECK(during.peak_bytes >= before.current_bytes + 4000);
    CHECK(during.num_allocations == before.num_allocations + 1);
  }
  MemoryStats after = memory_stats();
  CHECK(after.current_bytes == before.current_bytes);
  CHECK(after.peak_bytes >= before.current_bytes + 4000);
  reset_peak_memory();
  CHECK(memory_stats().peak_bytes == after.current_bytes);
}

namespace {
// Sets the CPU cache limit for a scope and restores the default (the cache is off by default
// under AddressSanitizer; these tests turn it on explicitly).
struct HostCacheLimit {
  explicit HostCacheLimit(int64_t bytes) {
    empty_cache();
    set_cache_limit(Device::cpu(), bytes);
  }
  ~HostCacheLimit() {
    empty_cache();
    set_cache_limit(Device::cpu(), cpu::HostAllocator::kDefaultCacheLimit);
  }
};
}  // namespace

TEST_CASE("host cache: a freed large block is reused by the next allocation of its size class", "[core][memory]") {
  HostCacheLimit on(int64_t{1} << 30);
  const int64_t in_use = memory_stats().current_bytes;
  CHECK(memory_stats().cached_bytes == 0);
  const void* first = nullptr;
  {
    auto a = Tensor<float>::empty({1 << 18});  // 1 MiB
    first = a.data_ptr();
  }
  // freed into the cache: not in use, not counted against a limit
  CHECK(memory_stats().current_bytes == in_use);
  CHECK(memory_stats().cached_bytes == int64_t{1} << 20);
  {
    auto b = Tensor<float>::empty({(1 << 18) - 100});  // same size class (1 MiB rounded to 128 KiB steps)
    CHECK(b.data_ptr() == first);
    CHECK(memory_stats().cached_bytes == 0);
    CHECK(memory_stats().current_bytes == in_use + 4 * ((1 << 18) - 100));
    auto c = Tensor<float>::empty({1 << 18});  // the cache is empty: a new block
    CHECK(c.data_ptr() != first);
  }
  CHECK(memory_stats().cached_bytes == 2 * (int64_t{1} << 20));
  // a limit counts live bytes only: the cached ones do not make this fail
  set_memory_limit(Device::cpu(), in_use + (int64_t{1} << 20) + 100);
  CHECK_NOTHROW(Tensor<float>::empty({1 << 18}));
  set_memory_limit(Device::cpu(), -1);
  empty_cache();
  CHECK(memory_stats().cached_bytes == 0);
  CHECK(memory_stats().current_bytes == in_use);
  // small blocks stay with malloc
  { auto s = Tensor<float>::empty({1000}); }
  CHECK(memory_stats().cached_bytes == 0);
}

TEST_CASE("host cache: the limit bounds what is kept, 0 keeps nothing", "[core][memory]") {
  {
    HostCacheLimit off(0);
    { auto a = Tensor<float>::empty({1 << 18}); }
    CHECK(memory_stats().cached_bytes == 0);
  }
  {
    HostCacheLimit small(int64_t{3} << 20);  // room for three 1 MiB blocks
    {
      std::vector<Tensor<float>> ts;
      for (int i = 0; i < 5; ++i) ts.push_back(Tensor<float>::empty({1 << 18}));
    }
    CHECK(memory_stats().cached_bytes == int64_t{3} << 20);
    set_cache_limit(Device::cpu(), int64_t{1} << 20);  // below the content: emptied
    CHECK(memory_stats().cached_bytes == 0);
  }
}

TEST_CASE("host cache: size classes waste at most an eighth, small blocks round to 64 bytes", "[core][memory]") {
  using A = cpu::HostAllocator;
  CHECK(A::block_size(1) == 64);
  CHECK(A::block_size(64) == 64);
  CHECK(A::block_size(65) == 128);
  CHECK(A::block_size(A::kCacheMinBytes - 1) == A::kCacheMinBytes);
  CHECK(A::block_size(A::kCacheMinBytes) == A::kCacheMinBytes);
  CHECK(A::block_size(A::kCacheMinBytes + 1) == A::kCacheMinBytes + A::kCacheMinBytes / 8);
  CHECK(A::block_size(size_t{1} << 20) == size_t{1} << 20);
  for (size_t n = A::kCacheMinBytes; n < (size_t{1} << 34); n = n * 13 / 7 + 12345) {
    const size_t b = A::block_size(n);
    CHECK(b >= n);
    CHECK(b - n <= n / 8);
    CHECK(b % 64 == 0);
  }
}

TEST_CASE("host cache: threads allocating and freeing the same sizes keep the figures exact", "[core][memory]") {
  HostCacheLimit on(int64_t{64} << 20);
  const int64_t in_use = memory_stats().current_bytes;
  std::vector<std::thread> pool;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t)
    pool.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        auto a = Tensor<float>::full({(1 << 15) + 1024 * (i % 3)}, static_cast<float>(t));
        auto b = Tensor<float>::empty({1 << 16});
        if (a.to_vector()[100] != static_cast<float>(t)) bad++;  // no block handed to two tensors
      }
    });
  for (auto& th : pool) th.join();
  CHECK(bad == 0);
  CHECK(memory_stats().current_bytes == in_use);
  CHECK(memory_stats().cached_bytes > 0);
  CHECK(memory_stats().cached_bytes <= int64_t{64} << 20);
}

TEST_CASE("a memory limit turns big allocations into OutOfMemory with the figures", "[core][memory]") {
  const int64_t in_use = memory_stats().current_bytes;
  set_memory_limit(Device::cpu(), in_use + 1000);
  try {
    auto ok = Tensor<float>::zeros({100});  // 400 bytes fit
    CHECK(ok.numel() == 100);
    REQUIRE_THROWS_AS(Tensor<float>::zeros({1000}), OutOfMemory);
    try {
      auto fail = Tensor<float>::zeros({1000});
    } catch (const OutOfMemory& e) {
      CHECK(e.requested_bytes == 4000);
      CHECK(e.limit_bytes == in_use + 1000);
      CHECK(std::string(e.what()).find("4000 bytes") != std::string::npos);
    }
  } catch (...) {
    set_memory_limit(Device::cpu(), -1);
    throw;
  }
  set_memory_limit(Device::cpu(), -1);
  CHECK(memory_stats().current_bytes == in_use);
  auto big = Tensor<float>::zeros({100000});
  CHECK(big.numel() == 100000);
}

TEST_CASE("devices: cpu always exists, CUDA state is reported honestly", "[core][device]") {
  CHECK(Device::cpu().str() == "cpu");
  CHECK(Device::cuda(1).str() == "cuda:1");
  CHECK(Device::cuda(0) != Device::cpu());
  if (!cuda::is_available()) {
    CHECK(cuda::device_count() == 0);
    CHECK_THROWS_AS(Tensor<float>::zeros({2}, Device::cuda(0)), DeviceError);
  } else {
    auto t = Tensor<float>::arange(4).to(Device::cuda(0));
    CHECK(t.device() == Device::cuda(0));
    CHECK(t.to(Device::cpu()).to_vector() == std::vector<float>{0, 1, 2, 3});
  }
}

TEST_CASE("gaps: a std::vector<int64_t> serves as a Shape", "[gaps][core]") {
  const std::vector<int64_t> dims{2, 3};
  auto t = Tensor<float>::from_vector({1, 2, 3, 4, 5, 6}, dims);
  CHECK(t.shape() == Shape{2, 3});
  CHECK(Tensor<double>::zeros(dims).numel() == 6);
  CHECK(t.reshape(std::vector<int64_t>{3, 2}).shape() == Shape{3, 2});
  Shape s = dims;
  CHECK(s.vec() == dims);
  CHECK_THROWS_AS(Tensor<float>::from_vector({1, 2}, dims), ShapeError);
  CHECK_THROWS_AS(Shape(std::vector<int64_t>{2, -1}), ShapeError);
}

TEST_CASE("Storage::release_memory gives the bytes back, tensors on it raise until reallocate()", "[core][memory]") {
  AnyTensor t = AnyTensor::full(Shape{1000}, 2.0, DType::Float32);
  AnyTensor view = t.slice(10, 20);
  const int64_t before = memory_stats().current_bytes;
  std::shared_ptr<Storage> st = t.impl()->storage;
  CHECK(st->allocated());
  st->release_memory();
  CHECK_FALSE(st->allocated());
  CHECK(memory_stats().current_bytes == before - 4000);
  CHECK_THROWS_WITH(view.to_double_vector(), Catch::Contains("a tensor's memory is released"));
  CHECK_THROWS_AS(t.data_ptr(), ValueError);
  st->release_memory();  // twice: nothing
  st->reallocate();
  CHECK(memory_stats().current_bytes == before);
  view.copy_(AnyTensor::full(Shape{10}, 5.0, DType::Float32));
  CHECK(view.to_double_vector() == std::vector<double>(10, 5.0));
  AnyTensor empty = AnyTensor::zeros(Shape{0}, DType::Float32);
  empty.impl()->storage->release_memory();
  CHECK(empty.data_ptr() == nullptr);  // nothing to release: no error
}
