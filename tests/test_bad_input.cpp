// The bad-input sweep (issue 14, "Hardening in CI"): every public op family given wrong shapes,
// empty and 0-d tensors, dimensions out of range, negative dimensions, absurd sizes and
// out-of-range indices. Each case names the op it calls, the exception type it must raise and the
// substrings its message must hold (the op, and the shapes or dimension where they matter); one
// TEST_CASE per op family runs a table of cases and reports the failing one by name. Where PyTorch
// accepts an empty or 0-d input (a sum of nothing is 0, the mean of nothing is NaN, an empty batch
// gives an empty output) the result is checked instead.
//
// Not repeated here: the cases of test_errors.cpp (one of each kind), test_size_overflow.cpp
// (overflowing sizes) and test_nan_semantics.cpp (NaN propagation, windows that do not fit).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <typeinfo>
#include <vector>

#include <ember/ember.hpp>

#include "pretend_gpu.hpp"

using namespace ember;

namespace {

// One bad input: `run` must throw an exception of which `is_type` approves, whose message holds
// every one of `subs`.
struct Case {
  std::string name;
  std::function<void()> run;
  const char* type_name;
  std::function<bool(const std::exception&)> is_type;
  std::vector<std::string> subs;
};

template <class E>
Case expect(std::string name, std::function<void()> run, std::vector<std::string> subs) {
  return Case{std::move(name), std::move(run), typeid(E).name(),
              [](const std::exception& e) { return dynamic_cast<const E*>(&e) != nullptr; }, std::move(subs)};
}

void run_cases(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    INFO("case: " << c.name);
    bool threw = false, right_type = false;
    std::string what, seen = "(nothing)";
    try {
      c.run();
    } catch (const std::exception& e) {
      threw = true;
      right_type = c.is_type(e);
      what = e.what();
      seen = typeid(e).name();
    } catch (...) {
      threw = true;
      seen = "a non-std exception";
    }
    INFO("expected " << c.type_name << ", got " << seen << ": \"" << what << "\"");
    CHECK(threw);
    CHECK(right_type);
    for (const std::string& s : c.subs) {
      INFO("the message must contain \"" << s << "\"");
      CHECK(what.find(s) != std::string::npos);
    }
  }
}

using F = Tensor<float>;
using D = Tensor<double>;
using I64 = Tensor<int64_t>;

F f(const std::vector<float>& v, const Shape& s) { return F::from_vector(v, s); }
I64 idx(const std::vector<int64_t>& v) { return I64::from_vector(v); }
F scalar_f(float v) { return F::scalar(v); }

}  // namespace

TEST_CASE("bad input: elementwise and broadcasting", "[bad_input]") {
  const F a = F::ones({2, 3}), b = F::ones({3, 2});
  run_cases({
      expect<ShapeError>("sub [2, 3] - [3, 2]", [&] { sub(a, b); }, {"sub", "[2, 3]", "[3, 2]", "dimension"}),
      expect<ShapeError>("mul [2, 3] * [3, 2]", [&] { mul(a, b); }, {"mul", "[2, 3]", "[3, 2]"}),
      expect<ShapeError>("div [2, 3] / [2]", [&] { div(a, F::ones({2})); }, {"div", "[2, 3]", "[2]", "3 vs 2"}),
      expect<ShapeError>("pow [2, 3] ^ [4, 1, 2]", [&] { pow(a, F::ones({4, 1, 2})); }, {"pow", "[4, 1, 2]"}),
      expect<ShapeError>("maximum [2, 3] [2, 2]", [&] { maximum(a, F::ones({2, 2})); }, {"maximum", "[2, 2]"}),
      expect<ShapeError>("minimum [0] [2]", [&] { minimum(F::zeros({0}), F::ones({2})); }, {"minimum", "[0]", "0 vs 2"}),
      expect<ShapeError>("add empty [0, 3] + [2, 3]", [&] { F::zeros({0, 3}) + F::ones({2, 3}); }, {"add", "[0, 3]"}),
      expect<ShapeError>("eq [2, 3] [3]", [&] { eq(a, F::ones({2})); }, {"eq", "[2, 3]", "[2]"}),
      expect<ShapeError>("where condition [4] against [2, 3]",
                         [&] { where(Tensor<uint8_t>::ones({4}), a, a); }, {"where", "[4]", "[2, 3]"}),
      expect<DTypeError>("mul float32 * float64", [&] { op::mul(a, D::ones({2, 3})); }, {"mul", "float32", "float64"}),
      expect<DTypeError>("log of int64", [&] { op::log(I64::ones({2})); }, {"log", "int64"}),
      expect<DTypeError>("sigmoid of uint8", [&] { op::sigmoid(Tensor<uint8_t>::ones({2})); }, {"sigmoid", "uint8"}),
      expect<ValueError>("add with an undefined second input", [&] { op::add(a, AnyTensor()); },
                         {"add", "second input", "undefined"}),
      expect<ValueError>("exp of an undefined tensor", [&] { op::exp(AnyTensor()); }, {"exp", "undefined"}),
      expect<ValueError>("clamp with min > max on an empty tensor", [&] { clamp(F::zeros({0}), 2.0, 1.0); },
                         {"clamp", "min 2", "max 1"}),
      expect<ValueError>("integer division of 0-d by 0-d zero",
                         [&] { op::div(I64::scalar(3), I64::scalar(0)); }, {"div", "division by zero"}),
  });
  // Accepted: empty and 0-d operands broadcast as in PyTorch.
  CHECK((F::zeros({0, 3}) + F::ones({3})).shape() == Shape{0, 3});
  CHECK((F::zeros({2, 0}) * F::ones({2, 1})).shape() == Shape{2, 0});
  auto s = scalar_f(2.0f) * f({1, 2, 3}, {3});
  CHECK(s.to_vector() == std::vector<float>{2, 4, 6});
  auto z = scalar_f(2.0f) + scalar_f(3.0f);
  CHECK(z.shape() == Shape{});
  CHECK(z.item() == 5.0f);
  CHECK(exp(F::zeros({0})).shape() == Shape{0});
  CHECK(eq(F::zeros({0, 2}), F::zeros({2})).shape() == Shape{0, 2});
}

TEST_CASE("bad input: reductions with dimension arguments", "[bad_input]") {
  const F x = F::ones({2, 3});
  run_cases({
      expect<IndexError>("sum dim -3 of rank 2", [&] { sum(x, {-3}); }, {"sum", "dimension -3", "rank 2"}),
      expect<IndexError>("mean dim 2 of rank 2", [&] { mean(x, {2}); }, {"mean", "dimension 2", "rank 2"}),
      expect<IndexError>("max dims {0, 5}", [&] { max(x, {0, 5}); }, {"max", "dimension 5"}),
      expect<IndexError>("min dim -3", [&] { min(x, {-3}); }, {"min", "dimension -3"}),
      expect<IndexError>("argmax dim 2", [&] { argmax(x, {2}); }, {"argmax", "dimension 2"}),
      expect<IndexError>("argmin dim -5", [&] { argmin(x, {-5}); }, {"argmin", "dimension -5"}),
      expect<IndexError>("var dim 3", [&] { var(x, {3}); }, {"var", "dimension 3"}),
      expect<IndexError>("std dim -4", [&] { op::std(x, {-4}); }, {"std", "dimension -4"}),
      expect<IndexError>("sum of a 0-d tensor over dim 1", [&] { sum(scalar_f(1), {1}); }, {"sum", "dimension 1", "rank 0"}),
      expect<ShapeError>("argmax over 2 of 3 dimensions", [&] { argmax(F::ones({2, 3, 4}), {0, 1}); },
                         {"argmax", "one dimension or all", "[2, 3, 4]"}),
      expect<ShapeError>("max over the empty dimension", [&] { max(F::zeros({3, 0}), {1}); },
                         {"max", "empty dimension 1", "[3, 0]"}),
      expect<ShapeError>("argmin of an empty tensor", [&] { argmin(F::zeros({0})); }, {"argmin", "[0]"}),
      expect<DTypeError>("mean of int64", [&] { mean(I64::ones({3})); }, {"mean", "int64"}),
      expect<DTypeError>("var of int64", [&] { op::var(I64::ones({3})); }, {"var", "int64"}),
      expect<ValueError>("var with a negative correction", [&] { var(x, {}, -1.0); }, {"var", "correction", "-1"}),
      expect<ValueError>("sum of an undefined tensor", [&] { op::sum(AnyTensor()); }, {"sum", "undefined"}),
  });
  // Accepted: 0-d inputs reduce to themselves, dims 0 and -1 name their only "dimension".
  CHECK(sum(scalar_f(4)).item() == 4.0f);
  CHECK(sum(scalar_f(4), {0}).item() == 4.0f);
  CHECK(max(scalar_f(4), {-1}).item() == 4.0f);
  CHECK(argmax(scalar_f(4)).item() == 0);
  CHECK(mean(scalar_f(4)).item() == 4.0f);
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

TEST_CASE("bad input: shape ops", "[bad_input]") {
  const F x = F::ones({2, 3});
  const F s0 = scalar_f(1);
  run_cases({
      expect<ShapeError>("reshape [2, 3] to [4, -1]", [&] { x.reshape({4, -1}); }, {"reshape", "[2, 3]"}),
      expect<ShapeError>("reshape with two -1", [&] { x.reshape({-1, -1}); }, {"reshape", "more than one -1"}),
      expect<ShapeError>("reshape with -2", [&] { x.reshape({-2, 3}); }, {"reshape", "negative dimension -2"}),
      expect<ShapeError>("reshape an empty tensor with -1 and 0", [&] { F::zeros({0}).reshape({0, -1}); },
                         {"reshape", "cannot infer -1", "[0]"}),
      expect<ShapeError>("reshape whose known sizes overflow int64",
                         [&] { F::zeros({0}).reshape({int64_t{1} << 32, int64_t{1} << 32, 4, -1}); },
                         {"reshape", "overflows"}),
      expect<ShapeError>("reshape 0-d to [2]", [&] { s0.reshape({2}); }, {"reshape", "float32[]", "[2]"}),
      expect<IndexError>("permute [0, 2]", [&] { permute(x, {0, 2}); }, {"permute", "dimension 2"}),
      expect<ShapeError>("permute [0, 0]", [&] { permute(x, {0, 0}); }, {"permute", "repeated"}),
      expect<ShapeError>("permute [1, 0, 2] of rank 2", [&] { permute(x, {1, 0, 2}); }, {"permute", "3 dimensions"}),
      expect<IndexError>("transpose -3", [&] { transpose(x, -3, 0); }, {"transpose", "dimension -3"}),
      expect<ShapeError>("transpose of a 1-d tensor", [&] { transpose(F::ones({3})); }, {"transpose", "[3]"}),
      expect<IndexError>("unsqueeze 3 of rank 2", [&] { unsqueeze(x, 3); }, {"unsqueeze", "dimension 3"}),
      expect<IndexError>("unsqueeze -4 of rank 2", [&] { unsqueeze(x, -4); }, {"unsqueeze", "dimension -4"}),
      expect<IndexError>("squeeze 2 of rank 2", [&] { squeeze(x, 2); }, {"squeeze", "dimension 2"}),
      expect<IndexError>("squeeze 1 of a 0-d tensor", [&] { squeeze(s0, 1); }, {"squeeze", "dimension 1"}),
      expect<IndexError>("flatten start 2 of rank 2", [&] { flatten(x, 2); }, {"flatten", "dimension 2"}),
      expect<ShapeError>("flatten start after end", [&] { flatten(F::ones({2, 3, 4}), 2, 1); },
                         {"flatten", "start 2 after end 1"}),
      expect<ShapeError>("expand [2, 3] to [3]", [&] { expand(x, Shape{3}); }, {"expand", "[2, 3]", "[3]"}),
      expect<ShapeError>("expand [2, 3] to [2, 1]", [&] { expand(x, Shape{2, 1}); }, {"expand", "[2, 1]"}),
      expect<ShapeError>("expand [2] to [0]", [&] { expand(F::ones({2}), Shape{0}); }, {"expand", "[2]", "[0]"}),
      expect<ValueError>("concat of nothing", [&] { op::concat({}); }, {"concat", "no tensors"}),
      expect<IndexError>("concat dim 2", [&] { concat(std::vector<F>{x, x}, 2); }, {"concat", "dimension 2"}),
      expect<IndexError>("concat of 0-d tensors", [&] { concat(std::vector<F>{s0, s0}); }, {"concat", "rank 0"}),
      expect<ShapeError>("concat ranks 2 and 1", [&] { concat(std::vector<F>{x, F::ones({3})}); },
                         {"concat", "tensor 1", "[3]", "[2, 3]"}),
      expect<DTypeError>("concat float32 and float64", [&] { op::concat({x, D::ones({2, 3})}); },
                         {"concat", "float32", "float64"}),
      expect<ValueError>("concat with an undefined tensor", [&] { op::concat({x, AnyTensor()}); }, {"concat", "undefined"}),
      expect<IndexError>("split dim 2", [&] { split(x, {1, 1}, 2); }, {"split", "dimension 2"}),
      expect<ShapeError>("split negative size", [&] { split(x, {3, -1}, 0); }, {"split", "negative size -1"}),
      expect<ShapeError>("split sizes {} of a non-empty dimension", [&] { split(x, {}, 0); }, {"split", "add up to 0"}),
      expect<IndexError>("split a 0-d tensor", [&] { split(s0, {1}); }, {"split", "rank 0"}),
      expect<ValueError>("chunk into -1", [&] { chunk(x, -1); }, {"chunk", "-1"}),
      expect<IndexError>("chunk dim -3", [&] { chunk(x, 2, -3); }, {"chunk", "dimension -3"}),
      expect<ValueError>("chunk an undefined tensor", [&] { op::chunk(AnyTensor(), 2); }, {"chunk", "undefined"}),
      expect<IndexError>("slice end past the dimension", [&] { x.slice(0, 3); }, {"slice", "[0, 3)", "[2, 3]"}),
      expect<IndexError>("slice begin after end", [&] { x.slice(2, 1); }, {"slice", "[2, 1)"}),
      expect<IndexError>("slice negative begin", [&] { x.slice(-1, 1); }, {"slice", "[-1, 1)"}),
      expect<ShapeError>("slice a 0-d tensor", [&] { s0.slice(0, 1); }, {"slice", "at least one dimension"}),
      expect<IndexError>("select -3 of size 2", [&] { x.select(-3); }, {"select", "index -3", "[2, 3]"}),
      expect<ShapeError>("select of a 0-d tensor", [&] { s0.select(0); }, {"select", "at least one dimension"}),
      expect<IndexError>("size(-3) of rank 2", [&] { x.size(-3); }, {"size", "dimension -3"}),
  });
  // Accepted: empty pieces and 0-d tensors where PyTorch takes them.
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

TEST_CASE("bad input: indexing", "[bad_input]") {
  const F x = f({0, 1, 2, 3, 4, 5}, {3, 2});
  const F w = f({0, 1, 2, 3, 4, 5}, {3, 2});
  run_cases({
      expect<IndexError>("index_select index 3 of size 3", [&] { index_select(x, 0, idx({0, 3})); },
                         {"index_select", "index 3", "size 3", "[3, 2]"}),
      expect<IndexError>("index_select index -1 along dim 1", [&] { index_select(x, 1, idx({-1})); },
                         {"index_select", "index -1", "dimension 1", "size 2"}),
      expect<IndexError>("index_select an index near INT64_MAX",
                         [&] { index_select(x, 0, idx({std::numeric_limits<int64_t>::max()})); },
                         {"index_select", "9223372036854775807"}),
      expect<IndexError>("index_select dim 2", [&] { index_select(x, 2, idx({0})); }, {"index_select", "dimension 2"}),
      expect<IndexError>("index_select dim -3", [&] { index_select(x, -3, idx({0})); }, {"index_select", "dimension -3"}),
      expect<ShapeError>("index_select a 2-d index", [&] { index_select(x, 0, I64::zeros({1, 1})); },
                         {"index_select", "1-D", "int64[1, 1]"}),
      expect<ShapeError>("index_select of a 0-d tensor", [&] { index_select(scalar_f(1), 0, idx({0})); },
                         {"index_select", "at least one dimension"}),
      expect<IndexError>("index_select from an empty dimension", [&] { index_select(F::zeros({0, 2}), 0, idx({0})); },
                         {"index_select", "index 0", "size 0"}),
      expect<DTypeError>("index_select uint8 indices", [&] { index_select(x, 0, Tensor<uint8_t>::zeros({1})); },
                         {"index_select", "uint8"}),
      expect<IndexError>("gather index -1", [&] { gather(x, 1, I64::full({3, 1}, -1.0)); }, {"gather", "index -1"}),
      expect<IndexError>("gather dim 2", [&] { gather(x, 2, I64::zeros({3, 1})); }, {"gather", "dimension 2"}),
      expect<ShapeError>("gather index of another rank", [&] { gather(x, 1, I64::zeros({3})); },
                         {"gather", "int64[3]", "rank", "[3, 2]"}),
      expect<ShapeError>("gather index differing outside dim", [&] { gather(x, 1, I64::zeros({2, 1})); },
                         {"gather", "dimension 0", "[2, 1]"}),
      expect<ShapeError>("gather from a 0-d tensor", [&] { gather(scalar_f(1), 0, I64::scalar(0)); }, {"gather", "rank"}),
      expect<DTypeError>("gather float indices", [&] { gather(x, 1, F::zeros({3, 1})); }, {"gather", "float32"}),
      expect<IndexError>("embedding index 3 of 3 rows", [&] { embedding(w, idx({1, 3})); },
                         {"embedding", "index 3", "size 3"}),
      expect<IndexError>("embedding index -1 (int32)", [&] { embedding(w, Tensor<int32_t>::from_vector({-1})); },
                         {"embedding", "index -1"}),
      expect<ShapeError>("embedding with a 1-d weight", [&] { embedding(F::ones({3}), idx({0})); },
                         {"embedding", "weight", "[3]"}),
      expect<ShapeError>("embedding with a 3-d weight", [&] { embedding(F::ones({3, 2, 2}), idx({0})); },
                         {"embedding", "[3, 2, 2]"}),
      expect<DTypeError>("embedding with float ids", [&] { embedding(w, F::zeros({2})); }, {"embedding", "float32"}),
      expect<ValueError>("embedding with undefined ids", [&] { op::embedding(w, AnyTensor()); },
                         {"embedding", "indices", "undefined"}),
  });
  // Accepted: empty and 0-d indices.
  CHECK(index_select(x, 0, I64::zeros({0})).shape() == Shape{0, 2});
  CHECK(index_select(x, 1, I64::scalar(1)).to_vector() == std::vector<float>{1, 3, 5});
  CHECK(index_select(F::zeros({0, 2}), 1, idx({1, 0})).shape() == Shape{0, 2});
  auto row = embedding(w, I64::scalar(2));
  CHECK(row.shape() == Shape{2});
  CHECK(row.to_vector() == std::vector<float>{4, 5});
  CHECK(embedding(w, I64::zeros({0, 4})).shape() == Shape{0, 4, 2});
  CHECK(gather(x, 1, I64::zeros({3, 0})).shape() == Shape{3, 0});
  CHECK(gather(f({7, 8, 9}, {3}), 0, idx({2, 0})).to_vector() == std::vector<float>{9, 7});
}

TEST_CASE("bad input: matmul", "[bad_input]") {
  run_cases({
      expect<ShapeError>("matmul 0-d x [2]", [&] { matmul(scalar_f(1), F::ones({2})); }, {"matmul", "scalars", "float32[]"}),
      expect<ShapeError>("matmul [3] . [4]", [&] { matmul(F::ones({3}), F::ones({4})); }, {"matmul", "float32[3] on cpu times float32[4]", "3 vs 4"}),
      expect<ShapeError>("matmul [2, 3] x [2]", [&] { matmul(F::ones({2, 3}), F::ones({2})); }, {"matmul", "[2, 3] on cpu times float32[2]", "3 vs 2"}),
      expect<ShapeError>("matmul [5] x [4, 3]", [&] { matmul(F::ones({5}), F::ones({4, 3})); }, {"matmul", "float32[5] on cpu times float32[4, 3]", "5 vs 4"}),
      expect<ShapeError>("matmul [2, 3] x [2, 3] transposed a", [&] { matmul(F::ones({2, 3}), F::ones({2, 3}), true, true); },
                         {"matmul", "(transposed)", "2 vs 3"}),
      expect<ShapeError>("matmul [2, 2, 3] x [2, 4, 2]", [&] { matmul(F::ones({2, 2, 3}), F::ones({2, 4, 2})); },
                         {"matmul", "inner dimensions", "[2, 2, 3]", "[2, 4, 2]"}),
      expect<ShapeError>("matmul batch [2, 1] x [3, 2]: no batch broadcasting",
                         [&] { matmul(F::ones({2, 1, 2, 3}), F::ones({3, 2, 3, 4})); }, {"matmul", "batch dimensions"}),
      expect<ShapeError>("matmul [0, 3] x [0, 3]", [&] { matmul(F::zeros({0, 3}), F::zeros({0, 3})); },
                         {"matmul", "3 vs 0"}),
      expect<DTypeError>("matmul int64", [&] { matmul(I64::ones({2, 2}), I64::ones({2, 2})); }, {"matmul", "int64"}),
      expect<DTypeError>("matmul float32 x float64", [&] { op::matmul(F::ones({2, 2}), D::ones({2, 2})); },
                         {"matmul", "float32", "float64"}),
      expect<ValueError>("matmul with an undefined input", [&] { op::matmul(F::ones({2, 2}), AnyTensor()); },
                         {"matmul", "second input"}),
  });
  // Accepted: zero-sized dimensions anywhere give empty or zero results.
  CHECK(matmul(F::zeros({0}), F::zeros({0})).item() == 0.0f);  // an empty dot product is 0
  CHECK(matmul(F::zeros({0, 3}), F::ones({3, 4})).shape() == Shape{0, 4});
  CHECK(matmul(F::ones({2, 3}), F::ones({3, 0})).shape() == Shape{2, 0});
  CHECK(matmul(F::zeros({0, 2, 3}), F::zeros({0, 3, 4})).shape() == Shape{0, 2, 4});
  CHECK(matmul(F::ones({3}), F::ones({3, 2})).to_vector() == std::vector<float>{3, 3});
  CHECK(matmul(F::zeros({2, 0}), F::zeros({0})).to_vector() == std::vector<float>{0, 0});
}

TEST_CASE("bad input: convolution and pooling", "[bad_input]") {
  const F x = F::ones({1, 2, 5, 5});
  const F w = F::ones({4, 2, 3, 3});
  auto conv = [](const F& in, const F& wt, const F& b, op::Conv2dOptions o) { conv2d(in, wt, b, o); };
  op::Conv2dOptions neg_stride;
  neg_stride.stride = {-1, 1};
  op::Conv2dOptions neg_pad;
  neg_pad.padding = {0, -2};
  op::Conv2dOptions zero_dil;
  zero_dil.dilation = {0, 1};
  op::Conv2dOptions groups3;
  groups3.groups = 3;
  op::Conv2dOptions groups0;
  groups0.groups = 0;
  op::Pool2dOptions k0;
  k0.kernel = {0, 2};
  op::Pool2dOptions neg_pool_stride;
  neg_pool_stride.stride = {-1, -1};
  op::Pool2dOptions big_pad;
  big_pad.kernel = {2, 2};
  big_pad.padding = {2, 0};
  op::Pool2dOptions neg_pool_pad;
  neg_pool_pad.padding = {-1, 0};
  run_cases({
      expect<ShapeError>("conv2d 3-d input", [&] { conv(F::ones({2, 5, 5}), w, F(), {}); },
                         {"conv2d", "[N, C, H, W]", "[2, 5, 5]"}),
      expect<ShapeError>("conv2d 0-d input", [&] { conv(scalar_f(1), w, F(), {}); }, {"conv2d", "float32[]"}),
      expect<ShapeError>("conv2d 3-d weight", [&] { conv(x, F::ones({4, 2, 3}), F(), {}); }, {"conv2d", "weight", "[4, 2, 3]"}),
      expect<ShapeError>("conv2d input channels 3 against weight 2", [&] { conv(F::ones({1, 3, 5, 5}), w, F(), {}); },
                         {"conv2d", "[1, 3, 5, 5]", "[4, 2, 3, 3]", "groups=1"}),
      expect<ShapeError>("conv2d groups 3 do not divide", [&] { conv(x, w, F(), groups3); }, {"conv2d", "groups=3"}),
      expect<ValueError>("conv2d groups 0", [&] { conv(x, w, F(), groups0); }, {"conv2d", "groups 0"}),
      expect<ValueError>("conv2d negative stride", [&] { conv(x, w, F(), neg_stride); }, {"conv2d", "stride -1x1"}),
      expect<ValueError>("conv2d negative padding", [&] { conv(x, w, F(), neg_pad); }, {"conv2d", "padding 0x-2"}),
      expect<ValueError>("conv2d dilation 0", [&] { conv(x, w, F(), zero_dil); }, {"conv2d", "dilation 0x1"}),
      expect<ShapeError>("conv2d bias [3]", [&] { conv(x, w, F::ones({3}), {}); }, {"conv2d", "bias", "[3]", "[4]"}),
      expect<ShapeError>("conv2d bias [1, 4]", [&] { conv(x, w, F::ones({1, 4}), {}); }, {"conv2d", "bias", "[1, 4]"}),
      expect<ShapeError>("conv2d empty kernel", [&] { conv(x, F::ones({4, 2, 0, 3}), F(), {}); },
                         {"conv2d", "kernel", "empty", "[4, 2, 0, 3]"}),
      expect<ShapeError>("conv2d empty image", [&] { conv(F::ones({1, 2, 0, 5}), w, F(), {}); },
                         {"conv2d", "too small", "[1, 2, 0, 5]"}),
      expect<DTypeError>("conv2d int64", [&] { conv2d(I64::ones({1, 2, 5, 5}), I64::ones({4, 2, 3, 3})); },
                         {"conv2d", "int64"}),
      expect<DTypeError>("conv2d float64 bias", [&] { op::conv2d(x, w, D::ones({4})); }, {"conv2d", "float64"}),
      expect<ValueError>("conv2d undefined weight", [&] { op::conv2d(x, AnyTensor()); }, {"conv2d", "weight", "undefined"}),
      expect<ShapeError>("max_pool2d 3-d input", [&] { max_pool2d(F::ones({2, 4, 4})); }, {"max_pool2d", "[2, 4, 4]"}),
      expect<ShapeError>("avg_pool2d 5-d input", [&] { avg_pool2d(F::ones({1, 1, 1, 4, 4})); }, {"avg_pool2d", "[1, 1, 1, 4, 4]"}),
      expect<ValueError>("max_pool2d kernel 0x2", [&] { max_pool2d(x, k0); }, {"max_pool2d", "kernel", "0x2"}),
      expect<ValueError>("max_pool2d negative stride", [&] { max_pool2d(x, neg_pool_stride); },
                         {"max_pool2d", "stride", "-1x-1"}),
      expect<ValueError>("avg_pool2d negative stride", [&] { avg_pool2d(x, neg_pool_stride); }, {"avg_pool2d", "stride"}),
      expect<ValueError>("avg_pool2d padding over half the kernel", [&] { avg_pool2d(x, big_pad); },
                         {"avg_pool2d", "padding 2x0", "half"}),
      expect<ValueError>("max_pool2d negative padding", [&] { max_pool2d(x, neg_pool_pad); }, {"max_pool2d", "padding -1x0"}),
      expect<DTypeError>("max_pool2d int64", [&] { max_pool2d(I64::ones({1, 1, 4, 4})); }, {"max_pool2d", "int64"}),
      expect<ValueError>("adaptive_avg_pool2d output 0x2", [&] { adaptive_avg_pool2d(x, {0, 2}); },
                         {"adaptive_avg_pool2d", "output size", "0x2"}),
      expect<ShapeError>("adaptive_avg_pool2d 2-d input", [&] { adaptive_avg_pool2d(F::ones({4, 4}), {2, 2}); },
                         {"adaptive_avg_pool2d", "[4, 4]"}),
      expect<ShapeError>("adaptive_avg_pool2d empty image", [&] { adaptive_avg_pool2d(F::ones({1, 1, 0, 4}), {2, 2}); },
                         {"adaptive_avg_pool2d", "[1, 1, 0, 4]"}),
  });
  // Accepted: an empty batch (and no channels for pooling) gives an empty output of the right shape.
  CHECK(conv2d(F::zeros({0, 2, 5, 5}), w).shape() == Shape{0, 4, 3, 3});
  CHECK(conv2d(F::zeros({0, 2, 5, 5}), w, F::ones({4})).shape() == Shape{0, 4, 3, 3});
  CHECK(max_pool2d(F::zeros({0, 3, 4, 4})).shape() == Shape{0, 3, 2, 2});
  CHECK(avg_pool2d(F::zeros({2, 0, 4, 4})).shape() == Shape{2, 0, 2, 2});
  CHECK(adaptive_avg_pool2d(F::zeros({0, 3, 4, 4}), {1, 1}).shape() == Shape{0, 3, 1, 1});
  // No input channels: every output is the bias (PyTorch's conv2d gives zeros plus bias).
  auto c0 = conv2d(F::zeros({1, 0, 5, 5}), F::zeros({4, 0, 3, 3}), f({1, 2, 3, 4}, {4}));
  REQUIRE(c0.shape() == Shape{1, 4, 3, 3});
  CHECK(c0.to_vector()[0] == 1.0f);
  CHECK(c0.to_vector()[35] == 4.0f);
  // Stride 0 means "the kernel size", as torch's default.
  op::Pool2dOptions dflt;
  dflt.stride = {0, 0};
  CHECK(max_pool2d(F::ones({1, 1, 4, 4}), dflt).shape() == Shape{1, 1, 2, 2});
}

TEST_CASE("bad input: softmax and normalisation", "[bad_input]") {
  const F x = F::ones({2, 3});
  run_cases({
      expect<IndexError>("softmax dim 2", [&] { softmax(x, 2); }, {"softmax", "dimension 2", "rank 2"}),
      expect<IndexError>("log_softmax dim -3", [&] { log_softmax(x, -3); }, {"log_softmax", "dimension -3"}),
      expect<IndexError>("softmax of a 0-d tensor over dim 1", [&] { softmax(scalar_f(1), 1); },
                         {"softmax", "dimension 1"}),
      expect<IndexError>("log_softmax of a 0-d tensor over dim -2", [&] { log_softmax(scalar_f(1), -2); },
                         {"log_softmax", "dimension -2"}),
      expect<DTypeError>("log_softmax of int64", [&] { log_softmax(I64::ones({3})); }, {"log_softmax", "int64"}),
      expect<ShapeError>("layer_norm over 4 of [2, 3]", [&] { op::layer_norm(x, 4); }, {"layer_norm", "[2, 3]", "4"}),
      expect<ShapeError>("layer_norm over 0 elements", [&] { op::layer_norm(x, 0); }, {"layer_norm", "[2, 3]"}),
      expect<ShapeError>("layer_norm of a 0-d tensor", [&] { op::layer_norm(scalar_f(1), 1); }, {"layer_norm", "float32[]"}),
      expect<ShapeError>("layer_norm weight of 2 elements", [&] { op::layer_norm(x, 3, F::ones({2})); },
                         {"layer_norm", "weight", "[2]", "3 elements"}),
      expect<ShapeError>("layer_norm bias of 4 elements", [&] { op::layer_norm(x, 3, F::ones({3}), F::ones({4})); },
                         {"layer_norm", "bias", "[4]"}),
      expect<DTypeError>("layer_norm float64 weight", [&] { op::layer_norm(x, 3, D::ones({3})); },
                         {"layer_norm", "weight", "float64"}),
      expect<ValueError>("layer_norm eps -1", [&] { op::layer_norm(x, 3, {}, {}, -1.0); }, {"layer_norm", "eps", "-1"}),
      expect<ValueError>("rms_norm eps NaN", [&] { op::rms_norm(x, 3, {}, std::nan("")); }, {"rms_norm", "eps"}),
      expect<DTypeError>("rms_norm of int64", [&] { op::rms_norm(I64::ones({2, 3}), 3); }, {"rms_norm", "int64"}),
      expect<ShapeError>("functional layer_norm shape [2] of [2, 3]", [&] { nn::functional::layer_norm(x, {2}); },
                         {"layer_norm", "[2, 3]", "normalized_shape [2]"}),
      expect<ShapeError>("functional layer_norm shape [-1]", [&] { nn::functional::layer_norm(x, {-1}); },
                         {"layer_norm", "[2, 3]", "[-1]"}),
      expect<ValueError>("functional layer_norm empty shape", [&] { nn::functional::layer_norm(x, {}); },
                         {"layer_norm", "at least one dimension"}),
      expect<ShapeError>("functional rms_norm shape [2, 3, 1]", [&] { nn::functional::rms_norm(x, {2, 3, 1}); },
                         {"rms_norm", "[2, 3, 1]"}),
      expect<ShapeError>("functional rms_norm shape [0]", [&] { nn::functional::rms_norm(x, {0}); }, {"rms_norm", "[0]"}),
      expect<ValueError>("batch_norm fused op on an int64 input",
                         [&] { op::batch_norm_train(I64::ones({2, 3}), AnyTensor(), AnyTensor(), 1e-5); },
                         {"batch_norm", "int64[2, 3]"}),
      expect<ValueError>("batch_norm fused op weight [2] for 3 channels",
                         [&] { op::batch_norm_train(x, F::ones({2}), AnyTensor(), 1e-5); },
                         {"batch_norm", "weight float32[2]"}),
      expect<ValueError>("batch_norm fused op on a 1-d input",
                         [&] { op::batch_norm_train(F::ones({3}), AnyTensor(), AnyTensor(), 1e-5); },
                         {"batch_norm", "[N, C, ...]", "float32[3]"}),
      expect<ValueError>("batch_norm fused op on float16",
                         [&] { op::batch_norm_train(x.to<half>(), AnyTensor(), AnyTensor(), 1e-5); },
                         {"batch_norm", "cpu", "float16[2, 3]"}),
  });
  // Accepted: 0-d and empty inputs.
  CHECK(softmax(scalar_f(3), 0).item() == 1.0f);
  CHECK(log_softmax(scalar_f(3), -1).item() == 0.0f);
  CHECK(softmax(F::zeros({0, 3}), 1).shape() == Shape{0, 3});
  CHECK(softmax(F::zeros({3, 0}), 0).shape() == Shape{3, 0});
  CHECK(op::layer_norm(F::zeros({0, 4}), 4).shape() == Shape{0, 4});
  CHECK(nn::functional::rms_norm(F::zeros({0, 4}), {4}).shape() == Shape{0, 4});
}

TEST_CASE("bad input: losses", "[bad_input]") {
  namespace fn = nn::functional;
  const F logits = F::zeros({2, 3});
  const I64 t = idx({0, 2});
  nn::CrossEntropyOptions bad_w;
  bad_w.weight = F::ones({2});
  nn::CrossEntropyOptions int_w;
  int_w.weight = I64::ones({3});
  nn::CrossEntropyOptions smooth;
  smooth.label_smoothing = 1.5;
  nn::CrossEntropyOptions red;
  red.reduction = "avg";
  nn::NLLLossOptions nll_ign;
  nll_ign.ignore_index = 1;
  nn::BCEWithLogitsOptions pw;
  pw.pos_weight = F::ones({2});
  run_cases({
      expect<IndexError>("cross_entropy target 3 of 3 classes", [&] { fn::cross_entropy(logits, idx({0, 3})); },
                         {"cross_entropy", "target 3", "3 classes", "[2, 3]"}),
      expect<IndexError>("cross_entropy target -1 (ignore_index -100)", [&] { fn::cross_entropy(logits, idx({-1, 0})); },
                         {"cross_entropy", "target -1", "ignore_index -100"}),
      expect<IndexError>("cross_entropy int32 target 7", [&] { fn::cross_entropy(logits, Tensor<int32_t>::from_vector({7, 0})); },
                         {"cross_entropy", "target 7"}),
      expect<IndexError>("cross_entropy 1-d input, 0-d target 5", [&] { fn::cross_entropy(F::zeros({3}), I64::scalar(5)); },
                         {"cross_entropy", "target 5"}),
      expect<DTypeError>("cross_entropy float target", [&] { fn::cross_entropy(logits, F::zeros({2})); },
                         {"cross_entropy", "class indices", "float32[2]"}),
      expect<ShapeError>("cross_entropy target [3] for [2, 3]", [&] { fn::cross_entropy(logits, idx({0, 1, 2})); },
                         {"cross_entropy", "int64[3]", "[2, 3]", "expected target shape [2]"}),
      expect<ShapeError>("cross_entropy target [2, 1] for [2, 3]", [&] { fn::cross_entropy(logits, I64::zeros({2, 1})); },
                         {"cross_entropy", "[2, 1]"}),
      expect<ShapeError>("cross_entropy 0-d input", [&] { fn::cross_entropy(scalar_f(0), I64::scalar(0)); },
                         {"cross_entropy", "[C] or [N, C, ...]"}),
      expect<ShapeError>("cross_entropy no classes", [&] { fn::cross_entropy(F::zeros({2, 0}), idx({0, 0})); },
                         {"cross_entropy", "no classes"}),
      expect<ShapeError>("cross_entropy weight [2] for 3 classes", [&] { fn::cross_entropy(logits, t, bad_w); },
                         {"cross_entropy", "weight", "[2]", "[3]"}),
      expect<DTypeError>("cross_entropy int64 weight", [&] { fn::cross_entropy(logits, t, int_w); },
                         {"cross_entropy", "weight", "int64"}),
      expect<ValueError>("cross_entropy label_smoothing 1.5", [&] { fn::cross_entropy(logits, t, smooth); },
                         {"cross_entropy", "label_smoothing", "1.5"}),
      expect<ValueError>("cross_entropy reduction 'avg'", [&] { fn::cross_entropy(logits, t, red); },
                         {"cross_entropy", "'avg'"}),
      expect<IndexError>("nll_loss target 3", [&] { fn::nll_loss(logits, idx({3, 0})); }, {"nll_loss", "target 3"}),
      expect<IndexError>("nll_loss target -2 with ignore_index 1", [&] { fn::nll_loss(logits, idx({1, -2}), nll_ign); },
                         {"nll_loss", "target -2", "ignore_index 1"}),
      expect<ShapeError>("nll_loss [2, 3, 4] with target [2, 3]", [&] { fn::nll_loss(F::zeros({2, 3, 4}), I64::zeros({2, 3})); },
                         {"nll_loss", "[2, 3, 4]", "expected target shape [2, 4]"}),
      expect<DTypeError>("nll_loss uint8 target", [&] { fn::nll_loss(logits, Tensor<uint8_t>::zeros({2})); },
                         {"nll_loss", "uint8"}),
      expect<ShapeError>("nll_loss 0-d input", [&] { fn::nll_loss(scalar_f(0), I64::scalar(0)); }, {"nll_loss", "[C]"}),
      expect<DTypeError>("op::cross_entropy of int64 logits", [&] { op::cross_entropy(I64::zeros({2, 3}), t); },
                         {"cross_entropy", "floating", "int64[2, 3]"}),
      expect<ValueError>("op::cross_entropy label_smoothing -0.5", [&] { op::cross_entropy(logits, t, {}, -100, -0.5); },
                         {"cross_entropy", "label_smoothing", "-0.5"}),
      expect<ValueError>("op::nll_loss of an undefined input", [&] { op::nll_loss(AnyTensor(), t); },
                         {"nll_loss", "input", "undefined"}),
      expect<DTypeError>("op::nll_loss of a uint8 input", [&] { op::nll_loss(Tensor<uint8_t>::zeros({2, 3}), t); },
                         {"nll_loss", "uint8[2, 3]"}),
      expect<ShapeError>("op::nll_loss weight [2] for 3 classes", [&] { op::nll_loss(logits, t, F::ones({2})); },
                         {"nll_loss", "weight", "[2]", "[3]"}),
      expect<ShapeError>("mse_loss [2, 3] against [4]", [&] { fn::mse_loss(logits, F::zeros({4})); },
                         {"mse_loss", "[2, 3] (input)", "[4] (target)"}),
      expect<DTypeError>("mse_loss int64 target", [&] { fn::mse_loss(logits, I64::zeros({2, 3})); }, {"mse_loss", "int64"}),
      expect<ValueError>("mse_loss reduction 'max'", [&] { fn::mse_loss(logits, logits, "max"); }, {"mse_loss", "'max'"}),
      expect<ValueError>("l1_loss undefined target", [&] { fn::l1_loss(logits, AnyTensor()); }, {"l1_loss", "target"}),
      expect<ValueError>("smooth_l1_loss beta -1", [&] { fn::smooth_l1_loss(logits, logits, "mean", -1.0); },
                         {"smooth_l1_loss", "beta", "-1"}),
      expect<ShapeError>("bce target of another shape", [&] { fn::binary_cross_entropy_with_logits(logits, F::zeros({3})); },
                         {"binary_cross_entropy_with_logits", "[3]", "[2, 3]"}),
      expect<ShapeError>("bce pos_weight [2] for [2, 3]", [&] { fn::binary_cross_entropy_with_logits(logits, logits, pw); },
                         {"binary_cross_entropy_with_logits", "pos_weight", "[2]"}),
      expect<DTypeError>("bce int64 target", [&] { fn::binary_cross_entropy_with_logits(logits, I64::zeros({2, 3})); },
                         {"binary_cross_entropy_with_logits", "int64"}),
      expect<ValueError>("CrossEntropyLoss label_smoothing -0.1", [&] { nn::CrossEntropyLoss({.label_smoothing = -0.1}); },
                         {"CrossEntropyLoss", "label_smoothing"}),
      expect<ValueError>("MSELoss reduction 'mean '", [&] { nn::MSELoss("mean "); }, {"MSELoss", "'mean '"}),
  });
  // Accepted: a [C] input with a 0-d target (log 3 for uniform logits), empty batches.
  CHECK(fn::cross_entropy(F::zeros({3}), I64::scalar(1)).item() == Approx(std::log(3.0)));
  CHECK(fn::nll_loss(f({-1, -2, -3}, {3}), I64::scalar(2)).item() == 3.0f);
  CHECK(std::isnan(fn::cross_entropy(F::zeros({0, 3}), I64::zeros({0})).item()));  // 0/0, as PyTorch
  CHECK(fn::cross_entropy(F::zeros({0, 3}), I64::zeros({0}), {.reduction = "sum"}).item() == 0.0f);
  CHECK(fn::nll_loss(F::zeros({0, 3}), I64::zeros({0}), {.reduction = "none"}).shape() == Shape{0});
  CHECK(std::isnan(fn::mse_loss(F::zeros({0}), F::zeros({0})).item()));  // the mean of nothing
  CHECK(fn::l1_loss(F::zeros({0}), F::zeros({0}), "sum").item() == 0.0f);
}

TEST_CASE("bad input: nn layers' forward", "[bad_input]") {
  nn::Linear lin(4, 3);
  nn::Conv2d conv(2, 4, 3);
  nn::Embedding emb(5, 2);
  nn::LayerNorm ln(std::vector<int64_t>{3, 4});
  nn::RMSNorm rms(4);
  nn::BatchNorm1d bn1(3);
  nn::BatchNorm2d bn2(3);
  nn::MultiheadAttention mha(4, 2);
  nn::MaxPool2d pool(2);
  const F q = F::ones({2, 5, 4});
  run_cases({
      expect<ShapeError>("Linear(4, 3) on [2, 5]", [&] { lin(F::ones({2, 5})); }, {"Linear(4, 3)", "[2, 5]", "4 features"}),
      expect<ShapeError>("Linear(4, 3) on a 0-d tensor", [&] { lin(scalar_f(1)); }, {"Linear(4, 3)", "float32[]"}),
      expect<ShapeError>("Linear(4, 3) on [4, 0]", [&] { lin(F::ones({4, 0})); }, {"Linear(4, 3)", "[4, 0]"}),
      expect<ValueError>("Linear(0, 3)", [&] { nn::Linear(0, 3); }, {"Linear", "positive", "0 -> 3"}),
      expect<ShapeError>("Conv2d(2, 4) on 3 channels", [&] { conv(F::ones({1, 3, 5, 5})); }, {"conv2d", "[1, 3, 5, 5]"}),
      expect<ShapeError>("Conv2d on an unbatched [2, 5, 5]", [&] { conv(F::ones({2, 5, 5})); }, {"conv2d", "[2, 5, 5]"}),
      expect<ShapeError>("Conv2d on a 2x2 image", [&] { conv(F::ones({1, 2, 2, 2})); }, {"conv2d", "too small"}),
      expect<ValueError>("Conv2d groups 3 for 2 channels", [&] { nn::Conv2d(2, 4, 3, {.groups = 3}); },
                         {"Conv2d", "groups 3"}),
      expect<IndexError>("Embedding(5, 2) id 5", [&] { emb(idx({0, 5})); }, {"embedding", "index 5", "size 5"}),
      expect<IndexError>("Embedding(5, 2) id -1", [&] { emb(idx({-1})); }, {"embedding", "index -1"}),
      expect<DTypeError>("Embedding float ids", [&] { emb(F::zeros({2})); }, {"Embedding", "int64 or int32", "float32"}),
      expect<ValueError>("Embedding(5, 0)", [&] { nn::Embedding(5, 0); }, {"Embedding", "5 x 0"}),
      // Absurd sizes: refused before anything is allocated, naming the layer.
      expect<ShapeError>("Linear(2^40, 2^40)", [&] { nn::Linear(int64_t{1} << 40, int64_t{1} << 40); },
                         {"Linear", "[1099511627776, 1099511627776]"}),
      expect<OutOfMemory>("Embedding(2^31, 2^31)", [&] { nn::Embedding(int64_t{1} << 31, int64_t{1} << 31); },
                          {"Embedding", "4611686018427387904 elements"}),
      expect<ShapeError>("Conv2d(2^32, 2^32, 3)", [&] { nn::Conv2d(int64_t{1} << 32, int64_t{1} << 32, 3); },
                         {"Conv2d", "4294967296"}),
      expect<ShapeError>("LayerNorm([3, 4]) on [2, 4, 3]", [&] { ln(F::ones({2, 4, 3})); },
                         {"layer_norm", "[2, 4, 3]", "[3, 4]"}),
      expect<ShapeError>("LayerNorm([3, 4]) on [4]", [&] { ln(F::ones({4})); }, {"layer_norm", "[4]"}),
      expect<ValueError>("LayerNorm([2, -1])", [&] { nn::LayerNorm(std::vector<int64_t>{2, -1}); },
                         {"LayerNorm", "[2, -1]", "positive"}),
      expect<ValueError>("RMSNorm(0)", [&] { nn::RMSNorm(0); }, {"RMSNorm", "[0]"}),
      expect<ShapeError>("RMSNorm(4) on [4, 3]", [&] { rms(F::ones({4, 3})); }, {"rms_norm", "[4, 3]"}),
      expect<ShapeError>("BatchNorm1d(3) on [2, 4]", [&] { bn1(F::ones({2, 4})); },
                         {"BatchNorm1d(3)", "[2, 4]", "4 channels"}),
      expect<ShapeError>("BatchNorm1d(3) on [2, 3, 4, 5]", [&] { bn1(F::ones({2, 3, 4, 5})); }, {"BatchNorm1d(3)", "2-D"}),
      expect<ShapeError>("BatchNorm1d(3) on [3]", [&] { bn1(F::ones({3})); }, {"BatchNorm1d(3)", "[3]"}),
      expect<ShapeError>("BatchNorm2d(3) on [2, 3, 4]", [&] { bn2(F::ones({2, 3, 4})); }, {"BatchNorm2d(3)", "4-D"}),
      expect<ValueError>("BatchNorm2d(3) training on one value per channel", [&] { bn2(F::ones({1, 3, 1, 1})); },
                         {"BatchNorm2d", "more than 1 value per channel", "[1, 3, 1, 1]"}),
      expect<ValueError>("BatchNorm1d(0)", [&] { nn::BatchNorm1d(0); }, {"BatchNorm1d", "num_features"}),
      expect<ShapeError>("MaxPool2d on a 1x1 image", [&] { pool(F::ones({1, 1, 1, 1})); }, {"max_pool2d", "[1, 1, 1, 1]"}),
      expect<ShapeError>("MultiheadAttention(4, 2) on embed 3", [&] { mha(F::ones({2, 5, 3})); },
                         {"MultiheadAttention(4, 2)", "[2, 5, 3]", "embed_dim 4"}),
      expect<ShapeError>("MultiheadAttention on a 4-d query", [&] { mha(F::ones({1, 2, 5, 4})); },
                         {"MultiheadAttention", "3-D", "[1, 2, 5, 4]"}),
      expect<ShapeError>("MultiheadAttention on a 1-d query", [&] { mha(F::ones({4})); }, {"MultiheadAttention", "[4]"}),
      expect<ShapeError>("MultiheadAttention key of rank 2, query of rank 3", [&] { mha.forward(q, F::ones({5, 4}), F::ones({5, 4})); },
                         {"MultiheadAttention", "[5, 4]"}),
      expect<ShapeError>("MultiheadAttention batch 2 against 3", [&] { mha.forward(q, F::ones({3, 5, 4}), F::ones({3, 5, 4})); },
                         {"MultiheadAttention", "batch sizes differ", "[3, 5, 4]"}),
      expect<ShapeError>("MultiheadAttention key 6 against value 5", [&] { mha.forward(q, F::ones({2, 6, 4}), q); },
                         {"MultiheadAttention", "sequence length", "[2, 6, 4]"}),
      expect<ShapeError>("MultiheadAttention attn_mask [5, 4]", [&] { mha.forward(q, nn::AttentionMask{.attn_mask = F::zeros({5, 4})}); },
                         {"MultiheadAttention", "attn_mask", "[5, 4]", "[5, 5]"}),
      expect<ShapeError>("MultiheadAttention attn_mask [3, 5, 5]",
                         [&] { mha.forward(q, nn::AttentionMask{.attn_mask = F::zeros({3, 5, 5})}); },
                         {"MultiheadAttention", "attn_mask", "[4, 5, 5]"}),
      expect<ShapeError>("MultiheadAttention key_padding_mask [5, 2]",
                         [&] { mha.forward(q, nn::AttentionMask{.key_padding_mask = Tensor<uint8_t>::zeros({5, 2})}); },
                         {"MultiheadAttention", "key_padding_mask", "[5, 2]", "[2, 5]"}),
      expect<DTypeError>("MultiheadAttention int64 attn_mask", [&] { mha.forward(q, nn::AttentionMask{.attn_mask = I64::zeros({5, 5})}); },
                         {"MultiheadAttention", "mask", "int64"}),
      expect<ValueError>("MultiheadAttention(6, 4)", [&] { nn::MultiheadAttention(6, 4); },
                         {"MultiheadAttention", "embed_dim 6", "num_heads 4"}),
  });
  // Accepted: empty batches pass through every layer with the right output shape.
  CHECK(lin(F::zeros({0, 4})).shape() == Shape{0, 3});
  CHECK(lin(F::ones({4})).shape() == Shape{3});
  CHECK(conv(F::zeros({0, 2, 5, 5})).shape() == Shape{0, 4, 3, 3});
  CHECK(emb(I64::zeros({0})).shape() == Shape{0, 2});
  CHECK(ln(F::zeros({0, 3, 4})).shape() == Shape{0, 3, 4});
  CHECK(mha(F::ones({5, 4})).shape() == Shape{5, 4});  // unbatched [L, E]
  CHECK(mha(F::ones({2, 0, 4})).shape() == Shape{2, 0, 4});  // no positions: an empty output
  // BatchNorm of an empty batch: an empty output and unchanged running statistics, as PyTorch.
  auto before = bn1.running_mean.to_double_vector();
  CHECK(bn1(F::zeros({0, 3})).shape() == Shape{0, 3});
  CHECK(bn1.running_mean.to_double_vector() == before);
  CHECK(bn1.num_batches_tracked.item_double() == 0.0);
  // In eval mode, one value per channel is fine (the running statistics are used).
  bn2.eval();
  CHECK(bn2(F::ones({1, 3, 1, 1})).shape() == Shape{1, 3, 1, 1});
}

TEST_CASE("bad input: optimizers given mismatched state or gradients", "[bad_input]") {
  auto p = F::ones({2, 3});
  p.set_requires_grad(true);
  auto q = F::ones({4});
  q.set_requires_grad(true);
  optim::SGD sgd({p, q}, {.lr = 0.1, .momentum = 0.9});
  optim::Adam adam({p, q});
  optim::RMSprop rmsprop({p});
  // A state dict of the same optimizer over other parameters.
  auto other = F::ones({3, 2});
  other.set_requires_grad(true);
  optim::SGD sgd_other({other, q}, {.lr = 0.1, .momentum = 0.9});
  other.set_grad(F::ones({3, 2}));
  q.set_grad(F::ones({4}));
  sgd_other.step();
  const auto other_sd = sgd_other.state_dict();
  optim::SGD sgd_one({q}, {.lr = 0.1});
  auto sd_dup = sgd.state_dict();
  sd_dup.param_groups[0].params = {0, 0};
  auto sd_stray = sgd.state_dict();
  sd_stray.state[7] = optim::ParamState{{"momentum_buffer", F::zeros({2, 3})}};
  auto sd_step = adam.state_dict();
  sd_step.state[0] = optim::ParamState{{"step", F::zeros({2})}};
  run_cases({
      expect<ShapeError>("SGD.load_state_dict with a [3, 2] momentum buffer for a [2, 3] parameter",
                         [&] { sgd.load_state_dict(other_sd); }, {"SGD.load_state_dict", "momentum_buffer", "[3, 2]", "[2, 3]"}),
      expect<ValueError>("SGD.load_state_dict with 1 parameter for 2", [&] { sgd.load_state_dict(sgd_one.state_dict()); },
                         {"SGD.load_state_dict", "1 parameter", "2"}),
      expect<ValueError>("Adam.load_state_dict of an SGD state dict", [&] { adam.load_state_dict(sgd.state_dict()); },
                         {"Adam.load_state_dict", "beta1"}),
      expect<ValueError>("SGD.load_state_dict with a repeated parameter index", [&] { sgd.load_state_dict(sd_dup); },
                         {"SGD.load_state_dict", "more than once"}),
      expect<ValueError>("SGD.load_state_dict with state for index 7", [&] { sgd.load_state_dict(sd_stray); },
                         {"SGD.load_state_dict", "index 7"}),
      expect<ShapeError>("Adam.load_state_dict with a 2-element step", [&] { adam.load_state_dict(sd_step); },
                         {"Adam.load_state_dict", "step", "[2]"}),
      expect<ValueError>("SGD hyperparameter 'lrr'", [&] { sgd.param_groups()[0]["lrr"] = 1.0; }, {"lrr", "lr"}),
      expect<ValueError>("Adam beta1 1.0", [&] { optim::Adam({p}, {.beta1 = 1.0}); }, {"Adam", "beta1=1"}),
      expect<ValueError>("SGD negative lr", [&] { optim::SGD({p}, {.lr = -1.0}); }, {"SGD", "lr=-1"}),
      expect<ValueError>("SGD of no parameters", [&] { optim::SGD(std::vector<AnyTensor>{}); }, {"SGD", "empty parameter list"}),
      expect<ValueError>("SGD of an undefined parameter", [&] { optim::SGD({AnyTensor()}); }, {"SGD", "undefined"}),
      expect<DTypeError>("SGD of an int64 parameter", [&] { optim::SGD({I64::ones({2})}); }, {"SGD", "int64"}),
      expect<ValueError>("SGD with a parameter twice", [&] { optim::SGD({p, p}); }, {"SGD", "more than once"}),
      // A gradient of another shape than its parameter (set by hand) is refused by step(), naming
      // the optimizer and both shapes: it used to broadcast ([1] into [2, 3]) silently, or fail in add.
      expect<ShapeError>("SGD.step with a [1] gradient for a [2, 3] parameter",
                         [&] { p.set_grad(F::ones({1})); sgd.step(); }, {"SGD", "gradient", "[1]", "[2, 3]"}),
      expect<ShapeError>("Adam.step with a [3, 2] gradient", [&] { p.set_grad(F::ones({3, 2})); adam.step(); },
                         {"Adam", "gradient", "[3, 2]", "[2, 3]"}),
      expect<ShapeError>("RMSprop.step with a [2, 3, 1] gradient", [&] { p.set_grad(F::ones({2, 3, 1})); rmsprop.step(); },
                         {"RMSprop", "gradient", "[2, 3, 1]"}),
      expect<DTypeError>("SGD.step with an int64 gradient", [&] { p.set_grad(I64::ones({2, 3})); sgd.step(); },
                         {"SGD", "gradient", "int64"}),
  });
  // Nothing was changed by the refused steps.
  CHECK(p.to_vector() == std::vector<float>(6, 1.0f));
  // The right gradient steps.
  p.set_grad(F::ones({2, 3}));
  q.zero_grad();
  sgd.step();
  CHECK(p.to_vector() == std::vector<float>(6, 0.9f));
}

TEST_CASE("bad input: operands on different devices", "[bad_input][device]") {
  testing::PretendGpu pretend;  // cuda:0 made of CPU kernels where there is no GPU
  const Device gpu = Device::cuda(0);
  const F x = F::ones({2, 3});
  const F xg = F::ones({2, 3}, gpu);
  const F img = F::ones({1, 2, 5, 5});
  const F w = F::ones({4, 2, 3, 3});
  const F wg = F::ones({4, 2, 3, 3}, gpu);
  nn::MultiheadAttention mha(4, 2);
  nn::Linear lin(3, 2);
  nn::BatchNorm1d bn(3);
  auto p = F::ones({2});
  p.set_requires_grad(true);
  optim::SGD sgd({p});
  nn::CrossEntropyOptions wopt;
  wopt.weight = F::ones({3}, gpu);
  run_cases({
      expect<DeviceError>("sub cpu - cuda:0", [&] { sub(x, xg); }, {"sub", "on cpu", "on cuda:0"}),
      expect<DeviceError>("maximum cpu cuda:0", [&] { maximum(x, xg); }, {"maximum", "cuda:0"}),
      expect<DeviceError>("lt cpu cuda:0", [&] { lt(x, xg); }, {"lt", "cuda:0"}),
      expect<DeviceError>("where cpu condition, cuda:0 values", [&] { where(Tensor<uint8_t>::ones({2, 3}), xg, xg); },
                          {"where", "uint8[2, 3] on cpu", "cuda:0"}),
      expect<DeviceError>("concat cpu and cuda:0", [&] { concat(std::vector<F>{x, xg}); }, {"concat", "cuda:0"}),
      expect<DeviceError>("gather cuda:0 index", [&] { gather(x, 1, I64::zeros({2, 1}, gpu)); }, {"gather", "cuda:0"}),
      expect<DeviceError>("embedding cuda:0 ids", [&] { embedding(x, I64::zeros({1}, gpu)); }, {"embedding", "cuda:0"}),
      expect<DeviceError>("conv2d cuda:0 weight", [&] { conv2d(img, wg); }, {"conv2d", "cuda:0"}),
      expect<DeviceError>("conv2d cuda:0 bias", [&] { conv2d(img, w, F::ones({4}, gpu)); }, {"conv2d", "[4] on cuda:0"}),
      expect<DeviceError>("layer_norm cuda:0 weight", [&] { op::layer_norm(x, 3, F::ones({3}, gpu)); },
                          {"layer_norm", "weight", "cuda:0", "input's device cpu"}),
      expect<DeviceError>("matmul cpu x cuda:0", [&] { matmul(x, F::ones({3, 2}, gpu)); }, {"matmul", "cuda:0"}),
      expect<DeviceError>("cross_entropy cuda:0 target", [&] { nn::functional::cross_entropy(x, I64::zeros({2}, gpu)); },
                          {"cross_entropy", "cuda:0"}),
      expect<DeviceError>("cross_entropy cuda:0 class weight", [&] { nn::functional::cross_entropy(x, I64::zeros({2}), wopt); },
                          {"cross_entropy", "cuda:0"}),
      expect<DeviceError>("op::nll_loss cuda:0 target", [&] { op::nll_loss(x, I64::zeros({2}, gpu)); },
                          {"nll_loss", "int64[2] on cuda:0"}),
      expect<DeviceError>("op::nll_loss cuda:0 class weight", [&] { op::nll_loss(x, I64::zeros({2}), F::ones({3}, gpu)); },
                          {"nll_loss", "float32[3] on cuda:0"}),
      expect<ValueError>("batch_norm fused op with a cuda:0 weight",
                         [&] { op::batch_norm_train(x, F::ones({3}, gpu), AnyTensor(), 1e-5); },
                         {"batch_norm", "weight float32[3] on cuda:0"}),
      expect<DeviceError>("mse_loss cuda:0 target", [&] { nn::functional::mse_loss(x, xg); }, {"mse_loss", "cuda:0"}),
      expect<DeviceError>("Linear on cpu given a cuda:0 input", [&] { lin(xg); }, {"linear", "cuda:0", "on cpu"}),
      expect<DeviceError>("MultiheadAttention cuda:0 key", [&] { mha.forward(F::ones({1, 2, 4}), F::ones({1, 2, 4}, gpu),
                                                                            F::ones({1, 2, 4})); },
                          {"MultiheadAttention", "cuda:0"}),
      expect<DeviceError>("MultiheadAttention cuda:0 attn_mask",
                          [&] { mha.forward(F::ones({1, 2, 4}), nn::AttentionMask{.attn_mask = F::zeros({2, 2}, gpu)}); },
                          {"MultiheadAttention", "cuda:0"}),
      expect<DeviceError>("BatchNorm1d on cpu given a cuda:0 input", [&] { bn(F::ones({4, 3}, gpu)); },
                          {"BatchNorm1d(3)", "cuda:0", "on cpu"}),
      expect<DeviceError>("SGD.step with a cuda:0 gradient for a cpu parameter",
                          [&] { p.set_grad(F::ones({2}, gpu)); sgd.step(); }, {"SGD.step", "cuda:0", "on cpu"}),
  });
  CHECK(p.to_vector() == std::vector<float>{1, 1});
  // Moving the operand fixes it.
  CHECK(sub(x, xg.to(Device::cpu())).to_vector() == std::vector<float>(6, 0.0f));
}

TEST_CASE("bad input: layer, scheduler and clipping options", "[bad_input]") {
  auto p = F::ones({2});
  p.set_requires_grad(true);
  optim::SGD sgd({p}, {.lr = 0.1});
  run_cases({
      expect<ValueError>("Dropout(1.5)", [&] { nn::Dropout(1.5); }, {"Dropout", "between 0 and 1", "1.5"}),
      expect<ValueError>("dropout p -0.5", [&] { nn::functional::dropout(F::ones({2}), -0.5); }, {"dropout", "-0.5"}),
      expect<ValueError>("GELU('fast')", [&] { nn::GELU("fast"); }, {"GELU", "'fast'"}),
      expect<ValueError>("MultiheadAttention dropout 2", [&] { nn::MultiheadAttention(4, 2, {.dropout = 2.0}); },
                         {"MultiheadAttention", "2"}),
      expect<ValueError>("BatchNorm2d momentum 1.5", [&] { nn::BatchNorm2d(3, {.momentum = 1.5}); },
                         {"BatchNorm2d", "momentum", "1.5"}),
      expect<ValueError>("BatchNorm1d eps -1", [&] { nn::BatchNorm1d(3, {.eps = -1.0}); }, {"BatchNorm1d", "eps"}),
      expect<ValueError>("TransformerBlock hidden_dim -1", [&] { nn::TransformerBlock(4, 2, {.hidden_dim = -1}); },
                         {"TransformerBlock", "hidden_dim", "-1"}),
      expect<ShapeError>("TransformerBlock(4, 2) on embed 5", [&] { nn::TransformerBlock(4, 2)(F::ones({1, 3, 5})); },
                         {"layer_norm", "[1, 3, 5]", "[4]"}),
      expect<ShapeError>("TransformerBlock(4, 2) on a 4-d input", [&] { nn::TransformerBlock(4, 2)(F::ones({1, 1, 3, 4})); },
                         {"MultiheadAttention", "[1, 1, 3, 4]"}),
      expect<ValueError>("SmoothL1Loss beta -2", [&] { nn::SmoothL1Loss("mean", -2.0); }, {"SmoothL1Loss", "beta", "-2"}),
      expect<ValueError>("StepLR step_size 0", [&] { optim::StepLR(sgd, 0); }, {"StepLR", "step_size", "0"}),
      expect<ValueError>("CosineAnnealingLR T_max 0", [&] { optim::CosineAnnealingLR(sgd, 0); }, {"CosineAnnealingLR", "T_max"}),
      expect<ValueError>("WarmupCosineLR total below warmup",
                         [&] { optim::WarmupCosineLR(sgd, {.warmup_steps = 10, .total_steps = 5}); },
                         {"WarmupCosineLR", "total_steps", "5"}),
      expect<ValueError>("clip_grad_norm_ max_norm -1", [&] { optim::clip_grad_norm_({p}, -1.0); },
                         {"clip_grad_norm_", "max_norm", "-1"}),
      expect<ValueError>("clip_grad_norm_ norm_type 0", [&] { optim::clip_grad_norm_({p}, 1.0, 0.0); },
                         {"clip_grad_norm_", "norm_type", "0"}),
      expect<ValueError>("clip_grad_value_ -1", [&] { optim::clip_grad_value_({p}, -1.0); }, {"clip_grad_value_", "-1"}),
  });
  // An unbatched [L, E] input goes through a block, as through MultiheadAttention.
  CHECK(nn::TransformerBlock(4, 2)(F::ones({3, 4})).shape() == Shape{3, 4});
  // A parameter without a gradient is skipped: clipping returns 0 and changes nothing.
  CHECK(optim::clip_grad_norm_({p}, 1.0) == 0.0);
  CHECK(p.to_vector() == std::vector<float>{1, 1});
}

TEST_CASE("bad input: tensor basics and autograd entry points", "[bad_input]") {
  const F x = F::ones({2, 3});
  auto leaf = F::ones({3});
  leaf.set_requires_grad(true);
  run_cases({
      expect<ShapeError>("item() of [2]", [&] { F::ones({2}).item(); }, {"item()", "[2]"}),
      expect<ShapeError>("item() of an empty tensor", [&] { F::zeros({0}).item(); }, {"item()", "[0]"}),
      expect<ShapeError>("copy_ [3] into [2, 3]", [&] { F::zeros({2, 3}).copy_(F::ones({3})); },
                         {"copy_", "[3]", "[2, 3]"}),
      expect<ShapeError>("from_vector 3 values for [2, 2]", [&] { F::from_vector({1, 2, 3}, Shape{2, 2}); },
                         {"from_vector", "3", "[2, 2]"}),
      expect<ValueError>("arange step 0", [&] { F::arange(0, 5, 0); }, {"arange", "step"}),
      expect<ShapeError>("zeros with a negative dimension", [&] { F::zeros({2, -1}); }, {"negative dimension -1"}),
      expect<ShapeError>("zeros of 9 dimensions", [&] { F::zeros({1, 1, 1, 1, 1, 1, 1, 1, 1}); },
                         {"more than 8 dimensions"}),
      expect<DTypeError>("Tensor<double> of a float32 tensor", [&] { D{AnyTensor(x)}; }, {"Tensor<float64>", "float32"}),
      expect<DTypeError>("set_requires_grad on int64", [&] { I64::ones({2}).set_requires_grad(true); },
                         {"set_requires_grad", "int64"}),
      expect<AutogradError>("set_requires_grad on a non-leaf", [&] { (leaf * 2.0).set_requires_grad(true); },
                            {"set_requires_grad", "leaf"}),
      expect<AutogradError>("backward of a non-scalar", [&] { (leaf * 2.0).backward(); }, {"backward", "non-scalar", "[3]"}),
      expect<AutogradError>("backward of a tensor that needs no grad", [&] { sum(x).backward(); },
                            {"backward", "does not require grad"}),
      expect<ShapeError>("backward with a [2] gradient for [3]", [&] { (leaf * 2.0).backward(F::ones({2})); },
                         {"backward", "gradient", "[2]", "[3]"}),
      expect<ShapeError>("backward with a float64 gradient for float32", [&] { (leaf * 2.0).backward(D::ones({3})); },
                         {"backward", "float64[3]", "float32[3]"}),
      expect<ValueError>("shape() of an undefined tensor", [&] { AnyTensor().shape(); }, {"undefined tensor"}),
      expect<ValueError>("reshape of an undefined tensor", [&] { AnyTensor().reshape({2}); }, {"reshape", "undefined"}),
      expect<ValueError>("reshape(Shape) of an undefined tensor", [&] { AnyTensor().reshape(Shape{2}); },
                         {"reshape", "undefined"}),
      expect<ValueError>("slice of an undefined tensor", [&] { AnyTensor().slice(0, 1); }, {"slice", "undefined"}),
      expect<ValueError>("select of an undefined tensor", [&] { AnyTensor().select(0); }, {"select", "undefined"}),
      expect<ValueError>("clone of an undefined tensor", [&] { AnyTensor().clone(); }, {"clone", "undefined"}),
      expect<ValueError>("to(device) of an undefined tensor", [&] { AnyTensor().to(Device::cpu()); },
                         {"to(device)", "undefined"}),
      expect<ValueError>("to(dtype) of an undefined tensor", [&] { AnyTensor().to(DType::Float64); },
                         {"to(dtype)", "undefined"}),
      expect<ValueError>("copy_ from an undefined tensor", [&] { F::zeros({2}).copy_(AnyTensor()); },
                         {"copy_ (source)", "undefined"}),
  });
  // Accepted: one-element tensors of any rank give item(); backward from a 0-d result.
  CHECK(scalar_f(7).item() == 7.0f);
  CHECK(F::full({1, 1, 1}, 3.0).item() == 3.0f);
  sum(leaf * 2.0).backward();
  CHECK(leaf.grad().to_vector() == std::vector<float>{2, 2, 2});
  auto e = D::zeros({0});
  e.set_requires_grad(true);
  sum(e).backward();  // a sum of nothing is 0 and its gradient is empty
  CHECK(e.grad().shape() == Shape{0});
}
