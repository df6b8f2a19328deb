// Indexing ops (ops/index.hpp): index_select, embedding, gather. Finite-difference gradient checks
// in double with repeated indices (so the accumulating backward is exercised), forward values
// against plain loops, index validation.
#include <catch2/catch.hpp>

#include <limits>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.hpp"

using namespace ember;
using ember::testing::gradcheck;
using ember::testing::random_inputs;
using namespace ember::testing;

namespace {

AnyTensor idx64(const std::vector<int64_t>& v, const Shape& s) { return Tensor<int64_t>::from_vector(v, s); }
AnyTensor idx32(const std::vector<int32_t>& v, const Shape& s) { return Tensor<int32_t>::from_vector(v, s); }


std::vector<double> iota_vals(int64_t n, double start = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + static_cast<double>(i);
  return v;
}

// index_select by loops: out has x's shape with dimension d replaced by idx.size().
std::vector<double> ref_index_select(const std::vector<double>& x, const Shape& s, int d, const std::vector<int64_t>& idx) {
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= s[i];
  for (int i = d + 1; i < s.dim(); ++i) inner *= s[i];
  std::vector<double> out;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j : idx)
      for (int64_t i = 0; i < inner; ++i) out.push_back(x[static_cast<size_t>((o * s[d] + j) * inner + i)]);
  return out;
}

// gather by loops over the index's coordinates: out[c] = x[c with c_d replaced by idx[c]].
std::vector<double> ref_gather(const std::vector<double>& x, const Shape& xs, int d, const std::vector<int64_t>& idx,
                               const Shape& is) {
  auto xst = xs.strides();
  std::vector<double> out(idx.size());
  std::vector<int64_t> c(static_cast<size_t>(is.dim()));
  for (size_t k = 0; k < idx.size(); ++k) {
    int64_t rem = static_cast<int64_t>(k);
    for (int i = is.dim() - 1; i >= 0; --i) {
      c[static_cast<size_t>(i)] = rem % is[i];
      rem /= is[i];
    }
    c[static_cast<size_t>(d)] = idx[k];
    int64_t src = 0;
    for (int i = 0; i < xs.dim(); ++i) src += c[static_cast<size_t>(i)] * xst[static_cast<size_t>(i)];
    out[k] = x[static_cast<size_t>(src)];
  }
  return out;
}

}  // namespace

// ================================================================ gradient checks

TEST_CASE("index_select float64 gradcheck dims 0, 1, -1 with repeated indices (accumulation)", "[index][grad]") {
  auto seed = GENERATE(1u, 2u, 3u);
  INFO("seed " << seed);
  AnyTensor i0 = idx64({2, 0, 2, 2, 1}, {5}), i1 = idx64({3, 3, 0}, {3}), i2 = idx32({1, 1, 1, 0}, {4});
  CHECK_GRADIENTS([&](const std::vector<AnyTensor>& x) { return op::index_select(x[0], 0, i0); },
                  random_inputs({{3, 4, 2}}, seed));
  CHECK_GRADIENTS([&](const std::vector<AnyTensor>& x) { return op::index_select(x[0], 1, i1); },
                  random_inputs({{3, 4, 2}}, seed));
  CHECK_GRADIENTS([&](const std::vector<AnyTensor>& x) { return op::index_select(x[0], -1, i2); },
                  random_inputs({{3, 4, 2}}, seed));
  CHECK_GRADIENTS([&](const std::vector<AnyTensor>& x) { return op::index_select(x[0], 0, i1); },
                  random_inputs({{4}}, seed));
  // A 0-d index selects one entry and keeps the dimension with size 1.
  AnyTensor scalar_index = idx64({1}, {});
  CHECK_GRADIENTS([&](const std::vector<AnyTensor>& x) { return op::index_select(x[0], 1, scalar_index); },
                  random_inputs({{2, 3}}, seed));
}

TEST_CASE("embedding float64 gradcheck with 2D indices and repeated rows", "[index][grad]") {
  auto seed = GENERATE(1u, 2u, 3u);
  INFO("seed " << seed);
  AnyTensor ids = idx64({4, 0, 4, 1, 4, 0}, {2, 3});
  CHECK_GRADIENTS([&](const std::vector<AnyTensor>& w) { return op::embedding(w[0], ids); }, random_inputs({{5, 3}}, seed));
  AnyTensor ids32 = idx32({2, 2, 2}, {3});
  CHECK_GRADIENTS([&](const std::vector<AnyTensor>& w) { return op::embedding(w[0], ids32); },
                  random_inputs({{3, 4}}, seed));
}

TEST_CASE("gather float64 gradcheck dims 0, 1, -1 with repeated indices", "[index][grad]") {
  auto seed = GENERATE(1u, 2u, 3u);
  INFO("seed " << seed);
  // x [3,4]; dim 0: index [5,4] (more rows than x, repeats); dim 1: index [3,2].
  AnyTensor g0 = idx64({0, 1, 2, 0, 2, 2, 2, 2, 1, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1}, {5, 4});
  AnyTensor g1 = idx64({3, 3, 0, 1, 2, 2}, {3, 2});
  CHECK_GRADIENTS([&](const std::vector<AnyTensor>& x) { return op::gather(x[0], 0, g0); }, random_inputs({{3, 4}}, seed));
  CHECK_GRADIENTS([&](const std::vector<AnyTensor>& x) { return op::gather(x[0], 1, g1); }, random_inputs({{3, 4}}, seed));
  // 3D, last dim, index of the same size with repeats.
  AnyTensor g2 = idx32({1, 1, 0, 0, 1, 0, 1, 1, 1, 0, 0, 0}, {2, 3, 2});
  CHECK_GRADIENTS([&](const std::vector<AnyTensor>& x) { return op::gather(x[0], -1, g2); },
                  random_inputs({{2, 3, 2}}, seed));
  // Middle dimension of a 3D tensor.
  AnyTensor g3 = idx64({2, 0, 1, 1, 0, 0, 2, 2}, {2, 2, 2});
  CHECK_GRADIENTS([&](const std::vector<AnyTensor>& x) { return op::gather(x[0], 1, g3); },
                  random_inputs({{2, 3, 2}}, seed));
}

TEST_CASE("index_select embedding gather float64 repeated indices accumulate exact counts", "[index][grad]") {
  AnyTensor x = dt({1, 2, 3}, {3});
  x.set_requires_grad();
  op::sum(op::index_select(x, 0, idx64({1, 1, 1, 2}, {4}))).backward();
  check_close(vals(x.grad()), {0, 3, 1});
  AnyTensor w = dt(iota_vals(6), {3, 2});
  w.set_requires_grad();
  op::sum(op::embedding(w, idx64({0, 2, 0, 0}, {2, 2}))).backward();
  check_close(vals(w.grad()), {3, 3, 0, 0, 1, 1});
  AnyTensor g = dt(iota_vals(6), {2, 3});
  g.set_requires_grad();
  op::sum(op::gather(g, 1, idx64({2, 2, 2, 0}, {2, 2}))).backward();
  check_close(vals(g.grad()), {0, 0, 2, 1, 0, 1});
}

// ================================================================ forward values

TEST_CASE("index_select float32, int64 and float16 forward vs loop reference", "[index][forward]") {
  const Shape s{3, 4, 5};
  std::vector<double> xv = iota_vals(60);
  for (DType t : {DType::Float32, DType::Int64, DType::Float16}) {
    AnyTensor x = dt(xv, s).to(t);
    for (int d : {0, 1, 2}) {
      const std::vector<int64_t> iv = {static_cast<int64_t>(s[d]) - 1, 0, 1, 0};
      INFO(dtype_name(t) << " dim " << d);
      for (bool use32 : {false, true}) {
        AnyTensor index = use32 ? idx32({static_cast<int32_t>(iv[0]), 0, 1, 0}, {4}) : idx64(iv, {4});
        AnyTensor y = op::index_select(x, d, index);
        Shape os = s;
        os[d] = 4;
        CHECK(y.shape() == os);
        CHECK(y.dtype() == t);
        check_close(vals(y), ref_index_select(xv, s, d, iv));
      }
    }
    AnyTensor empty = op::index_select(x, 1, idx64({}, {0}));
    CHECK(empty.shape() == Shape{3, 0, 5});
  }
}

TEST_CASE("embedding float32 forward: rows by index, shape indices + [dim]", "[index][forward]") {
  Tensor<float> w = Tensor<float>::from_vector({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2});
  Tensor<int64_t> ids = Tensor<int64_t>::from_vector({3, 0, 3, 2, 1, 1}, {3, 2});
  Tensor<float> e = ember::embedding(w, ids);
  CHECK(e.shape() == Shape{3, 2, 2});
  check_close(vals(e), {30, 31, 0, 1, 30, 31, 20, 21, 10, 11, 10, 11});
  AnyTensor one = op::embedding(w, idx64({2}, {}));
  CHECK(one.shape() == Shape{2});
  check_close(vals(one), {20, 21});
  CHECK_THROWS_AS(op::embedding(w, idx64({4}, {1})), IndexError);
  CHECK_THROWS_AS(op::embedding(AnyTensor::zeros({4}, DType::Float32), idx64({0}, {1})), ShapeError);
}

TEST_CASE("gather float32 forward vs loop reference along each dim", "[index][forward]") {
  const Shape xs{3, 4, 2};
  std::vector<double> xv = iota_vals(24, 100);
  AnyTensor x = dt(xv, xs).to(DType::Float32);
  for (int d : {0, 1, 2, -1}) {
    const int dd = d < 0 ? d + 3 : d;
    INFO("dim " << d);
    std::vector<int64_t> ish = {3, 4, 2};
    ish[static_cast<size_t>(dd)] = 5;  // more entries than x has along d
    Shape is(ish);
    std::vector<int64_t> iv(static_cast<size_t>(is.numel()));
    for (size_t k = 0; k < iv.size(); ++k) iv[k] = static_cast<int64_t>((k * 7 + 3) % static_cast<size_t>(xs[dd]));
    AnyTensor y = op::gather(x, d, idx64(iv, is));
    CHECK(y.shape() == is);
    CHECK(y.dtype() == DType::Float32);
    check_close(vals(y), ref_gather(xv, xs, dd, iv, is));
  }
  // Typed wrapper with int32 indices, fewer entries than x along dim 1.
  Tensor<float> tx(x);
  Tensor<float> ty = ember::gather(tx, 1, Tensor<int32_t>::from_vector({3, 0, 3, 0, 1, 1, 2, 2, 0, 0, 1, 3}, {3, 2, 2}));
  check_close(vals(ty), ref_gather(xv, xs, 1, {3, 0, 3, 0, 1, 1, 2, 2, 0, 0, 1, 3}, {3, 2, 2}));
}

TEST_CASE("index ops int64 index validation: out of range, negative, wrong dtype and shape", "[index][errors]") {
  AnyTensor x = AnyTensor::zeros({3, 4}, DType::Float32);
  CHECK_THROWS_AS(op::index_select(x, 0, idx64({0, 3}, {2})), IndexError);
  CHECK_THROWS_AS(op::index_select(x, 1, idx64({-1}, {1})), IndexError);
  CHECK_THROWS_AS(op::index_select(x, 0, AnyTensor::zeros({2}, DType::Float32)), DTypeError);
  CHECK_THROWS_AS(op::index_select(x, 0, idx64({0, 1}, {1, 2})), ShapeError);
  CHECK_THROWS_AS(op::index_select(x, 2, idx64({0}, {1})), IndexError);
  CHECK_THROWS_AS(op::gather(x, 1, idx64({0, 4, 0}, {3, 1})), IndexError);
  CHECK_THROWS_AS(op::gather(x, 1, idx64({0, 1}, {2, 1})), ShapeError);  // dim 0 differs
  CHECK_THROWS_AS(op::gather(x, 1, idx64({0, 1, 2}, {3})), ShapeError);  // rank differs
  CHECK_THROWS_AS(op::gather(x, 0, idx32({0, 0, 0, -2}, {1, 4})), IndexError);
  // Indices near 2^63 (they round to 2^63 in a double): still out of range, and the message says so.
  CHECK_THROWS_WITH(op::index_select(x, 0, idx64({0, std::numeric_limits<int64_t>::max()}, {2})),
                    Catch::Matchers::Contains("index_select: index 9223372036854775807 is out of range for dimension 0 of size 3"));
  CHECK_THROWS_AS(op::index_select(x, 0, idx64({std::numeric_limits<int64_t>::max() - 100}, {1})), IndexError);
  CHECK_THROWS_WITH(op::index_select(x, 0, idx64({1, 3}, {2})), Catch::Matchers::Contains("index 3 is out of range"));
}
