// Reductions (ops/reduce.hpp) and softmax / log_softmax (ops/softmax.hpp): forward values against
// plain-loop references, var/std against torch, argmax/argmin ties, gradients at tied extrema,
// what PyTorch accepts (0-d and empty inputs), numerical stability, and fp16/bf16 against fp32.
// Each op's gradient check, CPU/CUDA parity, bad inputs and NaN semantics come from the registry
// (tests/op_cases.hpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <ember/ember.hpp>

#include "test_util.hpp"

using namespace ember;
using namespace ember::testing;
using Catch::Contains;

namespace {

// Reference reduction by plain loops: each input element is added into the output slot found by
// dropping the reduced coordinates. `dims` normalised; empty means all.
std::vector<double> ref_reduce(const std::vector<double>& x, const Shape& s, std::vector<int> dims, ReduceOp op,
                               Shape* out_shape = nullptr, bool keepdim = false) {
  if (dims.empty())
    for (int i = 0; i < s.dim(); ++i) dims.push_back(i);
  for (int& d : dims) d = d < 0 ? d + s.dim() : d;
  auto reduced = [&](int d) { return std::find(dims.begin(), dims.end(), d) != dims.end(); };
  std::vector<int64_t> os;
  for (int d = 0; d < s.dim(); ++d)
    if (!reduced(d)) os.push_back(s[d]);
    else if (keepdim) os.push_back(1);
  int64_t on = 1;
  for (int d = 0; d < s.dim(); ++d)
    if (!reduced(d)) on *= s[d];
  if (out_shape) *out_shape = Shape(os);
  const double init = op == ReduceOp::Max ? -INFINITY : (op == ReduceOp::Min ? INFINITY : 0.0);
  std::vector<double> acc(static_cast<size_t>(on), init), count(static_cast<size_t>(on), 0);
  std::vector<int64_t> arg(static_cast<size_t>(on), -1);
  std::vector<int64_t> idx(static_cast<size_t>(s.dim()), 0);
  for (size_t flat = 0; flat < x.size(); ++flat) {
    // coordinates of `flat`
    int64_t rem = static_cast<int64_t>(flat);
    for (int d = s.dim() - 1; d >= 0; --d) {
      idx[static_cast<size_t>(d)] = rem % s[d];
      rem /= s[d];
    }
    int64_t o = 0, r = 0;  // output slot, and position within the reduced sub-block (row-major)
    for (int d = 0; d < s.dim(); ++d) {
      if (!reduced(d)) o = o * s[d] + idx[static_cast<size_t>(d)];
      else r = r * s[d] + idx[static_cast<size_t>(d)];
    }
    double& a = acc[static_cast<size_t>(o)];
    const double v = x[flat];
    switch (op) {
      case ReduceOp::Sum: case ReduceOp::Mean: a += v; break;
      case ReduceOp::Max: a = std::max(a, v); break;
      case ReduceOp::Min: a = std::min(a, v); break;
      case ReduceOp::ArgMax:
        if (arg[static_cast<size_t>(o)] < 0 || v > a) { a = v; arg[static_cast<size_t>(o)] = r; }
        break;
      case ReduceOp::ArgMin:
        if (arg[static_cast<size_t>(o)] < 0 || v < a) { a = v; arg[static_cast<size_t>(o)] = r; }
        break;
    }
    count[static_cast<size_t>(o)] += 1;
  }
  if (op == ReduceOp::Mean)
    for (size_t i = 0; i < acc.size(); ++i) acc[i] /= count[i];
  if (op == ReduceOp::ArgMax || op == ReduceOp::ArgMin)
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = static_cast<double>(arg[i]);
  return acc;
}

const std::vector<std::vector<int>>& dim_sets() {
  static const std::vector<std::vector<int>> d = {{0}, {1}, {-1}, {0, 2}, {1, 2}, {2, 0}, {0, 1, 2}, {}};
  return d;
}

AnyTensor reduce_by(ReduceOp op, const AnyTensor& x, const std::vector<int>& dims, bool keepdim) {
  switch (op) {
    case ReduceOp::Sum: return op::sum(x, dims, keepdim);
    case ReduceOp::Mean: return op::mean(x, dims, keepdim);
    case ReduceOp::Max: return op::max(x, dims, keepdim);
    case ReduceOp::Min: return op::min(x, dims, keepdim);
    case ReduceOp::ArgMax: return op::argmax(x, dims, keepdim);
    case ReduceOp::ArgMin: return op::argmin(x, dims, keepdim);
  }
  return {};
}

const char* rname(ReduceOp op) {
  static const char* n[] = {"sum", "mean", "max", "min", "argmax", "argmin"};
  return n[static_cast<int>(op)];
}

}  // namespace

// ================================================================ gradients at ties

TEST_CASE("max and min float64 gradient splits evenly between tied extrema", "[reduce][grad]") {
  AnyTensor x = dt({1, 3, 3, 2, /**/ 5, 0, 0, 0}, {2, 4});
  x.set_requires_grad();
  op::sum(op::max(x, {1})).backward();
  check_close(vals(x.grad()), {0, 0.5, 0.5, 0, 1, 0, 0, 0}, 0, 1e-15);
  x.zero_grad();
  op::sum(op::min(x, {1})).backward();
  check_close(vals(x.grad()), {1, 0, 0, 0, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3}, 0, 1e-15);
  x.zero_grad();
  op::max(x).backward();  // over everything: the single 5
  check_close(vals(x.grad()), {0, 0, 0, 0, 1, 0, 0, 0}, 0, 1e-15);
}

// ================================================================ forward values

TEST_CASE("gaps: var and std with a correction match torch.var/torch.std", "[gaps][reduce]") {
  // (std is ember::std: with `using namespace ember` an unqualified std(x) is ambiguous.)
  // torch.tensor([[1., 2., 4.], [3., 5., 9.]]).var() = 8.0; .var(dim=1) = [2.3333, 9.3333];
  // .var(dim=1, correction=0) = [1.5556, 6.2222]; .std(dim=0) = [1.4142, 2.1213, 3.5355].
  auto x = Tensor<double>::from_vector({1, 2, 4, 3, 5, 9}, Shape{2, 3});
  CHECK(var(x).item() == Approx(8.0));
  CHECK(ember::std(x).item() == Approx(std::sqrt(8.0)));
  testing::check_close(var(x, {1}).to_double_vector(), {7.0 / 3.0, 28.0 / 3.0}, 1e-12);
  testing::check_close(var(x, {1}, 0.0).to_double_vector(), {14.0 / 9.0, 56.0 / 9.0}, 1e-12);
  testing::check_close(ember::std(x, {0}).to_double_vector(), {std::sqrt(2.0), std::sqrt(4.5), std::sqrt(12.5)}, 1e-12);
  CHECK(var(x, {-1}, 1.0, true).shape() == Shape{2, 1});
  CHECK(var(x, {0, 1}).item() == Approx(8.0));
  // One element with correction 1: 0/0 = nan, as torch.
  CHECK(std::isnan(var(Tensor<double>::from_vector({3.0}, Shape{1})).item()));
  CHECK(var(Tensor<float>::from_vector({1, 3}, Shape{2}), {}, 0.0).item() == 1.0f);
  CHECK_THROWS_AS(var(Tensor<int64_t>::ones({3})), DTypeError);
  CHECK_THROWS_WITH(var(x, {}, -1.0), Contains("var: correction"));
  CHECK_THROWS_AS(var(x, {2}), IndexError);
}

TEST_CASE("reductions accept 0-d and empty inputs as PyTorch: sums of nothing 0, means of nothing NaN",
          "[reduce][forward]") {
  using F = Tensor<float>;
  using D = Tensor<double>;
  // 0-d inputs reduce to themselves, dims 0 and -1 name their only "dimension".
  CHECK(sum(F::scalar(4)).item() == 4.0f);
  CHECK(sum(F::scalar(4), {0}).item() == 4.0f);
  CHECK(max(F::scalar(4), {-1}).item() == 4.0f);
  CHECK(argmax(F::scalar(4)).item() == 0);
  CHECK(mean(F::scalar(4)).item() == 4.0f);
  // Sums over nothing are 0; means over nothing are NaN (0/0), as torch.mean of an empty tensor.
  CHECK(sum(F::zeros({0, 3}), {1}).shape() == Shape{0});
  CHECK(sum(F::zeros({3, 0}), {1}).to_vector() == std::vector<float>{0, 0, 0});
  CHECK(std::isnan(mean(F::zeros({0})).item()));
  auto m = mean(F::zeros({0, 2}), {0});
  REQUIRE(m.shape() == Shape{2});
  CHECK(std::isnan(m.to_vector()[0]));
  CHECK(std::isnan(m.to_vector()[1]));
  CHECK(mean(F::zeros({0, 2}), {1}).shape() == Shape{0});
  CHECK(std::isnan(var(F::zeros({0})).item()));
  // max over a non-empty dimension of a tensor that is empty elsewhere: an empty result.
  CHECK(max(F::zeros({0, 3}), {1}).shape() == Shape{0});
  // The mean of nothing has a (zero-element) gradient, not an error.
  auto e = D::zeros({0, 2});
  e.set_requires_grad(true);
  sum(mean(e, {0})).backward();
  CHECK(e.grad().shape() == Shape{0, 2});
}

TEST_CASE("softmax and log_softmax accept 0-d and empty inputs as PyTorch", "[softmax][forward]") {
  using F = Tensor<float>;
  CHECK(softmax(F::scalar(3), 0).item() == 1.0f);
  CHECK(log_softmax(F::scalar(3), -1).item() == 0.0f);
  CHECK(softmax(F::zeros({0, 3}), 1).shape() == Shape{0, 3});
  CHECK(softmax(F::zeros({3, 0}), 0).shape() == Shape{3, 0});
}

TEST_CASE("sum mean max min float64 and float32 forward vs loop reference, every dim set and keepdim",
          "[reduce][forward]") {
  const Shape s{2, 3, 4};
  for (DType t : {DType::Float64, DType::Float32}) {
    AnyTensor x = rand1(s, 17, -3, 3).to(t);
    std::vector<double> xv = vals(x);
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min}) {
      for (const auto& dims : dim_sets()) {
        for (bool keepdim : {false, true}) {
          INFO(rname(op) << " " << dtype_name(t) << " dims " << list_str(dims) << " keepdim " << keepdim);
          Shape want_shape;
          std::vector<double> want = ref_reduce(xv, s, dims, op, &want_shape, keepdim);
          AnyTensor y = reduce_by(op, x, dims, keepdim);
          CHECK(y.shape() == want_shape);
          CHECK(y.dtype() == t);
          check_close(vals(y), want, t == DType::Float64 ? 1e-14 : 1e-6, 1e-6);
        }
      }
    }
  }
}

TEST_CASE("sum float32 forward of a 0-d tensor, of a 1-D tensor and over an empty dimension", "[reduce][forward]") {
  AnyTensor s = dt({2.5}, {}).to(DType::Float32);
  check_close(vals(op::sum(s)), {2.5}, 0);
  CHECK(op::sum(s).dim() == 0);
  AnyTensor v = dt({1, 2, 3, 4}, {4}).to(DType::Float32);
  check_close(vals(op::sum(v)), {10}, 0);
  check_close(vals(op::mean(v, {0}, true)), {2.5}, 0);
  CHECK(op::mean(v, {0}, true).shape() == Shape{1});
  AnyTensor e = AnyTensor::zeros({3, 0}, DType::Float32);
  AnyTensor se = op::sum(e, {1});
  CHECK(se.shape() == Shape{3});
  check_close(vals(se), {0, 0, 0}, 0);
  CHECK_THROWS_AS(op::max(e, {1}), ShapeError);
  CHECK_THROWS_AS(op::sum(v, {1}), IndexError);
}

TEST_CASE("sum mean max min argmax argmin float64 of a 0-d tensor: values, dtypes, and a new tensor",
          "[reduce][forward]") {
  AnyTensor s = dt({-2.5}, {});
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min}) {
    for (bool keepdim : {false, true}) {
      INFO(rname(op) << " keepdim " << keepdim);
      AnyTensor y = reduce_by(op, s, {}, keepdim);
      CHECK(y.dim() == 0);
      CHECK(y.dtype() == DType::Float64);
      check_close(vals(y), {-2.5}, 0);
      // A reduction returns a new tensor: writing into it leaves the input alone.
      static_cast<double*>(y.data_ptr())[0] = 7;
      CHECK(vals(s)[0] == -2.5);
      CHECK(vals(reduce_by(op, s, {0}, keepdim))[0] == -2.5);
    }
  }
  for (ReduceOp op : {ReduceOp::ArgMax, ReduceOp::ArgMin}) {
    INFO(rname(op));
    AnyTensor i = reduce_by(op, s, {}, false);
    CHECK(i.dtype() == DType::Int64);
    CHECK(i.dim() == 0);
    check_close(vals(i), {0}, 0);
  }
  CHECK(ember::argmax(Tensor<double>(s)).item() == 0);
}

TEST_CASE("sum int32 and int64 forward vs loop reference", "[reduce][forward]") {
  for (DType t : {DType::Int32, DType::Int64}) {
    INFO(dtype_name(t));
    AnyTensor x = dt({1, -2, 3, 4, 5, -6}, {2, 3}).to(t);
    AnyTensor y = op::sum(x, {1});
    CHECK(y.dtype() == t);
    check_close(vals(y), {2, 3}, 0);
    check_close(vals(op::max(x, {0})), {4, 5, 3}, 0);
    check_close(vals(op::sum(x)), {5}, 0);
  }
}

TEST_CASE("argmax argmin float64 and float32 vs loop reference (first index on ties)", "[reduce][forward]") {
  const Shape s{3, 4, 5};
  for (DType t : {DType::Float64, DType::Float32}) {
    // Values from a small set so that ties are common.
    std::vector<double> r = vals(rand1(s, 29, 0, 3));
    for (double& v : r) v = std::floor(v);
    AnyTensor x = dt(r, s).to(t);
    std::vector<double> xv = vals(x);
    for (ReduceOp op : {ReduceOp::ArgMax, ReduceOp::ArgMin}) {
      for (int dim : {0, 1, 2, -1}) {
        for (bool keepdim : {false, true}) {
          INFO(rname(op) << " " << dtype_name(t) << " dim " << dim << " keepdim " << keepdim);
          Shape want_shape;
          std::vector<double> want = ref_reduce(xv, s, {dim}, op, &want_shape, keepdim);
          AnyTensor y = reduce_by(op, x, {dim}, keepdim);
          CHECK(y.dtype() == DType::Int64);
          CHECK(y.shape() == want_shape);
          check_close(vals(y), want, 0);
        }
      }
      INFO(rname(op) << " " << dtype_name(t) << " over all dims");
      AnyTensor all = reduce_by(op, x, {}, false);
      CHECK(all.dim() == 0);
      check_close(vals(all), ref_reduce(xv, s, {}, op), 0);
      CHECK(reduce_by(op, x, {}, true).shape() == Shape{1, 1, 1});
    }
  }
  // Explicit ties: the first index wins.
  AnyTensor t = dt({2, 7, 7, 1, 1, 7}, {6});
  CHECK(op::argmax(t).item_double() == 1);
  CHECK(op::argmin(t).item_double() == 3);
  Tensor<int64_t> am = ember::argmax(Tensor<double>(dt({0, 5, 5, 9, 9, 1}, {2, 3})), {1});
  check_close(vals(am), {1, 0}, 0);
}

TEST_CASE("reductions take one dimension as a plain integer, and a braced list keeps its meaning", "[reduce][forward]") {
  const Tensor<double> x(dt({0, 5, 5, 9, 9, 1}, {2, 3}));
  CHECK(vals(ember::argmax(x, 1)) == std::vector<double>{1, 0});
  CHECK(vals(ember::argmin(x, 1)) == std::vector<double>{0, 2});
  CHECK(vals(ember::argmax(x, -1)) == std::vector<double>{1, 0});
  CHECK(vals(ember::argmax(x, 0, true)) == std::vector<double>{1, 1, 0});
  CHECK(ember::argmax(x, 0, true).shape() == Shape{1, 3});
  CHECK(vals(ember::sum(x, 1)) == std::vector<double>{10, 19});
  CHECK(vals(ember::mean(x, int64_t{0})) == std::vector<double>{4.5, 7, 3});
  CHECK(vals(ember::max(x, 0)) == std::vector<double>{9, 9, 5});
  CHECK(vals(ember::min(x, 1u)) == std::vector<double>{0, 1});
  CHECK(vals(op::argmax(x, 1)) == std::vector<double>{1, 0});
  // {} is still every dimension (not dimension 0), {1} still the list of one.
  CHECK(ember::argmax(x, {}).dim() == 0);
  CHECK(ember::argmax(x, {}).item() == 3);
  CHECK(ember::sum(x, {}).item() == 29);
  CHECK(vals(ember::argmax(x, {1})) == std::vector<double>{1, 0});
  CHECK_THROWS_WITH(ember::argmax(x, 2), Catch::Matchers::Contains("argmax"));
}

TEST_CASE("reductions float16 and bfloat16 forward within 1e-3 / 1e-2 of float32", "[reduce][forward][lowp]") {
  const Shape s{4, 6, 8};
  for (DType t : {DType::Float16, DType::BFloat16}) {
    const double rtol = t == DType::Float16 ? 1e-3 : 1e-2;
    // Multiples of 1/64 in [0.5, 3.5): exact in both formats, positive so sums do not cancel.
    std::vector<double> r = vals(rand1(s, 31, 0.5, 3.5));
    for (double& v : r) v = std::round(v * 64) / 64;
    AnyTensor x32 = dt(r, s).to(DType::Float32), xl = x32.to(t);
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min}) {
      for (const auto& dims : dim_sets()) {
        INFO(rname(op) << " " << dtype_name(t) << " dims " << list_str(dims));
        AnyTensor y = reduce_by(op, xl, dims, false);
        CHECK(y.dtype() == t);
        check_close(vals(y), vals(reduce_by(op, x32, dims, false)), rtol);
      }
    }
    INFO("argmax " << dtype_name(t));
    check_close(vals(op::argmax(xl, {1})), vals(op::argmax(x32, {1})), 0);
  }
}

TEST_CASE("softmax float64 and float32 rows sum to 1 and match exp(x-max)/sum, last and non-last dims",
          "[softmax][forward]") {
  const Shape s{3, 4, 5};
  for (DType t : {DType::Float64, DType::Float32}) {
    AnyTensor x = rand1(s, 37, -5, 5).to(t);
    std::vector<double> xv = vals(x);
    for (int dim : {-1, 0, 1}) {
      const int d = dim < 0 ? dim + 3 : dim;
      INFO("softmax " << dtype_name(t) << " dim " << dim);
      AnyTensor y = op::softmax(x, dim), ly = op::log_softmax(x, dim);
      CHECK(y.shape() == s);
      CHECK(y.dtype() == t);
      std::vector<double> yv = vals(y), lyv = vals(ly);
      // Reference along dimension d, by loops over the other two.
      std::vector<double> want(xv.size()), lwant(xv.size());
      auto strides = s.strides();
      std::vector<int> others;
      for (int i = 0; i < 3; ++i)
        if (i != d) others.push_back(i);
      for (int64_t i = 0; i < s[others[0]]; ++i)
        for (int64_t j = 0; j < s[others[1]]; ++j) {
          const int64_t base = i * strides[static_cast<size_t>(others[0])] + j * strides[static_cast<size_t>(others[1])];
          const int64_t st = strides[static_cast<size_t>(d)];
          double mx = -INFINITY, sum = 0, ysum = 0;
          for (int64_t k = 0; k < s[d]; ++k) mx = std::max(mx, xv[static_cast<size_t>(base + k * st)]);
          for (int64_t k = 0; k < s[d]; ++k) sum += std::exp(xv[static_cast<size_t>(base + k * st)] - mx);
          for (int64_t k = 0; k < s[d]; ++k) {
            const size_t p = static_cast<size_t>(base + k * st);
            want[p] = std::exp(xv[p] - mx) / sum;
            lwant[p] = xv[p] - mx - std::log(sum);
            ysum += yv[p];
          }
          CHECK(ysum == Approx(1.0).epsilon(t == DType::Float64 ? 1e-14 : 1e-6));
        }
      check_close(yv, want, t == DType::Float64 ? 1e-13 : 2e-6, 1e-12);
      check_close(lyv, lwant, t == DType::Float64 ? 1e-13 : 2e-6, 2e-6);
    }
  }
}

TEST_CASE("log_softmax float32 and float64 stable with huge logits 1e4 and -1e4", "[softmax][forward]") {
  for (DType t : {DType::Float32, DType::Float64}) {
    INFO(dtype_name(t));
    AnyTensor x = dt({1e4, -1e4, 0, /**/ -1e4, -1e4, -1e4}, {2, 3}).to(t);
    std::vector<double> ly = vals(op::log_softmax(x)), y = vals(op::softmax(x));
    for (double v : ly) CHECK(std::isfinite(v));
    for (double v : y) CHECK(std::isfinite(v));
    check_close(ly, {0, -2e4, -1e4, -std::log(3.0), -std::log(3.0), -std::log(3.0)}, 1e-6);
    check_close(y, {1, 0, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3}, 1e-6, 1e-30);
    // Along dim 0 as well (non-last path).
    std::vector<double> l0 = vals(op::log_softmax(x, 0));
    check_close(l0, {0, -std::log(2.0), 0, -2e4, -std::log(2.0), -1e4}, 1e-6);
  }
}

TEST_CASE("typed reductions and softmax float32 keep Tensor<float>: ember::sum, mean, max, min, argmin, softmax",
          "[reduce][softmax][forward]") {
  Tensor<float> x = Tensor<float>::from_vector({1, 4, 2, 8, 5, 7}, {2, 3});
  Tensor<float> s = ember::sum(x, {1});
  check_close(vals(s), {7, 20}, 0);
  check_close(vals(ember::mean(x, {0}, true)), {4.5, 4.5, 4.5}, 0);
  CHECK(ember::mean(x, {0}, true).shape() == Shape{1, 3});
  check_close(vals(ember::max(x)), {8}, 0);
  check_close(vals(ember::min(x, {1})), {1, 5}, 0);
  Tensor<int64_t> am = ember::argmin(x, {0});
  check_close(vals(am), {0, 0, 0}, 0);
  Tensor<float> sm = ember::softmax(x, 0);
  check_close(vals(ember::sum(sm, {0})), {1, 1, 1}, 1e-6);
  Tensor<float> lsm = ember::log_softmax(x);
  check_close(vals(ember::sum(ember::exp(lsm), {1})), {1, 1}, 1e-6);
}

TEST_CASE("softmax float32 of a 0-d tensor is 1, log_softmax 0", "[softmax][forward]") {
  AnyTensor s = dt({3.5}, {}).to(DType::Float32);
  check_close(vals(op::softmax(s)), {1}, 0);
  check_close(vals(op::log_softmax(s)), {0}, 0);
  CHECK_THROWS_AS(op::softmax(AnyTensor::zeros({2, 3}, DType::Int32)), DTypeError);
}

TEST_CASE("softmax and log_softmax float16 and bfloat16 within 1e-3 / 1e-2 of float32", "[softmax][forward][lowp]") {
  const Shape s{4, 16};
  for (DType t : {DType::Float16, DType::BFloat16}) {
    const double rtol = t == DType::Float16 ? 1e-3 : 1e-2;
    std::vector<double> r = vals(rand1(s, 41, -3.5, 3.5));
    for (double& v : r) v = std::round(v * 64) / 64;
    AnyTensor x32 = dt(r, s).to(DType::Float32), xl = x32.to(t);
    for (int dim : {-1, 0}) {
      INFO(dtype_name(t) << " dim " << dim);
      AnyTensor y = op::softmax(xl, dim), ly = op::log_softmax(xl, dim);
      CHECK(y.dtype() == t);
      check_close(vals(y), vals(op::softmax(x32, dim)), rtol, 1e-7);
      check_close(vals(ly), vals(op::log_softmax(x32, dim)), rtol, 1e-6);
    }
  }
}
