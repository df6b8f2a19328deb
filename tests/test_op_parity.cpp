// CPU vs CUDA parity for every op, forward and backward, through the public op API (the
// backend-level kernel parity is in test_backend_parity.cpp). Runs when a GPU is present;
// otherwise each test prints "SKIPPED: no GPU" and ctest counts it as skipped.
// Tolerances (relative to the reference's magnitude): fp32 1e-5 (GEMM-based ops 1e-4),
// fp16 1e-3 of fp16 resolution, bf16 1e-2; both backends compute 16-bit types in fp32 inside.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gpu_skip.hpp"
#include "pretend_gpu.hpp"
#include <ember/ember.hpp>

using namespace ember;

namespace {

using OpFn = std::function<AnyTensor(const std::vector<AnyTensor>&)>;

struct ParityCase {
  std::string name;
  std::vector<Shape> shapes;
  OpFn fn;
  double lo = -2.0, hi = 2.0;  // input range
  bool gemm = false;           // looser fp32 tolerance for accumulation-order differences
  bool differentiable = true;
};

double tolerance(DType t, bool gemm) {
  switch (t) {
    case DType::Float32: return gemm ? 1e-4 : 1e-5;
    case DType::Float16: return 2e-3;
    case DType::BFloat16: return 2e-2;
    default: return 0.0;
  }
}

void check_close(const AnyTensor& ref, const AnyTensor& got, double tol, const std::string& what) {
  INFO(what << ": " << ref.desc() << " vs " << got.desc());
  REQUIRE(ref.shape() == got.shape());
  std::vector<double> a = ref.to_double_vector(), b = got.to_double_vector();
  double scale = 1e-6;
  for (double v : a) scale = std::max(scale, std::fabs(v));
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double e = std::isnan(a[i]) && std::isnan(b[i]) ? 0.0 : std::fabs(a[i] - b[i]);
    if (!(e <= worst)) {
      worst = e;
      at = i;
    }
  }
  INFO("worst error " << worst << " at element " << at << " (scale " << scale << ", tolerance " << tol << ")");
  CHECK(worst <= tol * scale);
}

void run_parity(const ParityCase& c, DType dt) {
  Generator gen(99);
  std::vector<AnyTensor> cpu_in, gpu_in;
  for (const Shape& s : c.shapes) {
    AnyTensor x = Tensor<float>::rand(s, Device::cpu(), c.lo, c.hi, gen).to(dt);
    AnyTensor xc = x.to(Device::cuda(0));
    if (c.differentiable && is_floating(dt)) {
      x.set_requires_grad(true);
      xc.set_requires_grad(true);
    }
    cpu_in.push_back(x);
    gpu_in.push_back(xc);
  }
  AnyTensor y_cpu = c.fn(cpu_in), y_gpu = c.fn(gpu_in);
  REQUIRE(y_gpu.device() == Device::cuda(0));
  const double tol = tolerance(dt, c.gemm);
  check_close(y_cpu, y_gpu, tol, c.name + " forward " + dtype_name(dt));
  if (!c.differentiable || !y_cpu.requires_grad()) return;
  AnyTensor gy = Tensor<float>::rand(y_cpu.shape(), Device::cpu(), -1.0, 1.0, gen).to(y_cpu.dtype());
  y_cpu.backward(gy);
  y_gpu.backward(gy.to(Device::cuda(0)));
  for (size_t i = 0; i < cpu_in.size(); ++i) {
    if (!cpu_in[i].grad().defined()) continue;
    REQUIRE(gpu_in[i].grad().defined());
    check_close(cpu_in[i].grad(), gpu_in[i].grad(), tol * 4, c.name + " grad of input " + std::to_string(i));
  }
}

std::vector<ParityCase> cases() {
  using V = const std::vector<AnyTensor>&;
  std::vector<ParityCase> c;
  c.push_back({"add broadcast", {{4, 1, 5}, {3, 5}}, [](V x) { return op::add(x[0], x[1]); }});
  c.push_back({"sub", {{6, 7}, {6, 7}}, [](V x) { return op::sub(x[0], x[1]); }});
  c.push_back({"mul broadcast", {{2, 3, 4}, {4}}, [](V x) { return op::mul(x[0], x[1]); }});
  c.push_back({"div", {{5, 5}, {5, 5}}, [](V x) { return op::div(x[0], x[1]); }, 0.5, 2.0});
  c.push_back({"pow tensor", {{9}, {9}}, [](V x) { return op::pow(x[0], x[1]); }, 0.5, 2.0});
  c.push_back({"maximum", {{3, 4}, {3, 4}}, [](V x) { return op::maximum(x[0], x[1]); }});
  c.push_back({"minimum", {{3, 4}, {4}}, [](V x) { return op::minimum(x[0], x[1]); }});
  for (UnaryOp u : {UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Abs, UnaryOp::Relu, UnaryOp::Gelu, UnaryOp::GeluTanh,
                    UnaryOp::Silu, UnaryOp::Tanh, UnaryOp::Sigmoid, UnaryOp::Square})
    c.push_back({std::string("unary ") + op::detail::unary_name(u), {{7, 9}}, [u](V x) { return op::unary(u, x[0]); }});
  c.push_back({"log", {{7, 9}}, [](V x) { return op::log(x[0]); }, 0.1, 3.0});
  c.push_back({"sqrt", {{7, 9}}, [](V x) { return op::sqrt(x[0]); }, 0.1, 3.0});
  c.push_back({"reciprocal", {{7, 9}}, [](V x) { return op::reciprocal(x[0]); }, 0.5, 3.0});
  c.push_back({"pow scalar", {{7, 9}}, [](V x) { return op::pow(x[0], 2.5); }, 0.1, 3.0});
  c.push_back({"clamp", {{7, 9}}, [](V x) { return op::clamp(x[0], -0.5, 0.7); }});
  c.push_back({"scalar ops", {{5, 3}}, [](V x) { return op::rdiv(op::add(op::mul(x[0], 3.0), 7.0), 2.0); }});
  c.push_back({"sum dims", {{4, 5, 6}}, [](V x) { return op::sum(x[0], {0, 2}); }});
  c.push_back({"sum all", {{33, 17}}, [](V x) { return op::sum(x[0]); }});
  c.push_back({"mean keepdim", {{4, 5, 6}}, [](V x) { return op::mean(x[0], {1}, true); }});
  c.push_back({"max dim", {{4, 50}}, [](V x) { return op::max(x[0], {1}); }});
  c.push_back({"min all", {{4, 50}}, [](V x) { return op::min(x[0]); }});
  c.push_back({"argmax", {{6, 40}}, [](V x) { return op::argmax(x[0], {1}); }, -2, 2, false, false});
  c.push_back({"argmin", {{6, 40}}, [](V x) { return op::argmin(x[0], {0}); }, -2, 2, false, false});
  c.push_back({"matmul", {{17, 33}, {33, 9}}, [](V x) { return op::matmul(x[0], x[1]); }, -1, 1, true});
  c.push_back({"matmul transposes", {{33, 17}, {9, 33}}, [](V x) { return op::matmul(x[0], x[1], true, true); }, -1, 1, true});
  c.push_back({"matmul batched", {{3, 8, 16}, {3, 16, 5}}, [](V x) { return op::matmul(x[0], x[1]); }, -1, 1, true});
  c.push_back({"matmul broadcast", {{3, 8, 16}, {16, 5}}, [](V x) { return op::matmul(x[0], x[1]); }, -1, 1, true});
  c.push_back({"linear (bias in the GEMM)", {{3, 8, 16}, {5, 16}, {5}},
               [](V x) { return op::linear(x[0], x[1], x[2]); }, -1, 1, true});
  c.push_back({"linear without bias", {{8, 16}, {5, 16}}, [](V x) { return op::linear(x[0], x[1]); }, -1, 1, true});
  c.push_back({"permute", {{2, 3, 4, 5}}, [](V x) { return op::permute(x[0], {3, 1, 0, 2}); }});
  c.push_back({"transpose", {{6, 7}}, [](V x) { return op::transpose(x[0]); }});
  c.push_back({"expand", {{3, 1}}, [](V x) { return op::expand(x[0], Shape{2, 3, 4}); }});
  c.push_back({"concat", {{2, 3}, {2, 5}}, [](V x) { return op::concat({x[0], x[1]}, 1); }});
  c.push_back({"split", {{4, 6}}, [](V x) { return op::split(x[0], {2, 4}, 1)[1]; }});
  c.push_back({"softmax", {{5, 37}}, [](V x) { return op::softmax(x[0], 1); }});
  c.push_back({"log_softmax dim 0", {{37, 5}}, [](V x) { return op::log_softmax(x[0], 0); }});
  c.push_back({"index_select", {{7, 4}}, [](V x) {
                 auto idx = Tensor<int64_t>::from_vector({6, 0, 6, 2}, x[0].device());
                 return op::index_select(x[0], 0, idx);
               }});
  c.push_back({"gather", {{3, 5}}, [](V x) {
                 auto idx = Tensor<int64_t>::from_vector({4, 0, 1, 1, 2, 2, 3, 3, 0}, {3, 3}, x[0].device());
                 return op::gather(x[0], 1, idx);
               }});
  c.push_back({"where", {{3, 4}, {3, 4}}, [](V x) { return op::where(op::gt(x[0], x[1]), x[0], x[1]); }});
  c.push_back({"compare", {{3, 4}, {4}}, [](V x) { return op::le(x[0], x[1]); }, -2, 2, false, false});
  c.push_back({"conv2d 3x3 pad 1 + bias", {{2, 3, 9, 8}, {5, 3, 3, 3}, {5}},
               [](V x) { return op::conv2d(x[0], x[1], x[2], {{1, 1}, {1, 1}, {1, 1}, 1}); }, -1, 1, true});
  c.push_back({"conv2d stride 2 dilation 2 groups 2", {{2, 4, 11, 10}, {6, 2, 3, 3}},
               [](V x) { return op::conv2d(x[0], x[1], AnyTensor(), {{2, 2}, {1, 2}, {2, 2}, 2}); }, -1, 1, true});
  c.push_back({"max_pool2d 3x3 s2 p1 ceil", {{2, 3, 9, 10}},
               [](V x) { return op::max_pool2d(x[0], {{3, 3}, {2, 2}, {1, 1}, true}); }});
  c.push_back({"avg_pool2d 3x3 s2 p1 exclude pad", {{2, 3, 9, 10}},
               [](V x) { return op::avg_pool2d(x[0], {{3, 3}, {2, 2}, {1, 1}, false, false}); }});
  c.push_back({"adaptive_avg_pool2d", {{2, 3, 9, 10}}, [](V x) { return op::adaptive_avg_pool2d(x[0], {4, 3}); }});
  return c;
}

}  // namespace

TEST_CASE("op parity CPU vs CUDA, float32, forward and backward", "[parity][gpu]") {
  EMBER_REQUIRE_GPU();
  for (const ParityCase& c : cases()) {
    SECTION(c.name) { run_parity(c, DType::Float32); }
  }
}

TEST_CASE("op parity CPU vs CUDA, float16, forward and backward", "[parity][gpu]") {
  EMBER_REQUIRE_GPU();
  for (const ParityCase& c : cases()) {
    SECTION(c.name) { run_parity(c, DType::Float16); }
  }
}

TEST_CASE("op parity CPU vs CUDA, bfloat16, forward and backward", "[parity][gpu]") {
  EMBER_REQUIRE_GPU();
  for (const ParityCase& c : cases()) {
    SECTION(c.name) { run_parity(c, DType::BFloat16); }
  }
}

TEST_CASE("op parity harness runs end to end against a pretend device when there is no GPU", "[parity]") {
  // Checks the harness itself (device moves, backward on both sides, comparisons), so that on a
  // GPU a failure points at the CUDA backend, not at this file. With a GPU the real tests run.
  testing::PretendGpu pretend;
  if (!pretend.active) return;
  for (const ParityCase& c : cases()) {
    SECTION(c.name) {
      run_parity(c, DType::Float32);
      run_parity(c, DType::BFloat16);
    }
  }
}

TEST_CASE("random numbers are identical on CPU and CUDA for the same seed and offset", "[parity][gpu][random]") {
  EMBER_REQUIRE_GPU();
  Generator a(123), b(123);
  auto u_cpu = Tensor<float>::rand({1001}, Device::cpu(), -1.0, 1.0, a).to_vector();
  auto u_gpu = Tensor<float>::rand({1001}, Device::cuda(0), -1.0, 1.0, b).to_vector();
  CHECK(u_cpu == u_gpu);
  auto n_cpu = Tensor<double>::randn({1001}, Device::cpu(), 0.0, 1.0, a).to_vector();
  auto n_gpu = Tensor<double>::randn({1001}, Device::cuda(0), 0.0, 1.0, b).to_vector();
  for (size_t i = 0; i < n_cpu.size(); ++i) CHECK(n_cpu[i] == Approx(n_gpu[i]).epsilon(1e-12).margin(1e-12));
}

TEST_CASE("memory statistics on CUDA count what tensors hold", "[parity][gpu][memory]") {
  EMBER_REQUIRE_GPU();
  Device d = Device::cuda(0);
  reset_peak_memory(d);
  const int64_t before = memory_stats(d).current_bytes;
  {
    auto t = Tensor<float>::zeros({1 << 20}, d);
    CHECK(memory_stats(d).current_bytes - before == (1 << 22));
  }
  CHECK(memory_stats(d).current_bytes == before);
  CHECK(memory_stats(d).peak_bytes >= before + (1 << 22));
  set_memory_limit(d, before + 1024);
  CHECK_THROWS_AS(Tensor<float>::zeros({1 << 20}, d), OutOfMemory);
  set_memory_limit(d, -1);
}
