// Shape ops (ops/shape.hpp) and the view / copy methods of the tensor handles (core/tensor.hpp):
// forward values against plain-loop references, the cast's gradient, and the empty and 0-d
// tensors PyTorch accepts. Each op's gradient check, CPU/CUDA parity and bad inputs come from the
// registry (tests/op_cases.hpp).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <ember/ember.hpp>

#include "test_util.hpp"

using namespace ember;
using namespace ember::testing;

namespace {

std::vector<double> iota_vals(int64_t n, double start = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + static_cast<double>(i);
  return v;
}

// Reference permute by loops: out[i_0..i_n] = x[j] with j's coordinate perm[d] = i_d.
std::vector<double> ref_permute(const std::vector<double>& x, const Shape& s, const std::vector<int>& perm) {
  const int n = s.dim();
  std::vector<int> p(perm);
  for (int& d : p) d = d < 0 ? d + n : d;
  std::vector<int64_t> os(static_cast<size_t>(n));
  for (int d = 0; d < n; ++d) os[static_cast<size_t>(d)] = s[p[static_cast<size_t>(d)]];
  auto xs = s.strides();
  std::vector<double> out(x.size());
  std::vector<int64_t> idx(static_cast<size_t>(n), 0);
  for (size_t o = 0; o < out.size(); ++o) {
    int64_t rem = static_cast<int64_t>(o), src = 0;
    for (int d = n - 1; d >= 0; --d) {
      idx[static_cast<size_t>(d)] = rem % os[static_cast<size_t>(d)];
      rem /= os[static_cast<size_t>(d)];
    }
    for (int d = 0; d < n; ++d) src += idx[static_cast<size_t>(d)] * xs[static_cast<size_t>(p[static_cast<size_t>(d)])];
    out[o] = x[static_cast<size_t>(src)];
  }
  return out;
}

// Pieces of x along dimension d with the given sizes, by loops.
std::vector<std::vector<double>> ref_split(const std::vector<double>& x, const Shape& s, int d,
                                           const std::vector<int64_t>& sizes) {
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= s[i];
  for (int i = d + 1; i < s.dim(); ++i) inner *= s[i];
  std::vector<std::vector<double>> out;
  int64_t at = 0;
  for (int64_t n : sizes) {
    std::vector<double> piece;
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = at; j < at + n; ++j)
        for (int64_t i = 0; i < inner; ++i) piece.push_back(x[static_cast<size_t>((o * s[d] + j) * inner + i)]);
    out.push_back(piece);
    at += n;
  }
  return out;
}

}  // namespace

// ================================================================ the cast's gradient

TEST_CASE("to(dtype) float64->float32->float64 round trip passes the gradient through", "[shape][tensor][grad]") {
  // Finite differences through a float32 rounding are meaningless, so the cast backward is checked
  // directly: d/dx sum(w * float(x)) = w, returned in x's dtype.
  AnyTensor x = dt({0.5, -1.25, 3}, {3});
  x.set_requires_grad();
  AnyTensor w = dt({2, -3, 0.25}, {3}).to(DType::Float32);
  AnyTensor y = x.to(DType::Float32);
  CHECK(y.dtype() == DType::Float32);
  op::sum(op::mul(y, w)).backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().dtype() == DType::Float64);
  check_close(vals(x.grad()), {2, -3, 0.25});
  // Round trip back to double and a second backward accumulate.
  op::sum(op::mul(x.to(DType::Float32).to(DType::Float16).to(DType::Float64), dt({1, 1, 1}, {3}))).backward();
  check_close(vals(x.grad()), {3, -2, 1.25});
  // Casting to an integer type is not differentiable: nothing is recorded.
  AnyTensor xi = x.to(DType::Int32);
  CHECK_FALSE(xi.requires_grad());
}

// ================================================================ forward values

TEST_CASE("permute and transpose float32 forward vs loop reference", "[shape][forward]") {
  const Shape s{2, 3, 4};
  AnyTensor x = dt(iota_vals(24), s).to(DType::Float32);
  for (const auto& perm : std::vector<std::vector<int>>{{2, 0, 1}, {1, 0, 2}, {0, 2, 1}, {2, 1, 0}, {0, 1, 2}, {-2, -1, 0}}) {
    INFO("perm " << list_str(perm));
    AnyTensor y = op::permute(x, perm);
    CHECK(y.dtype() == DType::Float32);
    std::vector<int64_t> os;
    for (int d : perm) os.push_back(s[d < 0 ? d + 3 : d]);
    CHECK(y.shape() == Shape(os));
    check_close(vals(y), ref_permute(iota_vals(24), s, perm));
  }
  AnyTensor m = dt({1, 2, 3, 4, 5, 6}, {2, 3});
  AnyTensor mt = op::transpose(m);
  CHECK(mt.shape() == Shape{3, 2});
  check_close(vals(mt), {1, 4, 2, 5, 3, 6});
  check_close(vals(op::transpose(x, 0, 2)), ref_permute(iota_vals(24), s, {2, 1, 0}));
  // Integer tensors permute too.
  check_close(vals(op::transpose(m.to(DType::Int64))), {1, 4, 2, 5, 3, 6});
  CHECK_THROWS_AS(op::permute(x, {0, 0, 1}), ShapeError);
  CHECK_THROWS_AS(op::permute(x, {0, 1}), ShapeError);
  CHECK_THROWS_AS(op::transpose(dt({1}, {1})), ShapeError);
}

TEST_CASE("expand float64 forward values and errors", "[shape][forward]") {
  AnyTensor x = dt({1, 2, 3}, {3, 1});
  AnyTensor y = op::expand(x, {2, 3, 2});
  CHECK(y.shape() == Shape{2, 3, 2});
  check_close(vals(y), {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
  check_close(vals(op::expand(dt({7}, {}), {2, 2})), {7, 7, 7, 7});
  CHECK_THROWS_AS(op::expand(x, {3, 2, 1}), ShapeError);  // 3 vs 2: incompatible
  CHECK_THROWS_AS(op::expand(x, {4, 2}), ShapeError);
}

TEST_CASE("unsqueeze squeeze flatten float32 shapes and values", "[shape][forward]") {
  AnyTensor x = dt(iota_vals(24), {2, 3, 4}).to(DType::Float32);
  CHECK(op::unsqueeze(x, 0).shape() == Shape{1, 2, 3, 4});
  CHECK(op::unsqueeze(x, 3).shape() == Shape{2, 3, 4, 1});
  CHECK(op::unsqueeze(x, -1).shape() == Shape{2, 3, 4, 1});
  CHECK(op::unsqueeze(x, 1).shape() == Shape{2, 1, 3, 4});
  CHECK(op::squeeze(op::unsqueeze(x, 1), 1).shape() == Shape{2, 3, 4});
  CHECK(op::squeeze(x, 0).shape() == Shape{2, 3, 4});  // not of size 1: unchanged
  CHECK(op::flatten(x).shape() == Shape{24});
  CHECK(op::flatten(x, 1).shape() == Shape{2, 12});
  CHECK(op::flatten(x, 0, 1).shape() == Shape{6, 4});
  CHECK(op::flatten(dt({5}, {})).shape() == Shape{1});
  check_close(vals(op::flatten(x, 1)), iota_vals(24));
  check_close(vals(op::unsqueeze(x, 2)), iota_vals(24));
  CHECK(x.reshape({-1, 6}).shape() == Shape{4, 6});
  CHECK_THROWS_AS(x.reshape({5, 5}), ShapeError);
  CHECK_THROWS_AS(x.reshape({-1, -1}), ShapeError);
  CHECK_THROWS_AS(op::unsqueeze(x, 5), IndexError);
}

TEST_CASE("concat float32 and int64 forward vs loop reference along dims 0, 1, -1", "[shape][forward]") {
  for (DType t : {DType::Float32, DType::Int64}) {
    for (int dim : {0, 1, -1}) {
      INFO(dtype_name(t) << " dim " << dim);
      const int d = dim < 0 ? dim + 3 : dim;
      std::vector<Shape> shapes;
      for (int64_t n : {1, 3, 2}) {
        std::vector<int64_t> sv = {2, 3, 4};
        sv[static_cast<size_t>(d)] = n;
        shapes.push_back(Shape(sv));
      }
      std::vector<AnyTensor> xs;
      std::vector<std::vector<double>> xv;
      double start = 0;
      for (const Shape& sh : shapes) {
        xv.push_back(iota_vals(sh.numel(), start));
        xs.push_back(dt(xv.back(), sh).to(t));
        start += 100;
      }
      AnyTensor y = op::concat(xs, dim);
      std::vector<int64_t> os = {2, 3, 4};
      os[static_cast<size_t>(d)] = 6;
      REQUIRE(y.shape() == Shape(os));
      CHECK(y.dtype() == t);
      // Reference: walk the output, find which input and where.
      int64_t outer = 1, inner = 1;
      for (int i = 0; i < d; ++i) outer *= os[static_cast<size_t>(i)];
      for (int i = d + 1; i < 3; ++i) inner *= os[static_cast<size_t>(i)];
      std::vector<double> want;
      for (int64_t o = 0; o < outer; ++o)
        for (size_t k = 0; k < xs.size(); ++k) {
          const int64_t n = shapes[k][d];
          for (int64_t j = 0; j < n; ++j)
            for (int64_t i = 0; i < inner; ++i) want.push_back(xv[k][static_cast<size_t>((o * n + j) * inner + i)]);
        }
      check_close(vals(y), want);
      // split undoes concat.
      std::vector<AnyTensor> back = op::split(y, {1, 3, 2}, dim);
      REQUIRE(back.size() == 3);
      for (size_t k = 0; k < 3; ++k) {
        CHECK(back[k].shape() == shapes[k]);
        check_close(vals(back[k]), xv[k]);
      }
    }
  }
  CHECK_THROWS_AS(op::concat({AnyTensor::zeros({2, 3}, DType::Float32), AnyTensor::zeros({3, 2}, DType::Float32)}, 0),
                  ShapeError);
  CHECK_THROWS_AS(op::concat({AnyTensor::zeros({2}, DType::Float32), AnyTensor::zeros({2}, DType::Float64)}, 0),
                  DTypeError);
}

TEST_CASE("split and chunk float64 forward vs loop reference, chunk sizes like torch.chunk", "[shape][forward]") {
  const Shape s{4, 5, 3};
  std::vector<double> xv = iota_vals(60);
  AnyTensor x = dt(xv, s);
  for (int d : {0, 1, 2}) {
    const std::vector<int64_t> sizes = d == 0 ? std::vector<int64_t>{1, 0, 3} : (d == 1 ? std::vector<int64_t>{2, 2, 1}
                                                                                         : std::vector<int64_t>{1, 2});
    INFO("split dim " << d);
    std::vector<AnyTensor> parts = op::split(x, sizes, d);
    std::vector<std::vector<double>> want = ref_split(xv, s, d, sizes);
    REQUIRE(parts.size() == sizes.size());
    for (size_t k = 0; k < parts.size(); ++k) {
      Shape ps = s;
      ps[d] = sizes[k];
      CHECK(parts[k].shape() == ps);
      check_close(vals(parts[k]), want[k]);
    }
  }
  auto chunk_sizes = [](const AnyTensor& t, int64_t chunks, int dim) {
    std::vector<int64_t> out;
    for (const AnyTensor& c : op::chunk(t, chunks, dim)) out.push_back(c.shape()[dim < 0 ? dim + t.dim() : dim]);
    return out;
  };
  CHECK(chunk_sizes(x, 3, 1) == std::vector<int64_t>{2, 2, 1});
  CHECK(chunk_sizes(x, 2, 0) == std::vector<int64_t>{2, 2});
  CHECK(chunk_sizes(x, 4, 2) == std::vector<int64_t>{1, 1, 1});
  CHECK(chunk_sizes(dt(iota_vals(6), {6}), 4, 0) == std::vector<int64_t>{2, 2, 2});
  std::vector<AnyTensor> ch = op::chunk(x, 3, -2);
  std::vector<std::vector<double>> want = ref_split(xv, s, 1, {2, 2, 1});
  for (size_t k = 0; k < ch.size(); ++k) check_close(vals(ch[k]), want[k]);
  // Typed wrappers.
  std::vector<Tensor<double>> tp = ember::split(Tensor<double>(x), {3, 1}, 0);
  REQUIRE(tp.size() == 2);
  check_close(vals(tp[1]), ref_split(xv, s, 0, {3, 1})[1]);
  CHECK_THROWS_AS(op::split(x, {1, 1}, 0), ShapeError);
  CHECK_THROWS_AS(op::chunk(x, 0, 0), ValueError);
}

TEST_CASE("shape ops accept empty pieces and 0-d tensors where PyTorch takes them", "[shape][forward]") {
  using F = Tensor<float>;
  const F x = F::ones({2, 3});
  const F s0 = F::scalar(1);
  CHECK(squeeze(s0, 0).shape() == Shape{});
  CHECK(squeeze(s0, -1).shape() == Shape{});
  CHECK(unsqueeze(s0, 0).shape() == Shape{1});
  CHECK(unsqueeze(s0, -1).shape() == Shape{1});
  CHECK(flatten(s0).shape() == Shape{1});
  CHECK(F::zeros({0, 3}).reshape({-1}).shape() == Shape{0});
  CHECK(F::zeros({0, 3}).reshape({3, -1}).shape() == Shape{3, 0});
  CHECK(x.select(-2).to_vector() == std::vector<float>{1, 1, 1});
  CHECK(x.slice(1, 1).shape() == Shape{0, 3});
  auto parts = split(x, {0, 2, 0}, 0);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].shape() == Shape{0, 3});
  CHECK(parts[1].shape() == Shape{2, 3});
  CHECK(concat(std::vector<F>{F::zeros({0, 3}), x}).shape() == Shape{2, 3});
  CHECK(permute(F::zeros({0, 2, 3}), {2, 0, 1}).shape() == Shape{3, 0, 2});
  CHECK(expand(F::ones({1, 3}), Shape{0, 3}).shape() == Shape{0, 3});
  CHECK(permute(s0, {}).item() == 1.0f);
}

TEST_CASE("typed shape functions float32 keep Tensor<float>: permute, transpose, expand, unsqueeze, concat, chunk",
          "[shape][forward]") {
  Tensor<float> x = Tensor<float>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  check_close(vals(ember::transpose(x)), {1, 4, 2, 5, 3, 6});
  check_close(vals(ember::permute(x, {1, 0})), {1, 4, 2, 5, 3, 6});
  CHECK(ember::unsqueeze(x, 1).shape() == Shape{2, 1, 3});
  CHECK(ember::squeeze(ember::unsqueeze(x, 0), 0).shape() == Shape{2, 3});
  CHECK(ember::flatten(x).shape() == Shape{6});
  Tensor<float> e = ember::expand(Tensor<float>::from_vector({1, 2}, {2, 1}), Shape{2, 2});
  check_close(vals(e), {1, 1, 2, 2});
  Tensor<float> c = ember::concat(std::vector<Tensor<float>>{x, x}, 1);
  CHECK(c.shape() == Shape{2, 6});
  check_close(vals(c), {1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6});
  std::vector<Tensor<float>> parts = ember::chunk(c, 2, 1);
  REQUIRE(parts.size() == 2);
  check_close(vals(parts[0]), vals(x));
  check_close(vals(parts[1]), vals(x));
}

TEST_CASE("slice select float32 values are views, clone copies", "[shape][tensor][forward]") {
  Tensor<float> x = Tensor<float>::from_vector({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {4, 3});
  Tensor<float> s = x.slice(1, 3);
  CHECK(s.shape() == Shape{2, 3});
  check_close(vals(s), {3, 4, 5, 6, 7, 8});
  Tensor<float> r = x.select(3);
  CHECK(r.shape() == Shape{3});
  check_close(vals(r), {9, 10, 11});
  check_close(vals(x.select(-4)), {0, 1, 2});
  check_close(vals(x.slice(1, 3).select(1)), {6, 7, 8});
  CHECK(x.slice(2, 2).numel() == 0);
  // Views share storage with their base; clones do not.
  Tensor<float> c = x.clone();
  x.data()[4] = 40;
  CHECK(s.data()[1] == 40);
  CHECK(c.data()[4] == 4);
  c.data()[0] = -1;
  CHECK(x.data()[0] == 0);
  CHECK_THROWS_AS(x.slice(2, 5), IndexError);
  CHECK_THROWS_AS(x.slice(3, 2), IndexError);
  CHECK_THROWS_AS(x.select(4), IndexError);
}

TEST_CASE("to(dtype) round trips: float64->float32->float64, float32->float16/bfloat16->float32, int64->float32",
          "[shape][tensor][forward]") {
  std::vector<double> exact = {0, 1, -2.5, 0.375, 1024, -0.0078125};  // exact in every float format
  AnyTensor x = dt(exact, {2, 3});
  for (DType t : {DType::Float32, DType::Float16, DType::BFloat16}) {
    INFO(dtype_name(t));
    AnyTensor y = x.to(t);
    CHECK(y.dtype() == t);
    CHECK(y.shape() == Shape{2, 3});
    AnyTensor back = y.to(DType::Float64);
    check_close(vals(back), exact);
  }
  // Rounding, not truncation: 1 + 2^-11 + 2^-12 rounds up in fp16; 1 + 2^-8 + 2^-9 in bf16.
  CHECK(dt({1 + 0x1p-11 + 0x1p-12}, {1}).to(DType::Float16).item_double() == 1 + 0x1p-10);
  CHECK(dt({1 + 0x1p-8 + 0x1p-9}, {1}).to(DType::BFloat16).item_double() == 1 + 0x1p-7);
  // Ties to even.
  CHECK(dt({1 + 0x1p-11}, {1}).to(DType::Float16).item_double() == 1.0);
  CHECK(dt({1 + 0x1p-10 + 0x1p-11}, {1}).to(DType::Float16).item_double() == 1 + 0x1p-9);
  // Integers.
  AnyTensor i = dt({3, -7, 100000}, {3}).to(DType::Int64);
  CHECK(i.dtype() == DType::Int64);
  check_close(vals(i.to(DType::Float32)), {3, -7, 100000});
  check_close(vals(dt({2.75, -2.75}, {2}).to(DType::Int32)), {2, -2});  // C++ conversion: toward zero
  Tensor<float> tf = Tensor<double>(x).to<float>();
  check_close(vals(tf), exact);
  CHECK(x.to(DType::Float64).same(x));
}
