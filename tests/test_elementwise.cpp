// Elementwise ops (ops/elementwise.hpp) and comparisons / where (ops/compare.hpp): forward values
// against plain-loop references, fp16/bf16 against fp32, gradients at ties and edges, what PyTorch
// accepts, and negative controls that prove the gradient check can fail. Each op's gradient check,
// CPU/CUDA parity, bad inputs and NaN semantics come from the registry (tests/op_cases.hpp).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <ember/ember.hpp>

#include "gradcheck.hpp"
#include "test_util.hpp"

using namespace ember;
using ember::testing::gradcheck;
using ember::testing::random_inputs;
using namespace ember::testing;

namespace {



// Flat index into a tensor of shape `in` read at flat output index `o` of shape `out` (NumPy rules).
int64_t bcast_index(const Shape& out, const Shape& in, int64_t o) {
  int64_t idx = 0, stride = 1;
  for (int d = out.dim() - 1; d >= 0; --d) {
    const int64_t i = o % out[d];
    o /= out[d];
    const int j = d - (out.dim() - in.dim());
    if (j >= 0) {
      if (in[j] != 1) idx += i * stride;
      stride *= in[j];
    }
  }
  return idx;
}

Shape bcast_shape(const Shape& a, const Shape& b) {
  const int n = std::max(a.dim(), b.dim());
  std::vector<int64_t> s(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int ia = a.dim() - n + i, ib = b.dim() - n + i;
    const int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    s[static_cast<size_t>(i)] = da == 1 ? db : da;
  }
  return Shape(s);
}

// Moves every element of a double tensor at least `margin` away from each point (kinks of abs,
// relu, clamp; the pole of reciprocal).
void push_away(const AnyTensor& x, std::vector<double> points, double margin) {
  double* p = static_cast<double*>(x.data_ptr());
  for (int64_t i = 0; i < x.numel(); ++i)
    for (double c : points)
      if (std::fabs(p[i] - c) < margin) p[i] = c + (p[i] >= c ? margin : -margin);
}

void check_grad(const ember::testing::GradFn& f, const std::vector<AnyTensor>& inputs) {
  CHECK_GRADIENTS(f, inputs);
}

using UFn = std::function<AnyTensor(const AnyTensor&)>;

const std::vector<std::pair<Shape, Shape>>& broadcast_cases() {
  static const std::vector<std::pair<Shape, Shape>> cases = {
      {Shape{3, 1, 4}, Shape{2, 4}}, {Shape{}, Shape{2, 3}}, {Shape{2, 3}, Shape{}},
      {Shape{2, 3}, Shape{2, 3}},    {Shape{4, 1}, Shape{1, 5}}, {Shape{2, 1, 3}, Shape{2, 4, 1}},
      {Shape{2, 1, 3, 1, 2}, Shape{4, 1}},
  };
  return cases;
}

}  // namespace

// ================================================================ gradients: ties, edges, composites

TEST_CASE("maximum and minimum float64 ties split the gradient evenly", "[elementwise][grad]") {
  AnyTensor a = dt({1, 2, 3}, {3}), b = dt({1, 5, 0}, {3});
  a.set_requires_grad();
  b.set_requires_grad();
  op::sum(op::add(op::maximum(a, b), op::mul(op::minimum(a, b), 10.0))).backward();
  // maximum: tie -> 0.5 each, b wins, a wins; minimum (x10): tie -> 5 each, a wins, b wins.
  check_close(vals(a.grad()), {0.5 + 5, 10, 1}, 0, 1e-12);
  check_close(vals(b.grad()), {0.5 + 5, 1, 10}, 0, 1e-12);
}

TEST_CASE("pow float64 tensor^tensor gradients at base 0 are finite (d/db 0^b = 0 for b > 0)", "[elementwise][grad]") {
  AnyTensor a = dt({0, 2, 0}, {3}), b = dt({2, 3, 0.5}, {3});
  a.set_requires_grad();
  b.set_requires_grad();
  AnyTensor y = op::pow(a, b);
  check_close(vals(y), {0, 8, 0}, 0);
  op::sum(y).backward();
  check_close(vals(b.grad()), {0, 8 * std::log(2.0), 0}, 1e-15);
  std::vector<double> ga = vals(a.grad());
  CHECK(ga[0] == 0);
  CHECK(ga[1] == 12);
  CHECK(std::isinf(ga[2]));  // d/da a^0.5 at 0 is +inf, as in PyTorch
}

TEST_CASE("composite float64 gradcheck: an input used several times (x*y + exp(x) - x/y)", "[elementwise][grad]") {
  auto seed = GENERATE(1u, 2u, 3u);
  AnyTensor x = rand1({2, 3}, seed), y = rand1({3}, seed + 9, 0.5, 1.5);
  check_grad(
      [](const std::vector<AnyTensor>& in) {
        return op::sub(op::add(op::mul(in[0], in[1]), op::exp(in[0])), op::div(in[0], in[1]));
      },
      {x, y});
}

TEST_CASE("where float64 gradient values: mask to a, complement to b", "[elementwise][compare][grad]") {
  AnyTensor cond = Tensor<uint8_t>::from_vector({1, 0, 1}, {3});
  AnyTensor a = dt({1, 2, 3, 4, 5, 6}, {2, 3}), b = dt({7}, {});
  a.set_requires_grad();
  b.set_requires_grad();
  AnyTensor y = op::where(cond, a, b);
  check_close(vals(y), {1, 7, 3, 4, 7, 6}, 0);
  op::sum(y).backward();
  check_close(vals(a.grad()), {1, 0, 1, 1, 0, 1}, 0);
  check_close(vals(b.grad()), {2}, 0);
}

// ================================================================ forward values

TEST_CASE("add float64 broadcast [3,1,4]+[2,4] known values", "[elementwise][forward]") {
  std::vector<double> av(12), bv(8);
  for (int i = 0; i < 12; ++i) av[static_cast<size_t>(i)] = 100.0 * i;
  for (int i = 0; i < 8; ++i) bv[static_cast<size_t>(i)] = i;
  AnyTensor y = op::add(dt(av, {3, 1, 4}), dt(bv, {2, 4}));
  REQUIRE(y.shape() == Shape{3, 2, 4});
  std::vector<double> want;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 4; ++k) want.push_back(100.0 * (i * 4 + k) + (j * 4 + k));
  check_close(vals(y), want, 0);
}

namespace {
struct BinaryCase {
  const char* name;
  BinaryOp op;
  std::function<double(double, double)> ref;
  double blo, bhi;
};
const std::vector<BinaryCase>& binary_cases() {
  static const std::vector<BinaryCase> c = {
      {"add", BinaryOp::Add, [](double a, double b) { return a + b; }, -2, 2},
      {"sub", BinaryOp::Sub, [](double a, double b) { return a - b; }, -2, 2},
      {"mul", BinaryOp::Mul, [](double a, double b) { return a * b; }, -2, 2},
      {"div", BinaryOp::Div, [](double a, double b) { return a / b; }, 0.5, 2},
      {"pow", BinaryOp::Pow, [](double a, double b) { return std::pow(a, b); }, -2, 2},
      {"maximum", BinaryOp::Maximum, [](double a, double b) { return a > b ? a : b; }, -2, 2},
      {"minimum", BinaryOp::Minimum, [](double a, double b) { return a < b ? a : b; }, -2, 2},
  };
  return c;
}

void check_binary_forward(DType t, double rtol, double atol) {
  for (const BinaryCase& bc : binary_cases()) {
    for (const auto& [sa, sb] : broadcast_cases()) {
      INFO(bc.name << " " << dtype_name(t) << " " << sa.str() << " with " << sb.str());
      const double alo = bc.op == BinaryOp::Pow ? 0.25 : -2;
      AnyTensor a = rand1(sa, 5, alo, 2).to(t), b = rand1(sb, 6, bc.blo, bc.bhi).to(t);
      AnyTensor y = op::binary(bc.op, a, b);
      const Shape os = bcast_shape(sa, sb);
      REQUIRE(y.shape() == os);
      REQUIRE(y.dtype() == t);
      std::vector<double> av = vals(a), bv = vals(b), want(static_cast<size_t>(os.numel()));
      for (int64_t o = 0; o < os.numel(); ++o)
        want[static_cast<size_t>(o)] =
            bc.ref(av[static_cast<size_t>(bcast_index(os, sa, o))], bv[static_cast<size_t>(bcast_index(os, sb, o))]);
      check_close(vals(y), want, rtol, atol);
    }
  }
}
}  // namespace

TEST_CASE("binary ops float64 forward vs loop reference, all broadcast cases", "[elementwise][forward]") {
  check_binary_forward(DType::Float64, 1e-14, 0);
}
TEST_CASE("binary ops float32 forward vs loop reference, all broadcast cases", "[elementwise][forward]") {
  check_binary_forward(DType::Float32, 1e-6, 1e-7);
}

TEST_CASE("binary ops int32 and int64 forward broadcast [2,1]+[3]", "[elementwise][forward]") {
  for (DType t : {DType::Int32, DType::Int64}) {
    INFO(dtype_name(t));
    AnyTensor a = dt({10, -20}, {2, 1}).to(t), b = dt({1, 2, 3}, {3}).to(t);
    AnyTensor s = op::add(a, b), d = op::sub(a, b), m = op::mul(a, b), mx = op::maximum(a, b);
    REQUIRE(s.dtype() == t);
    check_close(vals(s), {11, 12, 13, -19, -18, -17}, 0);
    check_close(vals(d), {9, 8, 7, -21, -22, -23}, 0);
    check_close(vals(m), {10, 20, 30, -20, -40, -60}, 0);
    check_close(vals(mx), {10, 10, 10, 1, 2, 3}, 0);
    check_close(vals(op::abs(a)), {10, 20}, 0);
    check_close(vals(op::neg(a)), {-10, 20}, 0);
    check_close(vals(op::relu(a)), {10, 0}, 0);
    CHECK_THROWS_AS(op::exp(a), DTypeError);
  }
}

namespace {
struct UnaryCase {
  const char* name;
  UFn fn;
  std::function<double(double)> ref;
  double lo, hi;
};
double gelu_ref(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}
const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> c = {
      {"neg", [](const AnyTensor& x) { return op::neg(x); }, [](double x) { return -x; }, -3, 3},
      {"exp", [](const AnyTensor& x) { return op::exp(x); }, [](double x) { return std::exp(x); }, -3, 3},
      {"log", [](const AnyTensor& x) { return op::log(x); }, [](double x) { return std::log(x); }, 0.1, 4},
      {"sqrt", [](const AnyTensor& x) { return op::sqrt(x); }, [](double x) { return std::sqrt(x); }, 0, 4},
      {"abs", [](const AnyTensor& x) { return op::abs(x); }, [](double x) { return std::fabs(x); }, -3, 3},
      {"relu", [](const AnyTensor& x) { return op::relu(x); }, [](double x) { return x > 0 ? x : 0.0; }, -3, 3},
      {"gelu", [](const AnyTensor& x) { return op::gelu(x); }, gelu_ref, -4, 4},
      {"gelu_tanh", [](const AnyTensor& x) { return op::gelu(x, true); }, gelu_tanh_ref, -4, 4},
      {"silu", [](const AnyTensor& x) { return op::silu(x); }, [](double x) { return x / (1 + std::exp(-x)); }, -6, 6},
      {"tanh", [](const AnyTensor& x) { return op::tanh(x); }, [](double x) { return std::tanh(x); }, -3, 3},
      {"sigmoid", [](const AnyTensor& x) { return op::sigmoid(x); }, [](double x) { return 1 / (1 + std::exp(-x)); },
       -8, 8},
      {"square", [](const AnyTensor& x) { return op::square(x); }, [](double x) { return x * x; }, -3, 3},
      {"reciprocal", [](const AnyTensor& x) { return op::reciprocal(x); }, [](double x) { return 1 / x; }, 0.2, 3},
      {"sign", [](const AnyTensor& x) { return op::sign(x); },
       [](double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); }, -3, 3},
      {"pow 2.5", [](const AnyTensor& x) { return op::pow(x, 2.5); }, [](double x) { return std::pow(x, 2.5); }, 0, 3},
      {"pow -1", [](const AnyTensor& x) { return op::pow(x, -1.0); }, [](double x) { return 1 / x; }, 0.2, 3},
      {"clamp", [](const AnyTensor& x) { return op::clamp(x, -0.5, 1.0); },
       [](double x) { return x < -0.5 ? -0.5 : (x > 1.0 ? 1.0 : x); }, -3, 3},
      {"add_scalar", [](const AnyTensor& x) { return op::add(x, 1.25); }, [](double x) { return x + 1.25; }, -3, 3},
      {"sub_scalar", [](const AnyTensor& x) { return op::sub(x, 1.25); }, [](double x) { return x - 1.25; }, -3, 3},
      {"mul_scalar", [](const AnyTensor& x) { return op::mul(x, -3.0); }, [](double x) { return -3 * x; }, -3, 3},
      {"div_scalar", [](const AnyTensor& x) { return op::div(x, 4.0); }, [](double x) { return x / 4; }, -3, 3},
      {"rsub_scalar", [](const AnyTensor& x) { return op::rsub(x, 1.0); }, [](double x) { return 1 - x; }, -3, 3},
      {"rdiv_scalar", [](const AnyTensor& x) { return op::rdiv(x, 2.0); }, [](double x) { return 2 / x; }, 0.2, 3},
  };
  return c;
}

// Values with few significant bits: exactly representable in fp16 and bf16 (multiples of 1/64 below 4
// in magnitude need at most 8 significant bits).
AnyTensor exact_lowp_values(const Shape& s, uint64_t seed, double lo, double hi) {
  AnyTensor x = rand1(s, seed, lo, hi);
  double* p = static_cast<double*>(x.data_ptr());
  for (int64_t i = 0; i < x.numel(); ++i) {
    p[i] = std::round(p[i] * 64.0) / 64.0;
    if (p[i] < lo) p[i] += 1.0 / 64;  // keep log/sqrt/reciprocal inputs in their domain
    if (p[i] == 0 && lo > 0) p[i] = 1.0 / 64;
  }
  return x;
}
}  // namespace

TEST_CASE("unary ops float64 and float32 forward vs std:: reference", "[elementwise][forward]") {
  for (DType t : {DType::Float64, DType::Float32}) {
    const double rtol = t == DType::Float64 ? 1e-13 : 2e-6, atol = t == DType::Float64 ? 1e-15 : 1e-6;
    for (const UnaryCase& uc : unary_cases()) {
      INFO(uc.name << " " << dtype_name(t));
      AnyTensor x = rand1({5, 7}, 42, uc.lo, uc.hi).to(t);
      AnyTensor y = uc.fn(x);
      REQUIRE(y.dtype() == t);
      REQUIRE(y.shape() == x.shape());
      std::vector<double> xv = vals(x), want;
      for (double v : xv) want.push_back(uc.ref(v));
      check_close(vals(y), want, rtol, atol);
    }
  }
}

TEST_CASE("unary ops float64 special values: sigmoid and silu saturate without nan, clamp keeps nan",
          "[elementwise][forward]") {
  AnyTensor x = dt({-1000, 1000, 0}, {3});
  check_close(vals(op::sigmoid(x)), {0, 1, 0.5}, 0, 1e-300);
  check_close(vals(op::silu(x)), {0, 1000, 0}, 0, 1e-300);
  check_close(vals(op::tanh(x)), {-1, 1, 0}, 0);
  std::vector<double> c = vals(op::clamp(dt({NAN, -5, 5}, {3}), -1, 1));
  CHECK(std::isnan(c[0]));
  CHECK(c[1] == -1);
  CHECK(c[2] == 1);
  CHECK_THROWS_AS(op::clamp(x, 1, -1), ValueError);
}

TEST_CASE("unary ops float16 and bfloat16 forward within 1e-3 / 1e-2 of float32", "[elementwise][forward][lowp]") {
  for (DType t : {DType::Float16, DType::BFloat16}) {
    const double rtol = t == DType::Float16 ? 1e-3 : 1e-2;
    for (const UnaryCase& uc : unary_cases()) {
      INFO(uc.name << " " << dtype_name(t));
      AnyTensor x32 = exact_lowp_values({6, 8}, 7, std::max(uc.lo, -3.5), std::min(uc.hi, 3.5)).to(DType::Float32);
      AnyTensor y = uc.fn(x32.to(t));
      REQUIRE(y.dtype() == t);
      check_close(vals(y), vals(uc.fn(x32)), rtol, 1e-6);
    }
  }
}

TEST_CASE("binary ops float16 and bfloat16 forward broadcast within 1e-3 / 1e-2 of float32",
          "[elementwise][forward][lowp]") {
  for (DType t : {DType::Float16, DType::BFloat16}) {
    const double rtol = t == DType::Float16 ? 1e-3 : 1e-2;
    for (const BinaryCase& bc : binary_cases()) {
      INFO(bc.name << " " << dtype_name(t));
      AnyTensor a = exact_lowp_values({3, 1, 4}, 8, bc.op == BinaryOp::Pow ? 0.25 : -2, 2).to(DType::Float32);
      AnyTensor b = exact_lowp_values({2, 4}, 9, bc.blo, bc.bhi).to(DType::Float32);
      AnyTensor y = op::binary(bc.op, a.to(t), b.to(t));
      REQUIRE(y.dtype() == t);
      REQUIRE(y.shape() == Shape{3, 2, 4});
      check_close(vals(y), vals(op::binary(bc.op, a, b)), rtol, 1e-6);
    }
  }
}

TEST_CASE("unary and binary backward float32 matches float64 (same kernels, another dtype)", "[elementwise][grad]") {
  // d/dx sum(w * f(x)) computed in float32 and in float64 from the same (float32-exact) values.
  auto grads = [](const std::function<AnyTensor(const std::vector<AnyTensor>&)>& f, std::vector<AnyTensor> in,
                  const AnyTensor& w) {
    for (AnyTensor& x : in) x.set_requires_grad();
    op::sum(op::mul(f(in), w.to(in[0].dtype()))).backward();
    std::vector<std::vector<double>> g;
    for (const AnyTensor& x : in) g.push_back(vals(x.grad()));
    return g;
  };
  for (const UnaryCase& uc : unary_cases()) {
    INFO(uc.name);
    AnyTensor x = exact_lowp_values({3, 5}, 3, uc.lo, uc.hi), w = exact_lowp_values({3, 5}, 4, -2, 2);
    if (std::string(uc.name) != "sign") push_away(x, {0.0, -0.5, 1.0}, 1.0 / 64);  // kinks of abs/relu/clamp
    auto f = [&uc](const std::vector<AnyTensor>& in) { return uc.fn(in[0]); };
    auto g64 = grads(f, {x.clone()}, w), g32 = grads(f, {x.to(DType::Float32)}, w);
    check_close(g32[0], g64[0], 1e-4, 1e-6);
  }
  for (const BinaryCase& bc : binary_cases()) {
    INFO(bc.name);
    AnyTensor a = exact_lowp_values({3, 1, 4}, 5, bc.op == BinaryOp::Pow ? 0.25 : -2, 2);
    AnyTensor b = exact_lowp_values({2, 4}, 6, bc.blo, bc.bhi), w = exact_lowp_values({3, 2, 4}, 7, -2, 2);
    auto f = [&bc](const std::vector<AnyTensor>& in) { return op::binary(bc.op, in[0], in[1]); };
    auto g64 = grads(f, {a.clone(), b.clone()}, w);
    auto g32 = grads(f, {a.to(DType::Float32), b.to(DType::Float32)}, w);
    check_close(g32[0], g64[0], 1e-4, 1e-5);
    check_close(g32[1], g64[1], 1e-4, 1e-5);
  }
}

TEST_CASE("typed operators float16 x*2, 1-x, x/4 and half + half", "[elementwise][forward][lowp]") {
  Tensor<float> xf = Tensor<float>::from_vector({0.5f, -1.25f, 2.0f, 3.75f}, {4});
  Tensor<half> x = xf.to<half>();
  check_close(vals(x * 2.0), {1, -2.5, 4, 7.5}, 0);
  check_close(vals(1.0 - x), {0.5, 2.25, -1, -2.75}, 0);
  check_close(vals(x / 4.0), {0.125, -0.3125, 0.5, 0.9375}, 0);
  check_close(vals(x + x), {1, -2.5, 4, 7.5}, 0);
  check_close(vals(-x), {-0.5, 1.25, -2, -3.75}, 0);
}

TEST_CASE("typed functions float32: ember::exp, log, gelu, pow, clamp, maximum ... keep Tensor<float>",
          "[elementwise][forward]") {
  Tensor<float> x = Tensor<float>::from_vector({0.25f, 1.0f, 2.0f}, {3});
  Tensor<float> y = Tensor<float>::from_vector({1.0f, 0.5f, 4.0f}, {3});
  std::vector<double> xv = {0.25, 1, 2}, yv = {1, 0.5, 4};
  auto each = [&](double (*f)(double)) {
    std::vector<double> r;
    for (double v : xv) r.push_back(f(v));
    return r;
  };
  check_close(vals(ember::exp(x)), each([](double v) { return std::exp(v); }), 1e-6);
  check_close(vals(ember::log(x)), each([](double v) { return std::log(v); }), 1e-6, 1e-7);
  check_close(vals(ember::sqrt(x)), each([](double v) { return std::sqrt(v); }), 1e-6);
  check_close(vals(ember::tanh(x)), each([](double v) { return std::tanh(v); }), 1e-6);
  check_close(vals(ember::sigmoid(x)), each([](double v) { return 1 / (1 + std::exp(-v)); }), 1e-6);
  check_close(vals(ember::silu(x)), each([](double v) { return v / (1 + std::exp(-v)); }), 1e-6);
  check_close(vals(ember::gelu(x)), each(gelu_ref), 1e-6);
  check_close(vals(ember::gelu(x, true)), each(gelu_tanh_ref), 1e-6);
  check_close(vals(ember::square(x)), {0.0625, 1, 4}, 0);
  check_close(vals(ember::reciprocal(x)), {4, 1, 0.5}, 0);
  check_close(vals(ember::neg(x)), {-0.25, -1, -2}, 0);
  check_close(vals(ember::abs(ember::neg(x))), xv, 0);
  check_close(vals(ember::relu(ember::neg(x))), {0, 0, 0}, 0);
  check_close(vals(ember::sign(ember::neg(x))), {-1, -1, -1}, 0);
  check_close(vals(ember::pow(x, 2.0)), {0.0625, 1, 4}, 0);
  check_close(vals(ember::pow(x, y)), {0.25, 1, 16}, 1e-6);
  check_close(vals(ember::clamp(x, 0.5, 1.5)), {0.5, 1, 1.5}, 0);
  check_close(vals(ember::maximum(x, y)), {1, 1, 4}, 0);
  check_close(vals(ember::minimum(x, y)), {0.25, 0.5, 2}, 0);
  check_close(vals(ember::add(x, y)), {1.25, 1.5, 6}, 0);
  check_close(vals(ember::sub(x, y)), {-0.75, 0.5, -2}, 0);
  check_close(vals(ember::mul(x, y)), {0.25, 0.5, 8}, 0);
  check_close(vals(ember::div(x, y)), {0.25, 2, 0.5}, 0);
  check_close(vals(x + 1.0), {1.25, 2, 3}, 0);
  check_close(vals(1.0 + x), {1.25, 2, 3}, 0);
  check_close(vals(x - 1.0), {-0.75, 0, 1}, 0);
  check_close(vals(x * 4.0), {1, 4, 8}, 0);
  check_close(vals(4.0 * x), {1, 4, 8}, 0);
  check_close(vals(2.0 / x), {8, 2, 1}, 0);
}

// ================================================================ comparisons and where

TEST_CASE("comparisons float32 and int32 broadcast [2,1] vs [3] give uint8 vs loop reference", "[elementwise][compare]") {
  const std::vector<std::pair<CompareOp, std::function<bool(double, double)>>> ops = {
      {CompareOp::Eq, [](double a, double b) { return a == b; }}, {CompareOp::Ne, [](double a, double b) { return a != b; }},
      {CompareOp::Lt, [](double a, double b) { return a < b; }},  {CompareOp::Le, [](double a, double b) { return a <= b; }},
      {CompareOp::Gt, [](double a, double b) { return a > b; }},  {CompareOp::Ge, [](double a, double b) { return a >= b; }},
  };
  for (DType t : {DType::Float32, DType::Int32, DType::Float64}) {
    AnyTensor a = dt({1, 2}, {2, 1}).to(t), b = dt({0, 1, 2}, {3}).to(t);
    for (const auto& [cop, ref] : ops) {
      INFO(dtype_name(t) << " op " << static_cast<int>(cop));
      AnyTensor y = op::compare(cop, a, b);
      REQUIRE(y.dtype() == DType::UInt8);
      REQUIRE(y.shape() == Shape{2, 3});
      std::vector<double> want;
      for (double av : {1.0, 2.0})
        for (double bv : {0.0, 1.0, 2.0}) want.push_back(ref(av, bv) ? 1 : 0);
      check_close(vals(y), want, 0);
    }
  }
  // The scalar form and the typed operators.
  AnyTensor x = dt({-1, 0, 0.5, 2}, {4});
  check_close(vals(op::compare(CompareOp::Gt, x, 0.25)), {0, 0, 1, 1}, 0);
  Tensor<double> tx(x), ty(dt({0, 0, 1, 1}, {4}));
  check_close(vals(tx < ty), {1, 0, 1, 0}, 0);
  check_close(vals(tx == ty), {0, 1, 0, 0}, 0);
  check_close(vals(tx >= ty), {0, 1, 0, 1}, 0);
}

TEST_CASE("comparisons int32 and uint8 against non-integral and out-of-range scalars compare the values",
          "[elementwise][compare]") {
  AnyTensor x = dt({-1, 0, 2, 3}, {4}).to(DType::Int32);
  check_close(vals(op::compare(CompareOp::Lt, x, 0.5)), {1, 1, 0, 0}, 0);
  check_close(vals(op::compare(CompareOp::Gt, x, -0.5)), {0, 1, 1, 1}, 0);
  check_close(vals(op::compare(CompareOp::Eq, x, 2.5)), {0, 0, 0, 0}, 0);
  check_close(vals(op::compare(CompareOp::Ne, x, 2.0)), {1, 1, 0, 1}, 0);
  check_close(vals(op::compare(CompareOp::Le, x, 1e10)), {1, 1, 1, 1}, 0);
  AnyTensor u = dt({0, 7, 255}, {3}).to(DType::UInt8);
  check_close(vals(op::compare(CompareOp::Gt, u, -1.0)), {1, 1, 1}, 0);
  check_close(vals(op::compare(CompareOp::Lt, u, 300.0)), {1, 1, 1}, 0);
  check_close(vals(op::compare(CompareOp::Ge, u, 6.5)), {0, 1, 1}, 0);
}

TEST_CASE("where float32 forward broadcast condition [2,1] with a [2,3] and b []", "[elementwise][compare]") {
  AnyTensor cond = Tensor<uint8_t>::from_vector({0, 1}, {2, 1});
  AnyTensor a = dt({1, 2, 3, 4, 5, 6}, {2, 3}).to(DType::Float32), b = dt({-1}, {}).to(DType::Float32);
  AnyTensor y = op::where(cond, a, b);
  REQUIRE(y.shape() == Shape{2, 3});
  REQUIRE(y.dtype() == DType::Float32);
  check_close(vals(y), {-1, -1, -1, 4, 5, 6}, 0);
  // Typed form, a comparison as the condition: relu by hand.
  Tensor<float> x = Tensor<float>::from_vector({-2, 3, -0.5f, 4}, {4});
  Tensor<float> z = Tensor<float>::zeros({});
  check_close(vals(ember::where(x > z, x, z)), {0, 3, 0, 4}, 0);
  CHECK_THROWS_AS(op::where(a, a, b), DTypeError);  // a float condition
}

TEST_CASE("elementwise ops accept empty and 0-d operands, which broadcast as in PyTorch", "[elementwise][forward]") {
  using F = Tensor<float>;
  CHECK((F::zeros({0, 3}) + F::ones({3})).shape() == Shape{0, 3});
  CHECK((F::zeros({2, 0}) * F::ones({2, 1})).shape() == Shape{2, 0});
  auto s = F::scalar(2.0f) * F::from_vector({1, 2, 3}, {3});
  CHECK(s.to_vector() == std::vector<float>{2, 4, 6});
  auto z = F::scalar(2.0f) + F::scalar(3.0f);
  CHECK(z.shape() == Shape{});
  CHECK(z.item() == 5.0f);
  CHECK(exp(F::zeros({0})).shape() == Shape{0});
  CHECK(eq(F::zeros({0, 2}), F::zeros({2})).shape() == Shape{0, 2});
}

TEST_CASE("div: integers truncate toward zero", "[elementwise][forward]") {
  // (integer division by zero raises and float division by zero gives inf, as PyTorch: the
  // registry's bad inputs and NaN checks of div)
  auto a = Tensor<int32_t>::from_vector({7, -7, 4}, Shape{3});
  auto ok = a / Tensor<int32_t>::from_vector({2, 2, 3}, Shape{3});
  CHECK(ok.to_vector() == std::vector<int32_t>{3, -3, 1});
}

// ================================================================ negative controls

namespace {
// y = x^2 recorded with a backward chosen by the test.
AnyTensor square_with_backward(const AnyTensor& x, int variant) {
  AnyTensor y;
  {
    NoGradGuard ng;
    y = op::square(x);
  }
  AnyTensor sx = x.detach();
  autograd::record("test_square", {x}, {y}, [sx, variant](const std::vector<AnyTensor>& g) {
    switch (variant) {
      case 0: return std::vector<AnyTensor>{op::mul(op::mul(g[0], sx), 2.0)};  // right: 2 x g
      case 1: return std::vector<AnyTensor>{op::mul(g[0], sx)};                 // wrong: factor 2 missing
      case 2: return std::vector<AnyTensor>{op::mul(op::mul(g[0], sx), -2.0)};  // wrong sign
      default: return std::vector<AnyTensor>{AnyTensor::zeros(sx.shape(), sx.dtype())};  // forgot to write
    }
  });
  return y;
}
}  // namespace

TEST_CASE("negative control float64: a deliberately wrong backward fails the gradient check", "[elementwise][control]") {
  auto seed = GENERATE(1u, 2u, 3u);
  std::vector<AnyTensor> x = random_inputs({{3, 4}}, seed, 0.5, 1.5);
  auto right = gradcheck([](const std::vector<AnyTensor>& in) { return square_with_backward(in[0], 0); }, x);
  INFO(right.report);
  CHECK(right.ok);  // the custom op machinery itself is sound
  for (int variant : {1, 2, 3}) {
    INFO("variant " << variant);
    auto wrong = gradcheck([variant](const std::vector<AnyTensor>& in) { return square_with_backward(in[0], variant); }, x);
    CHECK(wrong.checked == 12);
    CHECK_FALSE(wrong.ok);
  }
}

TEST_CASE("negative control float64: a backward that overwrites .grad instead of adding fails the check",
          "[elementwise][control]") {
  auto seed = GENERATE(1u, 2u, 3u);
  std::vector<AnyTensor> x = random_inputs({{2, 5}}, seed);
  // y = 3x, whose backward writes 3 g straight into the leaf's .grad (replacing what was there)
  // instead of returning it for the engine to accumulate.
  auto overwriting = [](const std::vector<AnyTensor>& in) {
    AnyTensor leaf = in[0];
    AnyTensor y;
    {
      NoGradGuard ng;
      y = op::mul(leaf, 3.0);
    }
    autograd::record("overwrite_grad", {leaf}, {y}, [leaf](const std::vector<AnyTensor>& g) mutable {
      leaf.set_grad(op::mul(g[0], 3.0));
      return std::vector<AnyTensor>{AnyTensor()};
    });
    return y;
  };
  auto res = gradcheck(overwriting, x);
  CHECK(res.checked == 10);
  CHECK_FALSE(res.ok);
  // The same op through the engine passes.
  auto good = gradcheck([](const std::vector<AnyTensor>& in) { return op::mul(in[0], 3.0); }, x);
  CHECK(good.ok);
}

TEST_CASE("gradient accumulation float64: two backward() calls on the same leaf double the gradient",
          "[elementwise][control]") {
  AnyTensor x = dt({0.5, -1, 2}, {3});
  x.set_requires_grad();
  // Fresh graph each time.
  op::sum(op::mul(op::square(x), 1.5)).backward();  // d/dx = 3x
  check_close(vals(x.grad()), {1.5, -3, 6}, 1e-15);
  op::sum(op::mul(op::square(x), 1.5)).backward();
  check_close(vals(x.grad()), {3, -6, 12}, 1e-15);
  // One graph, retained.
  AnyTensor w = dt({1, 2, 3}, {3});
  w.set_requires_grad();
  AnyTensor loss = op::sum(op::mul(op::exp(w), w));  // d/dw = exp(w) (1 + w)
  loss.backward(true);
  std::vector<double> once = vals(w.grad());
  loss.backward();
  std::vector<double> twice = vals(w.grad()), want;
  for (double v : {1.0, 2.0, 3.0}) want.push_back(std::exp(v) * (1 + v));
  check_close(once, want, 1e-14);
  for (double& v : want) v *= 2;
  check_close(twice, want, 1e-14);
  // A third backward through the released graph is an error, not silent garbage.
  CHECK_THROWS_AS(loss.backward(), AutogradError);
}
