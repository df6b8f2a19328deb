// Indexing ops (ops/index.hpp): index_select, embedding, gather. Repeated indices accumulate exact
// counts in backward, forward values against plain loops, empty and 0-d indices. Each op's
// gradient check, CPU/CUDA parity and bad inputs come from the registry (tests/op_cases.hpp).
#include <catch2/catch.hpp>

#include <limits>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <ember/ember.hpp>

#include "test_util.hpp"

using namespace ember;
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

// ================================================================ gradients of repeated indices

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

TEST_CASE("index ops accept empty and 0-d indices as PyTorch", "[index][forward]") {
  using F = Tensor<float>;
  using I64 = Tensor<int64_t>;
  const F x = F::from_vector({0, 1, 2, 3, 4, 5}, {3, 2});
  const F w = F::from_vector({0, 1, 2, 3, 4, 5}, {3, 2});
  CHECK(index_select(x, 0, I64::zeros({0})).shape() == Shape{0, 2});
  CHECK(index_select(x, 1, I64::scalar(1)).to_vector() == std::vector<float>{1, 3, 5});
  CHECK(index_select(F::zeros({0, 2}), 1, I64::from_vector({1, 0})).shape() == Shape{0, 2});
  auto row = embedding(w, I64::scalar(2));
  CHECK(row.shape() == Shape{2});
  CHECK(row.to_vector() == std::vector<float>{4, 5});
  CHECK(embedding(w, I64::zeros({0, 4})).shape() == Shape{0, 4, 2});
  CHECK(gather(x, 1, I64::zeros({3, 0})).shape() == Shape{3, 0});
  CHECK(gather(F::from_vector({7, 8, 9}, {3}), 0, I64::from_vector({2, 0})).to_vector() == std::vector<float>{9, 7});
}
