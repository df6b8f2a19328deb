// Size arithmetic at its limits: each absurd shape, size or byte count is a
// ShapeError or an OutOfMemory naming the op, never a wrapped count, a heap overflow or a hang.
// No test allocates anything large: every check fires before memory is touched.
#include <catch2/catch.hpp>

#include "ember/backend/cpu/gemm_choice.hpp"

#include <climits>
#include <cstdint>
#include <limits>

#include <ember/ember.hpp>

using namespace ember;
using Catch::Contains;

namespace {
constexpr int64_t k2p32 = int64_t{1} << 32;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
}  // namespace

TEST_CASE("overflow: the checked-arithmetic helpers", "[overflow]") {
  CHECK(checked::add(2, 3, "op") == 5);
  CHECK(checked::mul(int64_t{1} << 31, int64_t{1} << 31, "op") == int64_t{1} << 62);
  CHECK_THROWS_AS(checked::add(kMax, 1, "split", "the sum of the sizes"), ShapeError);
  CHECK_THROWS_WITH(checked::add(kMax, 1, "split", "the sum of the sizes"),
                    Contains("split") && Contains("the sum of the sizes overflows int64"));
  CHECK_THROWS_WITH(checked::mul(k2p32, k2p32, "conv2d", "padding"), Contains("conv2d: padding overflows"));
  const int64_t dims[3] = {k2p32, k2p32, 0};
  CHECK(checked::product_or_overflow(dims, 3) == 0);  // a zero dimension: 0 elements, whatever the rest
  CHECK(checked::product_or_overflow(dims, 2) == -1);
  CHECK(checked::nbytes(10, 4, "op") == 40);
  CHECK_THROWS_AS(checked::nbytes(int64_t{1} << 62, 4, "zeros"), OutOfMemory);
  CHECK_THROWS_WITH(checked::nbytes(int64_t{1} << 62, 4, "zeros"), Contains("zeros") && Contains("4611686018427387904"));
  CHECK_THROWS_AS(checked::nbytes((int64_t{1} << 61) + 1, 8, "empty"), OutOfMemory);
  CHECK(checked::to_int(INT_MAX, "op", "m") == INT_MAX);
  CHECK_THROWS_AS(checked::to_int(int64_t{INT_MAX} + 1, "matmul", "k"), ShapeError);
  CHECK_THROWS_WITH(checked::to_int(int64_t{INT_MAX} + 1, "matmul", "k"),
                    Contains("matmul: k = 2147483648") && Contains("32-bit int"));
}

TEST_CASE("overflow: shapes whose element count overflows int64 raise, naming the op", "[overflow]") {
  const Shape huge{k2p32, k2p32};
  CHECK_THROWS_AS(huge.numel(), ShapeError);
  CHECK_THROWS_WITH(huge.checked_numel("zeros"), Contains("zeros") && Contains("[4294967296, 4294967296]"));
  CHECK(Shape({k2p32, k2p32, 0}).numel() == 0);
  CHECK_THROWS_WITH(Tensor<float>::zeros(huge), Contains("zeros") && Contains("[4294967296, 4294967296]"));
  CHECK_THROWS_AS(Tensor<float>::zeros(huge), ShapeError);
  CHECK_THROWS_WITH(Tensor<float>::ones(huge), Contains("ones"));
  CHECK_THROWS_WITH(Tensor<float>::empty(huge), Contains("empty"));
  CHECK_THROWS_WITH(Tensor<float>::full(huge, 2.0), Contains("full"));
  CHECK_THROWS_WITH(Tensor<float>::rand(huge), Contains("rand"));
  CHECK_THROWS_WITH(Tensor<float>::randn(huge), Contains("randn"));
  CHECK_THROWS_WITH(Tensor<float>::from_vector({1.0f}, huge), Contains("from_vector") && Contains("4294967296"));
  // A 0-element tensor once "reshaped" to [2^32, 2^32] (numel wrapped to 0).
  auto empty = Tensor<float>::zeros({0});
  CHECK_THROWS_AS(empty.reshape(huge), ShapeError);
  CHECK_THROWS_WITH(empty.reshape(huge), Contains("reshape"));
  auto one = Tensor<float>::ones({1, 1});
  CHECK_THROWS_AS(expand(one, huge), ShapeError);
  CHECK_THROWS_WITH(expand(one, huge), Contains("expand"));
  // Broadcasting [2^32, 1] with [1, 2^32] (through reshape of 0-element inputs? no: through the
  // shapes alone, which broadcast_shapes checks before anything is allocated).
  CHECK_THROWS_WITH(op::detail::broadcast_shapes("add", Shape{k2p32, 1}, Shape{1, k2p32}), Contains("add"));
}

TEST_CASE("overflow: byte counts beyond 2^63 are OutOfMemory before any allocation", "[overflow]") {
  // 2^62 floats: the byte count wrapped to 0 and the fill wrote through a null pointer.
  CHECK_THROWS_AS(Tensor<float>::zeros({int64_t{1} << 62}), OutOfMemory);
  CHECK_THROWS_WITH(Tensor<float>::zeros({int64_t{1} << 62}), Contains("zeros"));
  CHECK_THROWS_WITH(Tensor<float>::full({int64_t{1} << 31, int64_t{1} << 31}, 1.0), Contains("full"));
  // 2^61 + 1 doubles: an 8-byte buffer that bypassed the memory limit.
  CHECK_THROWS_AS(Tensor<double>::empty({(int64_t{1} << 61) + 1}), OutOfMemory);
  const int64_t before = backend_for(Device::cpu()).memory_stats().current_bytes;
  set_memory_limit(Device::cpu(), int64_t{1} << 40);
  CHECK_THROWS_AS(Tensor<double>::empty({(int64_t{1} << 61) + 1}), OutOfMemory);
  set_memory_limit(Device::cpu(), -1);
  CHECK(backend_for(Device::cpu()).memory_stats().current_bytes == before);
  // The allocator itself refuses counts that turn negative as int64.
  CHECK_THROWS_AS(backend_for(Device::cpu()).allocate(std::numeric_limits<size_t>::max() - 10), OutOfMemory);
  CHECK(backend_for(Device::cpu()).memory_stats().current_bytes == before);
}

TEST_CASE("overflow: arange with infinite or absurd ranges raises", "[overflow]") {
  const double inf = std::numeric_limits<double>::infinity();
  CHECK_THROWS_AS(Tensor<float>::arange(0, inf), ValueError);
  CHECK_THROWS_WITH(Tensor<float>::arange(0, inf), Contains("arange") && Contains("finite"));
  CHECK_THROWS_AS(Tensor<float>::arange(0, std::nan(""), 1.0), ValueError);
  CHECK_THROWS_AS(Tensor<float>::arange(0, 1e30), ShapeError);
  CHECK_THROWS_WITH(Tensor<float>::arange(0, 1e30), Contains("arange") && Contains("int64"));
  CHECK_THROWS_AS(Tensor<float>::arange(0, 1e18), OutOfMemory);  // 4e18 bytes: fits int64, not memory
  CHECK(Tensor<int64_t>::arange(0, 5, 2).to_vector() == std::vector<int64_t>{0, 2, 4});
}

TEST_CASE("overflow: split sizes that overflow and chunk counts near INT64_MAX", "[overflow]") {
  auto x = Tensor<float>::from_vector({1, 2, 3, 4, 5}, Shape{5});
  // {INT64_MAX, INT64_MAX, 5} summed to 3 + 5 ... and corrupted the heap.
  CHECK_THROWS_AS(split(x, {kMax, kMax, 7}), ShapeError);
  CHECK_THROWS_WITH(split(x, {kMax, kMax, 7}), Contains("split") && Contains("overflows"));
  CHECK_THROWS_AS(split(x, {kMax, 2, -kMax + 3}), ShapeError);  // negative size
  // chunk(x, INT64_MAX) looped forever while memory grew: now one element per chunk.
  auto parts = chunk(x, kMax);
  REQUIRE(parts.size() == 5);
  for (int i = 0; i < 5; ++i) CHECK(parts[static_cast<size_t>(i)].item() == static_cast<float>(i + 1));
  auto three = chunk(x, 3);  // torch.chunk(arange(5), 3): sizes 2, 2, 1
  REQUIRE(three.size() == 3);
  CHECK(three[2].shape() == Shape{1});
  CHECK(chunk(Tensor<float>::zeros({0}), kMax).size() == 1);
}

TEST_CASE("overflow: matmul with zero inner and outer dimensions", "[overflow]") {
  // [2, 3, 0] x [0, 4] divided by zero folding the leading dimensions.
  auto a = Tensor<float>::zeros({2, 3, 0});
  auto b = Tensor<float>::zeros({0, 4});
  auto c = matmul(a, b);
  CHECK(c.shape() == Shape{2, 3, 4});
  CHECK(c.to_vector() == std::vector<float>(24, 0.0f));
  CHECK(matmul(Tensor<float>::zeros({0, 3, 2}), Tensor<float>::ones({2, 4})).shape() == Shape{0, 3, 4});
  auto ar = Tensor<double>::zeros({2, 0, 3}).set_requires_grad(true);
  auto br = Tensor<double>::ones({3, 4}).set_requires_grad(true);
  sum(matmul(ar, br)).backward();
  CHECK(br.grad().to_vector() == std::vector<double>(12, 0.0));
}

TEST_CASE("overflow: conv2d with padding near 2^30 and 2^62", "[overflow]") {
  auto x = Tensor<float>::ones({1, 1, 2, 2});
  auto w = Tensor<float>::ones({1, 1, 1, 1});
  op::Conv2dOptions o;
  o.padding = {int64_t{1} << 62, int64_t{1} << 62};
  CHECK_THROWS_AS(conv2d(x, w, Tensor<float>(), o), ShapeError);
  CHECK_THROWS_WITH(conv2d(x, w, Tensor<float>(), o), Contains("conv2d") && Contains("padding"));
  // 2^30 padding: an output of 2^31 x 2^31 floats, 2^64 bytes (was std::length_error).
  o.padding = {int64_t{1} << 30, int64_t{1} << 30};
  CHECK_THROWS_AS(conv2d(x, w, Tensor<float>(), o), OutOfMemory);
  CHECK_THROWS_WITH(conv2d(x, w, Tensor<float>(), o), Contains("conv2d"));
  o.padding = {0, 0};
  o.dilation = {int64_t{1} << 62, 1};
  CHECK_THROWS_AS(conv2d(x, Tensor<float>::ones({1, 1, 3, 1}), Tensor<float>(), o), ShapeError);
  // Pooling padding whose double used to wrap past the half-kernel check.
  op::Pool2dOptions p;
  p.kernel = {2, 2};
  p.padding = {int64_t{1} << 62, 0};
  CHECK_THROWS_AS(max_pool2d(x, p), ValueError);
  p.padding = {0, 0};
  p.kernel = {1, 1};
  p.stride = {kMax, kMax};
  p.ceil_mode = true;  // 4 - 1 + (stride - 1) overflows in the ceil-mode output size
  CHECK_THROWS_AS(max_pool2d(Tensor<float>::ones({1, 1, 4, 4}), p), ShapeError);
  CHECK_THROWS_WITH(max_pool2d(Tensor<float>::ones({1, 1, 4, 4}), p), Contains("pool2d"));
}

TEST_CASE("overflow: BLAS dimensions beyond int raise before the call", "[overflow]") {
  // matmul with an inner dimension of 2^31 returned garbage (dimensions cast to int). The BLAS
  // path checks every dimension first, so nothing is read: the pointers can be dangling.
#if defined(EMBER_HAVE_CBLAS)
  // fp32 on oneDNN's sgemm takes 64-bit dimensions (nothing to raise): only the BLAS's types here.
  std::vector<DType> dtypes{DType::Float64};
  if (!cpu::sgemm_uses_onednn(false, get_num_threads())) dtypes.push_back(DType::Float32);
  for (DType dt : dtypes) {
    GemmArgs g;
    g.dtype = dt;
    g.m = 2;
    g.n = 2;
    g.k = int64_t{1} << 31;
    g.lda = g.k;
    g.ldb = 2;
    g.ldc = 2;
    g.batch = 1;
    static double dummy[4];
    g.a = dummy;
    g.b = dummy;
    g.c = dummy;
    CHECK_THROWS_AS(backend_for(Device::cpu()).gemm(g), ShapeError);
    CHECK_THROWS_WITH(backend_for(Device::cpu()).gemm(g), Contains("matmul (BLAS") && Contains("k = 2147483648"));
    g.k = 2;
    g.lda = 2;
    g.m = int64_t{1} << 32;
    CHECK_THROWS_WITH(backend_for(Device::cpu()).gemm(g), Contains("m = 4294967296"));
  }
#else
  std::cout << "SKIPPED: no BLAS in this build (the plain loop takes 64-bit sizes)\n";
#endif
}
