#pragma once
// What one op declares in the registry of op cases (tests/op_cases.hpp), and how the four
// harnesses that read it turn it into tests: tests/test_gradcheck.cpp, tests/test_op_parity.cpp,
// tests/test_bad_input.cpp and tests/test_nan_semantics.cpp (ggml's test-backend-ops is the model:
// each op declared once, every check run from the declaration).
#include <catch2/catch.hpp>

#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include <ember/ember.hpp>

namespace ember::testing {

// The untyped op call: inputs in, one tensor out.
using OpFn = std::function<AnyTensor(const std::vector<AnyTensor>&)>;

// The short names the family headers write their cases with.
namespace case_names {
using V = const std::vector<AnyTensor>&;  // a case function's inputs
using F = Tensor<float>;
using D = Tensor<double>;
using I64 = Tensor<int64_t>;
}  // namespace case_names

// The parity harness's tolerance class, relative to the CPU result's largest magnitude (both
// backends compute fp16 and bf16 in fp32 inside): fp32 1e-5, or 1e-4 where GEMMs sum in another
// order (Gemm); fp16 2e-3; bf16 2e-2. Gradients get four times as much.
enum class Tolerance { Elementwise, Gemm };

inline double parity_tolerance(DType t, Tolerance c) {
  switch (t) {
    case DType::Float32: return c == Tolerance::Gemm ? 1e-4 : 1e-5;
    case DType::Float16: return 2e-3;
    case DType::BFloat16: return 2e-2;
    default: return 0.0;
  }
}

// One input of a case: its shape and the range its uniform random values come from.
struct Input {
  Shape shape;
  double lo = -1.0, hi = 1.0;
};

// One call of the op (a row of ggml's test cases): inputs, the function, and which checks apply.
struct OpCase {
  std::string variant;  // what tells it from the op's other cases: shapes, dims, options
  std::vector<Input> inputs;
  OpFn fn;
  Tolerance tolerance = Tolerance::Elementwise;
  bool differentiable = true;  // false: forward only (integer outputs, comparisons)
  bool gradcheck = true;       // false: not in the finite-difference check (forward-only ops say so above)
  bool parity = true;          // false: not in the CPU-versus-CUDA check
  // Adjusts the float64 inputs in place before any cast (moves values off a kink, pulls ties apart).
  std::function<void(std::vector<AnyTensor>&)> prepare = {};
};

// A case whose output is not differentiable (indices, comparisons): forward only, inputs in [-2, 2).
inline OpCase forward_only(std::string variant, const Shape& shape, OpFn fn) {
  return {.variant = std::move(variant), .inputs = {{shape, -2, 2}}, .fn = std::move(fn), .differentiable = false};
}

// A call that must raise: the exception type, and the fragments the message must hold (the op's
// name, and the shapes, dtypes, devices or values that explain it).
struct BadInput {
  std::string what;
  std::function<void()> call;
  const char* type_name;
  std::function<bool(const std::exception&)> is_type;
  std::vector<std::string> fragments;
  bool on_device = false;  // the call uses cuda:0 (a pretend one made of CPU kernels where there is no GPU)
};

template <class E>
BadInput bad(std::string what, std::function<void()> call, std::vector<std::string> fragments) {
  return BadInput{std::move(what), std::move(call), typeid(E).name(),
                  [](const std::exception& e) { return dynamic_cast<const E*>(&e) != nullptr; }, std::move(fragments)};
}

template <class E>
BadInput bad_on_device(std::string what, std::function<void()> call, std::vector<std::string> fragments) {
  BadInput b = bad<E>(std::move(what), std::move(call), std::move(fragments));
  b.on_device = true;
  return b;
}

inline constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// What NaN and infinities give (PyTorch's eager CPU results, written out): the inputs' values, the
// output's values and, where given, the gradients of the inputs after backward of sum(output). A
// NaN in `want` means NaN; other values compare within `rtol` (0: exactly, infinities included).
struct NanCheck {
  std::string what;
  std::vector<std::vector<double>> values;
  std::vector<Shape> shapes;
  OpFn fn;
  std::vector<double> want;
  std::vector<std::vector<double>> want_grads = {};
  std::vector<DType> dtypes = {DType::Float64};
  double rtol = 0.0;
};

// Everything one op declares once. The harnesses register a Catch2 test per (op, harness, dtype)
// where the op has something for that harness.
struct OpSpec {
  std::string name;    // the op, as its error messages name it
  std::string family;  // elementwise, reduce, linalg, index, shape, conv_pool, norm, loss, attention
  std::vector<OpCase> cases = {};
  std::vector<DType> dtypes = {DType::Float32, DType::Float16, DType::BFloat16};  // the parity check's
  std::vector<uint64_t> seeds = {1, 2, 3};  // the gradient check's, one run of every case each
  std::vector<BadInput> bad = {};
  std::vector<NanCheck> nan = {};
};

// The inputs of a case from a seed: float64 values from one generator, input by input in their
// ranges, adjusted by the case's `prepare`, then cast to `dtype`.
inline std::vector<AnyTensor> case_inputs(const OpCase& c, uint64_t seed, DType dtype) {
  Generator gen(seed);
  std::vector<AnyTensor> v;
  for (const Input& in : c.inputs) v.push_back(Tensor<double>::rand(in.shape, Device::cpu(), in.lo, in.hi, gen));
  if (c.prepare) c.prepare(v);
  if (dtype != DType::Float64)
    for (AnyTensor& x : v) x = x.to(dtype);
  return v;
}

// Moves every value at least `margin` away from each of `points` (the kinks of abs, relu and clamp,
// the pole of reciprocal): a case's `prepare`.
inline std::function<void(std::vector<AnyTensor>&)> away_from(std::vector<double> points, double margin = 0.05) {
  return [points, margin](std::vector<AnyTensor>& xs) {
    for (AnyTensor& x : xs) {
      double* p = static_cast<double*>(x.data_ptr());
      for (int64_t i = 0; i < x.numel(); ++i)
        for (double c : points)
          if (std::fabs(p[i] - c) < margin) p[i] = c + (p[i] >= c ? margin : -margin);
    }
  };
}

// A fixed tensor that a case's function uses besides its inputs (a constant operand, a mask):
// the same values at every call, in the dtype and on the device of `like`.
inline AnyTensor constant(const Shape& s, uint64_t seed, double lo, double hi, const AnyTensor& like) {
  Generator gen(seed);
  return Tensor<double>::rand(s, Device::cpu(), lo, hi, gen).to(like.dtype()).to(like.device());
}

// A number as a case's label shows it: 2, 0.5, -1.5.
inline std::string num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// The cases of several generators in one list.
template <class... Lists>
std::vector<OpCase> join(Lists&&... lists) {
  std::vector<OpCase> v;
  (v.insert(v.end(), lists.begin(), lists.end()), ...);
  return v;
}

// Registers a Catch2 test case at start-up, as TEST_CASE registers one written out: the harnesses
// make one per (op, harness, dtype) from the registry.
inline void register_test_case(const std::string& name, const std::string& tags, std::function<void()> body) {
  struct Invoker : Catch::ITestInvoker {
    std::function<void()> body;
    void invoke() const override { body(); }
  };
  auto* invoker = new Invoker;  // owned by Catch's registry
  invoker->body = std::move(body);
  Catch::AutoReg reg(invoker, CATCH_INTERNAL_LINEINFO, Catch::StringRef(),
                     Catch::NameAndTags{Catch::StringRef(name), Catch::StringRef(tags)});
}

inline std::string dtype_list(const std::vector<DType>& ts) {
  std::string s;
  for (DType t : ts) s += (s.empty() ? "" : " ") + std::string(dtype_name(t));
  return s;
}

}  // namespace ember::testing
