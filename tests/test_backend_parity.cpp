// Backend parity (as ggml's test-backend-ops): every kernel of the table (core/backend.hpp) runs on
// the CUDA backend and on the CPU reference backend with the same fresh random inputs, and the
// results must agree: fp32 within 1e-5, fp64 1e-12, fp16 1e-3, bf16 1e-2 (relative, with the same
// absolute floor for values near zero), integers exactly, random_uniform bit for bit and
// random_normal within 1e-6. Output buffers are poisoned first (NaN, or 77 for integers), so a
// kernel that forgets to write an element fails. Without a GPU each test prints
// "SKIPPED: no GPU" and ctest counts it as skipped.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <ember/core/tensor.hpp>

#include "gpu_skip.hpp"

using namespace ember;

namespace {

constexpr DType kAllDTypes[] = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                                DType::Int32,   DType::Int64,   DType::UInt8};
constexpr DType kFloatDTypes[] = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16};

Device gpu() { return Device::cuda(0); }
Backend& cpu_be() { return cpu_backend(); }
Backend& gpu_be() { return backend_for(gpu()); }

uint64_t fresh_seed() {
  static uint64_t s = 0x243f6a8885a308d3ULL;
  s += 0x9e3779b97f4a7c15ULL;
  return s;
}

double tolerance(DType t) {
  switch (t) {
    case DType::Float32: return 1e-5;
    case DType::Float64: return 1e-12;
    case DType::Float16: return 1e-3;
    case DType::BFloat16: return 1e-2;
    default: return 0.0;
  }
}

// The same values on both devices.
struct Pair {
  AnyTensor c, g;
  void* cp() const { return c.data_ptr(); }
  void* gp() const { return g.data_ptr(); }
};

// Fresh uniform values in [lo, hi) (integers: truncated), made on the CPU and copied to the GPU.
Pair input(const Shape& s, DType t, double lo, double hi) {
  AnyTensor c = AnyTensor::empty(s, t);
  if (c.numel() > 0) cpu_be().random_uniform(t, c.data_ptr(), c.numel(), fresh_seed(), 0, lo, hi);
  return {c, c.to(gpu())};
}

// Integers in [lo, hi) stored in dtype t (ties and exact arithmetic in every dtype).
Pair small_ints(const Shape& s, DType t, int lo, int hi) {
  AnyTensor i = AnyTensor::empty(s, DType::Int32);
  if (i.numel() > 0) cpu_be().random_uniform(DType::Int32, i.data_ptr(), i.numel(), fresh_seed(), 0, lo, hi);
  AnyTensor c = i.to(t);
  return {c, c.to(gpu())};
}

Pair from_values(const std::vector<double>& v, const Shape& s, DType t) {
  AnyTensor c = Tensor<double>::from_vector(v, s).to(t);
  return {c, c.to(gpu())};
}

double poison_value(DType t) { return is_floating(t) ? std::numeric_limits<double>::quiet_NaN() : 77.0; }

// Uninitialised outputs on both devices, poisoned.
Pair output(const Shape& s, DType t) {
  Pair p{AnyTensor::empty(s, t), AnyTensor::empty(s, t, gpu())};
  if (p.c.numel() > 0) {
    cpu_be().fill(t, p.cp(), p.c.numel(), poison_value(t));
    gpu_be().fill(t, p.gp(), p.g.numel(), poison_value(t));
  }
  return p;
}

// |cpu - gpu| <= atol + rtol * |cpu| element by element (NaN matches NaN, inf matches inf).
void expect_close(const Pair& p, double rtol, double atol, const std::string& what) {
  const std::vector<double> want = p.c.to_double_vector();
  const std::vector<double> got = p.g.to_double_vector();
  REQUIRE(want.size() == got.size());
  int bad = 0;
  std::ostringstream rep;
  for (size_t i = 0; i < want.size(); ++i) {
    const double w = want[i], g = got[i];
    const bool ok = (std::isnan(w) && std::isnan(g)) || w == g || std::fabs(w - g) <= atol + rtol * std::fabs(w);
    if (!ok && bad++ < 5) rep << "  element " << i << ": cpu " << w << ", cuda " << g << "\n";
  }
  INFO(what << " (" << p.c.desc() << "): " << bad << " mismatches\n" << rep.str());
  CHECK(bad == 0);
}
void expect_close(const Pair& p, DType t, const std::string& what) {
  expect_close(p, tolerance(t), tolerance(t), what);
}

// Bit-for-bit equality of the two buffers.
void expect_bitwise(const Pair& p, const std::string& what) {
  AnyTensor g = p.g.to(Device::cpu());
  REQUIRE(g.nbytes() == p.c.nbytes());
  INFO(what << " (" << p.c.desc() << ")");
  CHECK(std::memcmp(g.data_ptr(), p.c.data_ptr(), p.c.nbytes()) == 0);
}

std::string str(DType t) { return dtype_name(t); }

// f calls `op` of the CUDA backend on int32: a DTypeError whose message names the op, int32 and cuda:0.
template <class F>
void check_int32_rejected(const std::string& op, F&& f) {
  try {
    f();
    FAIL(op + " on int32 should throw");
  } catch (const DTypeError& e) {
    const std::string msg = e.what();
    CHECK(msg.find(op) != std::string::npos);
    CHECK(msg.find("int32") != std::string::npos);
    CHECK(msg.find("cuda:0") != std::string::npos);
  }
}

// Broadcasting StridedArgs: inputs right-aligned against `out`, stride 0 along broadcast dimensions.
std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  std::vector<int64_t> st(out.size(), 0);
  int64_t acc = 1;
  for (int d = static_cast<int>(in.size()) - 1; d >= 0; --d) {
    const size_t od = out.size() - in.size() + static_cast<size_t>(d);
    st[od] = in[static_cast<size_t>(d)] == 1 ? 0 : acc;
    acc *= in[static_cast<size_t>(d)];
  }
  return st;
}
StridedArgs broadcast_args(const std::vector<int64_t>& out, const std::vector<int64_t>& a,
                           const std::vector<int64_t>& b = {}, const std::vector<int64_t>& c = {}) {
  StridedArgs s;
  s.ndim = static_cast<int>(out.size());
  const auto sa = broadcast_strides(a, out), sb = broadcast_strides(b, out), sc = broadcast_strides(c, out);
  for (size_t d = 0; d < out.size(); ++d) {
    s.shape[d] = out[d];
    s.stride_a[d] = sa[d];
    s.stride_b[d] = sb[d];
    s.stride_c[d] = sc[d];
  }
  return s;
}

struct BroadcastCase {
  std::vector<int64_t> out, a, b;
};
const BroadcastCase kBroadcastCases[] = {
    {{37, 129}, {37, 129}, {37, 129}},  // dense
    {{4, 3, 5}, {4, 1, 5}, {3, 1}},     // both broadcast
    {{6, 7}, {6, 7}, {}},               // b is a scalar
    {{2, 3, 4, 5}, {3, 1, 5}, {2, 1, 4, 1}},
    {{}, {}, {}},                       // 0-d
};

}  // namespace

// ------------------------------------------------------------------------------------------------
TEST_CASE("cuda backend: registration and device count", "[cuda]") {
  // Runs with or without a GPU.
#if defined(EMBER_TEST_HAVE_CUDA)
  REQUIRE(cuda::is_compiled());
#endif
  if (!cuda::is_compiled()) {
    std::cout << "note: the CUDA backend is not compiled into this executable\n";
    try {
      backend_for(Device::cuda(0));
      FAIL("backend_for(cuda:0) should throw without the CUDA backend");
    } catch (const DeviceError& e) {
      CHECK(std::string(e.what()).find("cuda:0") != std::string::npos);
    }
    return;
  }
  const int n = cuda::device_count();
  CHECK(n >= 0);
  CHECK(cuda::is_available() == (n > 0));
  // One past the last device (cuda:0 without a GPU) is a DeviceError naming the device.
  const std::string name = Device::cuda(n).str();
  try {
    backend_for(Device::cuda(n));
    FAIL("backend_for(" << name << ") should throw");
  } catch (const DeviceError& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(name) != std::string::npos);
  }
  CHECK_THROWS_AS(AnyTensor::empty({2, 3}, DType::Float32, Device::cuda(n)), DeviceError);
  if (n > 0) {
    Backend& b = backend_for(Device::cuda(0));
    CHECK(b.device() == Device::cuda(0));
    CHECK(&b == &backend_for(Device::cuda(0)));  // one backend object per device
  }
}

// ------------------------------------------------------------------------------------------------
TEST_CASE("parity: fill", "[cuda][parity]") {
  EMBER_REQUIRE_GPU();
  for (DType t : kAllDTypes) {
    for (double v : {2.5, -1.25, 0.0, 7.9, 1e30}) {
      if (!is_floating(t) && (v < 0 || v > 100)) continue;
      Pair p = output({1000}, t);
      cpu_be().fill(t, p.cp(), 999, v);  // the last element stays poisoned on both
      gpu_be().fill(t, p.gp(), 999, v);
      expect_close(p, 0.0, 0.0, "fill " + str(t) + " " + std::to_string(v));
    }
  }
}

TEST_CASE("parity: arange", "[cuda][parity]") {
  EMBER_REQUIRE_GPU();
  for (DType t : kAllDTypes) {
    const double start = t == DType::UInt8 ? 0.0 : -3.5, step = t == DType::UInt8 ? 0.25 : 0.37;
    Pair p = output({1000}, t);
    cpu_be().arange(t, p.cp(), 1000, start, step);
    gpu_be().arange(t, p.gp(), 1000, start, step);
    expect_bitwise(p, "arange " + str(t));
  }
}

TEST_CASE("parity: cast between every pair of dtypes", "[cuda][parity]") {
  EMBER_REQUIRE_GPU();
  for (DType s : kAllDTypes) {
    Pair in = input({1003}, s, s == DType::UInt8 ? 0.0 : -100.0, 100.0);
    for (DType d : kAllDTypes) {
      Pair out = output({1003}, d);
      cpu_be().cast(s, in.cp(), d, out.cp(), 1003);
      gpu_be().cast(s, in.gp(), d, out.gp(), 1003);
      expect_close(out, 0.0, 0.0, "cast " + str(s) + " -> " + str(d));
    }
  }
  SECTION("out-of-range and non-finite values to integers convert like the CPU") {
    for (DType s : {DType::Float32, DType::Float64}) {
      const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
      Pair in = from_values({1e10, -1e10, nan, inf, -inf, -1.5, 300.7, -200.2, 4294967303.0, 255.99}, {10}, s);
      for (DType d : {DType::Int32, DType::Int64, DType::UInt8}) {
        Pair out = output({10}, d);
        cpu_be().cast(s, in.cp(), d, out.cp(), 10);
        gpu_be().cast(s, in.gp(), d, out.gp(), 10);
        expect_bitwise(out, "cast special values " + str(s) + " -> " + str(d));
      }
    }
  }
}

TEST_CASE("parity: random_uniform is bit-identical", "[cuda][parity]") {
  EMBER_REQUIRE_GPU();
  for (DType t : kAllDTypes) {
    const double lo = t == DType::UInt8 ? 0.0 : -2.0, hi = t == DType::UInt8 ? 200.0 : 3.0;
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1001}, int64_t{100003}}) {
      Pair p = output({n}, t);
      cpu_be().random_uniform(t, p.cp(), n, 42, 17, lo, hi);
      gpu_be().random_uniform(t, p.gp(), n, 42, 17, lo, hi);
      expect_bitwise(p, "random_uniform " + str(t) + " n=" + std::to_string(n));
    }
  }
}

TEST_CASE("parity: random_normal", "[cuda][parity]") {
  EMBER_REQUIRE_GPU();
  for (DType t : kFloatDTypes) {
    for (int64_t n : {int64_t{3}, int64_t{1001}, int64_t{100002}}) {
      Pair p = output({n}, t);
      cpu_be().random_normal(t, p.cp(), n, 7, 123456789, 0.5, 2.0);
      gpu_be().random_normal(t, p.gp(), n, 7, 123456789, 0.5, 2.0);
      const double tol = is_low_precision(t) ? tolerance(t) : 1e-6;
      expect_close(p, tol, tol, "random_normal " + str(t) + " n=" + std::to_string(n));
    }
  }
}

// ------------------------------------------------------------------------------------------------
namespace {
struct UnaryCase {
  UnaryOp op;
  const char* name;
  double lo, hi;  // input domain
  double a, b;
};
const UnaryCase kUnaryCases[] = {
    {UnaryOp::Neg, "neg", -2, 2, 0, 0},
    {UnaryOp::Exp, "exp", -2, 2, 0, 0},
    {UnaryOp::Log, "log", 0.5, 2, 0, 0},
    {UnaryOp::Sqrt, "sqrt", 0.5, 2, 0, 0},
    {UnaryOp::Abs, "abs", -2, 2, 0, 0},
    {UnaryOp::Relu, "relu", -2, 2, 0, 0},
    {UnaryOp::Gelu, "gelu", -3, 3, 0, 0},
    {UnaryOp::GeluTanh, "gelu_tanh", -3, 3, 0, 0},
    {UnaryOp::Silu, "silu", -3, 3, 0, 0},
    {UnaryOp::Tanh, "tanh", -2, 2, 0, 0},
    {UnaryOp::Sigmoid, "sigmoid", -4, 4, 0, 0},
    {UnaryOp::Pow, "pow 1.7", 0.5, 2, 1.7, 0},
    {UnaryOp::Pow, "pow 2", -2, 2, 2.0, 0},
    {UnaryOp::Pow, "pow 0", 0.5, 2, 0.0, 0},
    {UnaryOp::Clamp, "clamp", -2, 2, -0.5, 0.7},
    {UnaryOp::AddScalar, "add_scalar", -2, 2, 0.3, 0},
    {UnaryOp::MulScalar, "mul_scalar", -2, 2, -1.5, 0},
    {UnaryOp::RSubScalar, "rsub_scalar", -2, 2, 0.25, 0},
    {UnaryOp::RDivScalar, "rdiv_scalar", 0.5, 2, 1.5, 0},
    {UnaryOp::Square, "square", -2, 2, 0, 0},
    {UnaryOp::Reciprocal, "reciprocal", 0.5, 2, 0, 0},
    {UnaryOp::Sign, "sign", -2, 2, 0, 0},
    {UnaryOp::FakeQuantize, "fake_quantize", -2, 2, 0.0125, 127},  // clamps below -1.6 and above 1.5875
};
// Ops that make sense on integers (computed in double and truncated, as on the CPU).
const UnaryCase kIntUnaryCases[] = {
    {UnaryOp::Neg, "neg", -9, 9, 0, 0},          {UnaryOp::Abs, "abs", -9, 9, 0, 0},
    {UnaryOp::Relu, "relu", -9, 9, 0, 0},        {UnaryOp::Sqrt, "sqrt", 1, 99, 0, 0},
    {UnaryOp::Clamp, "clamp", -9, 9, -2, 3},     {UnaryOp::AddScalar, "add_scalar", -9, 9, 3, 0},
    {UnaryOp::MulScalar, "mul_scalar", -9, 9, 2, 0}, {UnaryOp::RSubScalar, "rsub_scalar", -9, 9, 4, 0},
    {UnaryOp::Square, "square", -9, 9, 0, 0},    {UnaryOp::Sign, "sign", -9, 9, 0, 0},
    {UnaryOp::Pow, "pow 2", -9, 9, 2, 0},
};
}  // namespace

TEST_CASE("parity: unary", "[cuda][parity]") {
  EMBER_REQUIRE_GPU();
  for (DType t : kFloatDTypes) {
    for (const UnaryCase& u : kUnaryCases) {
      Pair x = input({4099}, t, u.lo, u.hi);
      Pair y = output({4099}, t);
      cpu_be().unary(u.op, t, x.cp(), y.cp(), 4099, u.a, u.b);
      gpu_be().unary(u.op, t, x.gp(), y.gp(), 4099, u.a, u.b);
      expect_close(y, t, std::string("unary ") + u.name + " " + str(t));
      // In place (out aliases x).
      cpu_be().unary(u.op, t, x.cp(), x.cp(), 4099, u.a, u.b);
      gpu_be().unary(u.op, t, x.gp(), x.gp(), 4099, u.a, u.b);
      expect_close(x, t, std::string("unary in place ") + u.name + " " + str(t));
    }
  }
  for (DType t : {DType::Int32, DType::Int64, DType::UInt8}) {
    for (const UnaryCase& u : kIntUnaryCases) {
      Pair x = input({1000}, t, t == DType::UInt8 ? std::max(0.0, u.lo) : u.lo, u.hi);
      Pair y = output({1000}, t);
      cpu_be().unary(u.op, t, x.cp(), y.cp(), 1000, u.a, u.b);
      gpu_be().unary(u.op, t, x.gp(), y.gp(), 1000, u.a, u.b);
      expect_close(y, 0.0, 0.0, std::string("unary ") + u.name + " " + str(t));
    }
  }
}

TEST_CASE("parity: unary_backward", "[cuda][parity]") {
  EMBER_REQUIRE_GPU();
  for (DType t : kFloatDTypes) {
    for (const UnaryCase& u : kUnaryCases) {
      const int64_t n = 4099;
      Pair x = input({n}, t, u.lo, u.hi);
      Pair y = output({n}, t);
      cpu_be().unary(u.op, t, x.cp(), y.cp(), n, u.a, u.b);  // y from the CPU, the same on both sides
      gpu_be().copy_from_host(y.gp(), y.cp(), y.c.nbytes());
      Pair gy = input({n}, t, -1, 1);
      Pair gx = output({n}, t);
      cpu_be().unary_backward(u.op, t, x.cp(), y.cp(), gy.cp(), gx.cp(), n, u.a, u.b);
      gpu_be().unary_backward(u.op, t, x.gp(), y.gp(), gy.gp(), gx.gp(), n, u.a, u.b);
      expect_close(gx, t, std::string("unary_backward ") + u.name + " " + str(t));
    }
  }
}

// ------------------------------------------------------------------------------------------------
TEST_CASE("parity: binary with broadcasting", "[cuda][parity]") {
  EMBER_REQUIRE_GPU();
  const std::pair<BinaryOp, const char*> ops[] = {{BinaryOp::Add, "add"}, {BinaryOp::Sub, "sub"},
                                                  {BinaryOp::Mul, "mul"}, {BinaryOp::Div, "div"},
                                                  {BinaryOp::Pow, "pow"}, {BinaryOp::Maximum, "maximum"},
                                                  {BinaryOp::Minimum, "minimum"}};
  for (DType t : kAllDTypes) {
    for (const auto& [op, name] : ops) {
      for (const BroadcastCase& bc : kBroadcastCases) {
        const StridedArgs s = broadcast_args(bc.out, bc.a, bc.b);
        const bool fl = is_floating(t);
        Pair a = op == BinaryOp::Pow ? (fl ? input(Shape(bc.a), t, 0.5, 2) : small_ints(Shape(bc.a), t, 0, 6))
                                     : (fl ? input(Shape(bc.a), t, -2, 2)
                                           : small_ints(Shape(bc.a), t, t == DType::UInt8 ? 0 : -20, 50));
        Pair b = fl ? input(Shape(bc.b), t, 0.5, 2) : small_ints(Shape(bc.b), t, 1, 5);
        Pair out = output(Shape(bc.out), t);
        cpu_be().binary(op, t, a.cp(), b.cp(), out.cp(), s);
        gpu_be().binary(op, t, a.gp(), b.gp(), out.gp(), s);
        expect_close(out, t, std::string("binary ") + name + " " + str(t) + " out " + Shape(bc.out).str());
      }
    }
  }
}

TEST_CASE("parity: compare with broadcasting", "[cuda][parity]") {
  EMBER_REQUIRE_GPU();
  const CompareOp ops[] = {CompareOp::Eq, CompareOp::Ne, CompareOp::Lt, CompareOp::Le, CompareOp::Gt, CompareOp::Ge};
  for (DType t : kAllDTypes) {
    for (CompareOp op : ops) {
      for (const BroadcastCase& bc : kBroadcastCases) {
        const StridedArgs s = broadcast_args(bc.out, bc.a, bc.b);
        Pair a = small_ints(Shape(bc.a), t, 0, 4), b = small_ints(Shape(bc.b), t, 0, 4);  // many ties
        Pair out = output(Shape(bc.out), DType::UInt8);
        cpu_be().compare(op, t, a.cp(), b.cp(), static_cast<uint8_t*>(out.cp()), s);
        gpu_be().compare(op, t, a.gp(), b.gp(), static_cast<uint8_t*>(out.gp()), s);
        expect_close(out, 0.0, 0.0, "compare " + std::to_string(static_cast<int>(op)) + " " + str(t));
      }
    }
  }
}

TEST_CASE("parity: where with broadcasting", "[cuda][parity]") {
  EMBER_REQUIRE_GPU();
  for (DType t : kAllDTypes) {
    const std::vector<int64_t> out_shape{4, 3, 5};
    const std::vector<int64_t> cond_shape{4, 1, 5}, a_shape{3, 5}, b_shape{4, 3, 1};
    const StridedArgs s = broadcast_args(out_shape, a_shape, b_shape, cond_shape);
    Pair cond = small_ints(Shape(cond_shape), DType::UInt8, 0, 2);
    Pair a = input(Shape(a_shape), t, 1, 50), b = input(Shape(b_shape), t, 1, 50);
    Pair out = output(Shape(out_shape), t);
    cpu_be().where(t, static_cast<const uint8_t*>(cond.cp()), a.cp(), b.cp(), out.cp(), s);
    gpu_be().where(t, static_cast<const uint8_t*>(cond.gp()), a.gp(), b.gp(), out.gp(), s);
    expect_bitwise(out, "where " + str(t));
  }
}

TEST_CASE("parity: strided_copy (permutes and expands)", "[cuda][parity]") {
  EMBER_REQUIRE_GPU();
  for (DType t : kAllDTypes) {
    Pair src = input({3, 4, 5}, t, 1, 100);
    {  // permute [3,4,5] -> [5,3,4]: out[i,j,k] = src[j,k,i]
      StridedArgs s;
      s.ndim = 3;
      s.shape[0] = 5; s.shape[1] = 3; s.shape[2] = 4;
      s.stride_a[0] = 1; s.stride_a[1] = 20; s.stride_a[2] = 5;
      Pair out = output({5, 3, 4}, t);
      cpu_be().strided_copy(t, src.cp(), out.cp(), s);
      gpu_be().strided_copy(t, src.gp(), out.gp(), s);
      expect_bitwise(out, "strided_copy permute " + str(t));
    }
    {  // expand [3,1,5] view of src's first column -> [3,6,5]
      const StridedArgs s = broadcast_args({3, 6, 5}, {3, 1, 5});
      Pair out = output({3, 6, 5}, t);
      cpu_be().strided_copy(t, src.cp(), out.cp(), s);
      gpu_be().strided_copy(t, src.gp(), out.gp(), s);
      expect_bitwise(out, "strided_copy expand " + str(t));
    }
    {  // contiguous
      const StridedArgs s = broadcast_args({3, 4, 5}, {3, 4, 5});
      Pair out = output({3, 4, 5}, t);
      cpu_be().strided_copy(t, src.cp(), out.cp(), s);
      gpu_be().strided_copy(t, src.gp(), out.gp(), s);
      expect_bitwise(out, "strided_copy contiguous " + str(t));
    }
  }
}

// ------------------------------------------------------------------------------------------------
TEST_CASE("parity: reduce", "[cuda][parity]") {
  EMBER_REQUIRE_GPU();
  struct Dims {
    int64_t outer, n, inner;
  };
  const Dims dims[] = {{1, 100000, 1}, {3, 5000, 7}, {64, 17, 33}, {5, 1, 3}, {2, 3000, 40}, {1000, 64, 1}};
  const std::pair<ReduceOp, const char*> ops[] = {{ReduceOp::Sum, "sum"},       {ReduceOp::Mean, "mean"},
                                                  {ReduceOp::Max, "max"},       {ReduceOp::Min, "min"},
                                                  {ReduceOp::ArgMax, "argmax"}, {ReduceOp::ArgMin, "argmin"}};
  for (DType t : kAllDTypes) {
    for (const Dims& d : dims) {
      const Shape in_shape{d.outer, d.n, d.inner};
      // Sums: positive values (the relative tolerance is then relative to sum |x|); fp16 sums stay
      // below its range. Max/min/arg: few distinct values, so that ties are common.
      const bool big_half = t == DType::Float16 && d.n > 5000;
      Pair sum_in = is_floating(t) ? input(in_shape, t, 0.5, 1.5)
                                   : small_ints(in_shape, t, t == DType::UInt8 ? 0 : -50, 50);
      Pair ext_in = small_ints(in_shape, t, 0, 9);
      for (const auto& [op, name] : ops) {
        if (big_half && op == ReduceOp::Sum) continue;
        const bool arg = op == ReduceOp::ArgMax || op == ReduceOp::ArgMin;
        const bool sum = op == ReduceOp::Sum || op == ReduceOp::Mean;
        const Pair& x = sum ? sum_in : ext_in;
        const DType out_t = arg ? DType::Int64 : t;
        Pair out = output({d.outer, d.inner}, out_t);
        cpu_be().reduce(op, t, x.cp(), out.cp(), d.outer, d.n, d.inner);
        gpu_be().reduce(op, t, x.gp(), out.gp(), d.outer, d.n, d.inner);
        const std::string what = std::string("reduce ") + name + " " + str(t) + " [" + std::to_string(d.outer) + ", " +
                                 std::to_string(d.n) + ", " + std::to_string(d.inner) + "]";
        if (arg || !is_floating(t) || !sum) {
          expect_close(out, 0.0, 0.0, what);
        } else {
          // fp32 sums accumulate in float on the GPU and in double on the CPU.
          expect_close(out, t, what);
        }
      }
      if (is_floating(t)) {  // NaN propagates through max/min and wins argmax/argmin (first NaN)
        std::vector<double> v = ext_in.c.to_double_vector();
        const double nan = std::numeric_limits<double>::quiet_NaN();
        v[static_cast<size_t>(d.n / 2 * d.inner)] = nan;  // outer 0, inner 0
        if (d.n > 3) v[static_cast<size_t>((d.n - 1) * d.inner)] = nan;
        if (d.inner > 1) v[static_cast<size_t>(d.n * d.inner - 1)] = nan;  // outer 0, last inner
        Pair x = from_values(v, in_shape, t);
        for (const auto& [op, name] : ops) {
          if (op == ReduceOp::Sum || op == ReduceOp::Mean) continue;
          const bool arg = op == ReduceOp::ArgMax || op == ReduceOp::ArgMin;
          Pair out = output({d.outer, d.inner}, arg ? DType::Int64 : t);
          cpu_be().reduce(op, t, x.cp(), out.cp(), d.outer, d.n, d.inner);
          gpu_be().reduce(op, t, x.gp(), out.gp(), d.outer, d.n, d.inner);
          expect_close(out, 0.0, 0.0, std::string("reduce with NaN ") + name + " " + str(t));
        }
      }
    }
  }
}

TEST_CASE("parity: nonfinite_check", "[cuda][parity]") {
  EMBER_REQUIRE_GPU();
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (DType t : kAllDTypes) {
    for (double special : {1.0, inf, -inf, nan}) {
      for (uint8_t initial : {uint8_t{0}, uint8_t{1}}) {
        Pair x = input({100003}, t, 1, 100);
        if (is_floating(t) && special != 1.0) {
          std::vector<double> v = x.c.to_double_vector();
          v[77777] = special;
          x = from_values(v, {100003}, t);
        }
        AnyTensor flag = Tensor<uint8_t>::full({1}, static_cast<double>(initial), gpu());
        gpu_be().nonfinite_check(t, x.gp(), 100003, static_cast<uint8_t*>(flag.data_ptr()));
        uint8_t cpu_flag = initial;
        cpu_be().nonfinite_check(t, x.cp(), 100003, &cpu_flag);
        const double got = flag.to_double_vector()[0];
        INFO("nonfinite_check " << str(t) << " special " << special << " initial " << int(initial));
        CHECK(got == static_cast<double>(cpu_flag));
        CHECK(got == ((initial || (is_floating(t) && special != 1.0)) ? 1.0 : 0.0));
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
TEST_CASE("parity: gemm", "[cuda][parity]") {
  EMBER_REQUIRE_GPU();
  const int64_t m = 33, n = 47, k = 29, batch = 3;
  for (DType t : kFloatDTypes) {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (double beta : {0.0, 0.5}) {
          GemmArgs g;
          g.dtype = t;
          g.trans_a = ta != 0;
          g.trans_b = tb != 0;
          g.m = m; g.n = n; g.k = k; g.batch = batch;
          g.lda = (g.trans_a ? m : k) + 3;  // padded leading dimensions
          g.ldb = (g.trans_b ? k : n) + 2;
          g.ldc = n + 5;
          g.stride_a = (g.trans_a ? k : m) * g.lda + 7;
          g.stride_b = (g.trans_b ? n : k) * g.ldb + 1;
          g.stride_c = m * g.ldc + 4;
          g.alpha = 1.25;
          g.beta = beta;
          // Small integers: exact products in every dtype, so the check is about indexing.
          Pair a = small_ints({batch * g.stride_a}, t, -3, 4), b = small_ints({batch * g.stride_b}, t, -3, 4);
          Pair c = beta == 0.0 ? output({batch * g.stride_c}, t) : small_ints({batch * g.stride_c}, t, -3, 4);
          GemmArgs gc = g, gg = g;
          gc.a = a.cp(); gc.b = b.cp(); gc.c = c.cp();
          gg.a = a.gp(); gg.b = b.gp(); gg.c = c.gp();
          cpu_be().gemm(gc);
          gpu_be().gemm(gg);
          // Compare the written elements only (the padding stays as it was on both sides).
          const std::vector<double> want = c.c.to_double_vector(), got = c.g.to_double_vector();
          double mag = 1.0;
          for (double v : want)
            if (!std::isnan(v)) mag = std::max(mag, std::fabs(v));
          int bad = 0;
          for (int64_t bi = 0; bi < batch; ++bi)
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) {
                const size_t e = static_cast<size_t>(bi * g.stride_c + i * g.ldc + j);
                if (!(std::fabs(want[e] - got[e]) <= 1e-4 * mag)) ++bad;
              }
          INFO("gemm " << str(t) << " trans_a " << ta << " trans_b " << tb << " beta " << beta);
          CHECK(bad == 0);
        }
  }
  SECTION("k = 0 scales C by beta; vectors (m = 1, n = 1)") {
    for (DType t : kFloatDTypes) {
      struct Case {
        int64_t m, n, k;
      };
      for (const Case& cs : {Case{5, 4, 0}, Case{1, 7, 5}, Case{6, 1, 3}, Case{1, 1, 9}}) {
        GemmArgs g;
        g.dtype = t;
        g.m = cs.m; g.n = cs.n; g.k = cs.k; g.batch = 2;
        g.lda = std::max<int64_t>(cs.k, 1); g.ldb = cs.n; g.ldc = cs.n;
        g.stride_a = cs.m * cs.k; g.stride_b = cs.k * cs.n; g.stride_c = cs.m * cs.n;
        g.alpha = 1.0;
        g.beta = 0.5;
        Pair a = small_ints({std::max<int64_t>(2 * g.stride_a, 1)}, t, -3, 4);
        Pair b = small_ints({std::max<int64_t>(2 * g.stride_b, 1)}, t, -3, 4);
        Pair c = small_ints({2 * g.stride_c}, t, -3, 4);
        GemmArgs gc = g, gg = g;
        gc.a = a.cp(); gc.b = b.cp(); gc.c = c.cp();
        gg.a = a.gp(); gg.b = b.gp(); gg.c = c.gp();
        cpu_be().gemm(gc);
        gpu_be().gemm(gg);
        expect_close(c, 1e-4, 1e-4, "gemm " + str(t) + " m=" + std::to_string(cs.m) + " n=" + std::to_string(cs.n) +
                                        " k=" + std::to_string(cs.k));
      }
    }
  }
  SECTION("unsupported dtypes are a DTypeError naming op, dtype and device") {
    GemmArgs g;
    g.dtype = DType::Int32;
    g.m = g.n = g.k = 2;
    g.lda = g.ldb = g.ldc = 2;
    Pair a = small_ints({4}, DType::Int32, 0, 3), c = output({4}, DType::Int32);
    g.a = a.gp(); g.b = a.gp(); g.c = c.gp();
    check_int32_rejected("gemm", [&] { gpu_be().gemm(g); });
  }
}

// ------------------------------------------------------------------------------------------------
TEST_CASE("parity: softmax and log_softmax", "[cuda][parity]") {
  EMBER_REQUIRE_GPU();
  // Rows of 16-byte packs in registers (kernels/softmax.cuh) at several packs per lane (64, 200,
  // 520, 1024 columns: 1 to 8 packs of floats, a partly filled last one at 200 and 520), rows
  // that are no whole number of packs (33) and longer rows (3000, 10000: a block per row).
  const std::pair<int64_t, int64_t> shapes[] = {{7, 33},  {130, 1024}, {33, 64}, {65, 200},
                                                {17, 520}, {5, 3000},   {3, 10000}, {1, 1}};
  for (DType t : kFloatDTypes) {
    for (const auto& [rows, cols] : shapes) {
      for (bool log : {false, true}) {
        Pair x = input({rows, cols}, t, -8, 8);
        if (rows > 1) {  // a row of -inf (NaN out, like PyTorch) and a row with one -inf
          std::vector<double> v = x.c.to_double_vector();
          for (int64_t c = 0; c < cols; ++c) v[static_cast<size_t>(cols + c)] = -std::numeric_limits<double>::infinity();
          if (rows > 2) v[static_cast<size_t>(2 * cols)] = -std::numeric_limits<double>::infinity();
          x = from_values(v, {rows, cols}, t);
        }
        Pair y = output({rows, cols}, t);
        cpu_be().softmax(t, x.cp(), y.cp(), rows, cols, log);
        gpu_be().softmax(t, x.gp(), y.gp(), rows, cols, log);
        const std::string what = std::string(log ? "log_softmax " : "softmax ") + str(t) + " " +
                                 std::to_string(rows) + "x" + std::to_string(cols);
        expect_close(y, t, what);

        // Backward from the CPU's y (the same on both sides).
        gpu_be().copy_from_host(y.gp(), y.cp(), y.c.nbytes());
        Pair gy = input({rows, cols}, t, -1, 1);
        Pair gx = output({rows, cols}, t);
        cpu_be().softmax_backward(t, y.cp(), gy.cp(), gx.cp(), rows, cols, log);
        gpu_be().softmax_backward(t, y.gp(), gy.gp(), gx.gp(), rows, cols, log);
        expect_close(gx, t, what + " backward");
      }
    }
  }
  SECTION("integer dtypes are a DTypeError naming op, dtype and device") {
    Pair x = small_ints({2, 3}, DType::Int32, 0, 3), y = output({2, 3}, DType::Int32);
    check_int32_rejected("softmax", [&] { gpu_be().softmax(DType::Int32, x.gp(), y.gp(), 2, 3, false); });
  }
}

// ------------------------------------------------------------------------------------------------
TEST_CASE("parity: index_select, index_add, gather, scatter_add", "[cuda][parity]") {
  EMBER_REQUIRE_GPU();
  struct Dims {
    int64_t outer, src_n, idx_n, inner;
  };
  const Dims dims[] = {{3, 10, 7, 5}, {1, 1000, 4000, 1}, {4, 50, 20, 64}, {1, 1, 3, 2}};
  for (DType t : kAllDTypes) {
    for (const Dims& d : dims) {
      const std::string where = str(t) + " [" + std::to_string(d.outer) + ", " + std::to_string(d.src_n) + "->" +
                                std::to_string(d.idx_n) + ", " + std::to_string(d.inner) + "]";
      // Exact integers in every dtype: atomics add in a different order than the CPU.
      Pair x = small_ints({d.outer, d.src_n, d.inner}, t, 1, 5);
      {
        Pair idx = input({d.idx_n}, DType::Int64, 0, static_cast<double>(d.src_n));  // duplicates
        Pair out = output({d.outer, d.idx_n, d.inner}, t);
        cpu_be().index_select(t, x.cp(), static_cast<const int64_t*>(idx.cp()), out.cp(), d.outer, d.src_n, d.idx_n,
                              d.inner);
        gpu_be().index_select(t, x.gp(), static_cast<const int64_t*>(idx.gp()), out.gp(), d.outer, d.src_n, d.idx_n,
                              d.inner);
        expect_bitwise(out, "index_select " + where);

        Pair gy = small_ints({d.outer, d.idx_n, d.inner}, t, 1, 3);
        Pair gx = small_ints({d.outer, d.src_n, d.inner}, t, 0, 3);  // index_add adds to what is there
        cpu_be().index_add(t, gy.cp(), static_cast<const int64_t*>(idx.cp()), gx.cp(), d.outer, d.src_n, d.idx_n,
                           d.inner);
        gpu_be().index_add(t, gy.gp(), static_cast<const int64_t*>(idx.gp()), gx.gp(), d.outer, d.src_n, d.idx_n,
                           d.inner);
        expect_close(gx, 0.0, 0.0, "index_add " + where);
      }
      {
        Pair idx = input({d.outer, d.idx_n, d.inner}, DType::Int64, 0, static_cast<double>(d.src_n));
        Pair out = output({d.outer, d.idx_n, d.inner}, t);
        cpu_be().gather(t, x.cp(), static_cast<const int64_t*>(idx.cp()), out.cp(), d.outer, d.src_n, d.idx_n, d.inner);
        gpu_be().gather(t, x.gp(), static_cast<const int64_t*>(idx.gp()), out.gp(), d.outer, d.src_n, d.idx_n, d.inner);
        expect_bitwise(out, "gather " + where);

        Pair gy = small_ints({d.outer, d.idx_n, d.inner}, t, 1, 3);
        Pair gx = small_ints({d.outer, d.src_n, d.inner}, t, 0, 3);
        cpu_be().scatter_add(t, gy.cp(), static_cast<const int64_t*>(idx.cp()), gx.cp(), d.outer, d.src_n, d.idx_n,
                             d.inner);
        gpu_be().scatter_add(t, gy.gp(), static_cast<const int64_t*>(idx.gp()), gx.gp(), d.outer, d.src_n, d.idx_n,
                             d.inner);
        expect_close(gx, 0.0, 0.0, "scatter_add " + where);
      }
    }
  }
  SECTION("floating-point accumulation with non-integer values") {
    for (DType t : kFloatDTypes) {
      const int64_t outer = 2, src_n = 100, idx_n = 300, inner = 16;
      Pair idx = input({idx_n}, DType::Int64, 0, static_cast<double>(src_n));
      Pair gy = input({outer, idx_n, inner}, t, -1, 1);
      Pair gx = input({outer, src_n, inner}, t, -1, 1);
      cpu_be().index_add(t, gy.cp(), static_cast<const int64_t*>(idx.cp()), gx.cp(), outer, src_n, idx_n, inner);
      gpu_be().index_add(t, gy.gp(), static_cast<const int64_t*>(idx.gp()), gx.gp(), outer, src_n, idx_n, inner);
      // About three additions per element, in another order: a few roundings of the element's size.
      const double tol = 4 * tolerance(t);
      expect_close(gx, tol, tol, "index_add float " + str(t));
    }
  }
}

// ------------------------------------------------------------------------------------------------
TEST_CASE("cuda backend: memory statistics, limit and out of memory", "[cuda]") {
  EMBER_REQUIRE_GPU();
  Backend& b = gpu_be();
  b.synchronize();
  const MemoryStats before = b.memory_stats();
  void* p = b.allocate(1 << 20);
  REQUIRE(p != nullptr);
  MemoryStats s = b.memory_stats();
  CHECK(s.current_bytes == before.current_bytes + (1 << 20));
  CHECK(s.peak_bytes >= s.current_bytes);
  CHECK(s.num_allocations == before.num_allocations + 1);
  b.deallocate(p, 1 << 20);
  CHECK(b.memory_stats().current_bytes == before.current_bytes);
  b.reset_peak_memory();
  CHECK(b.memory_stats().peak_bytes == before.current_bytes);

  SECTION("a limit makes allocations beyond it throw OutOfMemory with the figures") {
    b.set_memory_limit(before.current_bytes + 1000);
    CHECK(b.memory_stats().limit_bytes == before.current_bytes + 1000);
    try {
      b.allocate(4096);
      FAIL("allocation beyond the limit should throw");
    } catch (const OutOfMemory& e) {
      CHECK(e.requested_bytes == 4096);
      CHECK(e.limit_bytes == before.current_bytes + 1000);
      CHECK(std::string(e.what()).find("cuda:0") != std::string::npos);
    }
    b.set_memory_limit(-1);
    CHECK(b.memory_stats().current_bytes == before.current_bytes);
  }
  SECTION("more memory than the device has is OutOfMemory, not a crash") {
    try {
      b.allocate(size_t{1} << 50);  // 1 PiB
      FAIL("a 1 PiB allocation should throw");
    } catch (const OutOfMemory& e) {
      INFO(e.what());
      CHECK(e.requested_bytes == (int64_t{1} << 50));
      CHECK(std::string(e.what()).find("cudaMemGetInfo") != std::string::npos);
    }
    CHECK(b.memory_stats().current_bytes == before.current_bytes);
    // The device still works afterwards.
    Pair x = input({1000}, DType::Float32, -1, 1), y = output({1000}, DType::Float32);
    cpu_be().unary(UnaryOp::Exp, DType::Float32, x.cp(), y.cp(), 1000, 0, 0);
    gpu_be().unary(UnaryOp::Exp, DType::Float32, x.gp(), y.gp(), 1000, 0, 0);
    expect_close(y, DType::Float32, "exp after an out-of-memory error");
  }
}

TEST_CASE("cuda backend: copies", "[cuda]") {
  EMBER_REQUIRE_GPU();
  Backend& b = gpu_be();
  SECTION("host round trip; the host source may be freed right after copy_from_host returns") {
    for (size_t bytes : {size_t{1}, size_t{1000}, size_t{3} << 20, size_t{40} << 20}) {
      void* d = b.allocate(bytes);
      std::vector<unsigned char> back(bytes);
      {
        std::vector<unsigned char> src(bytes);
        for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>(i * 7 + 3);
        b.copy_from_host(d, src.data(), bytes);
        std::fill(src.begin(), src.end(), 0);  // overwritten (then freed) before the GPU may have read it
      }
      b.copy_to_host(back.data(), d, bytes);
      bool same = true;
      for (size_t i = 0; i < bytes; ++i) same = same && back[i] == static_cast<unsigned char>(i * 7 + 3);
      INFO("bytes " << bytes);
      CHECK(same);
      b.deallocate(d, bytes);
    }
  }
  SECTION("device copies, overlapping copies and 2-d copies") {
    Pair x = input({1000}, DType::Int32, -1000, 1000);
    Pair y = output({1000}, DType::Int32);
    cpu_be().copy(y.cp(), x.cp(), 4000);
    b.copy(y.gp(), x.gp(), 4000);
    expect_bitwise(y, "copy");
    // Overlapping (memmove semantics): shift by 10 elements both ways.
    cpu_be().copy(static_cast<int32_t*>(y.cp()) + 10, y.cp(), 3960);
    b.copy(static_cast<int32_t*>(y.gp()) + 10, y.gp(), 3960);
    expect_bitwise(y, "overlapping copy forward");
    cpu_be().copy(y.cp(), static_cast<int32_t*>(y.cp()) + 10, 3960);
    b.copy(y.gp(), static_cast<int32_t*>(y.gp()) + 10, 3960);
    expect_bitwise(y, "overlapping copy backward");
    // 2-d: 20 rows of 7 elements from a pitch of 50 elements into a pitch of 9.
    Pair z = output({20 * 9}, DType::Int32);
    cpu_be().copy_2d(z.cp(), 9 * 4, x.cp(), 50 * 4, 7 * 4, 20);
    b.copy_2d(z.gp(), 9 * 4, x.gp(), 50 * 4, 7 * 4, 20);
    expect_bitwise(z, "copy_2d");
    Pair w = output({30}, DType::Int32);  // one row
    cpu_be().copy_2d(w.cp(), 4, x.cp(), 4, 30 * 4, 1);
    b.copy_2d(w.gp(), 4, x.gp(), 4, 30 * 4, 1);
    expect_bitwise(w, "copy_2d one row");
  }
  SECTION("tensors move between devices unchanged") {
    for (DType t : kAllDTypes) {
      Pair x = input({3, 5, 7}, t, 0, 100);
      AnyTensor back = x.g.to(Device::cpu());
      CHECK(back.device() == Device::cpu());
      CHECK(back.shape() == x.c.shape());
      CHECK(std::memcmp(back.data_ptr(), x.cp(), x.c.nbytes()) == 0);
    }
  }
}
