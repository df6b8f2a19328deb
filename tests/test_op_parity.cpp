// CPU versus CUDA parity of every case in the registry of op cases (tests/op_cases.hpp), forward
// and backward, through the public op API (the backend-level kernel parity is in
// test_backend_parity.cpp): one test per op and dtype, "parity CPU vs CUDA <dtype>: <op>", in each
// of its op's dtypes (float32, float16 and bfloat16 unless it says otherwise). They run when a GPU
// is present; otherwise each prints "SKIPPED: no GPU" and ctest counts it as skipped, and the
// harness itself runs against a pretend cuda:0 made of CPU kernels ("parity harness, pretend
// device: <op>"). Tolerances: the op's class (tests/op_case.hpp), relative to the CPU result's
// largest magnitude; four times as much for gradients.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "gpu_skip.hpp"
#include "op_cases.hpp"
#include "pretend_gpu.hpp"
#include <ember/ember.hpp>

using namespace ember;
using namespace ember::testing;

namespace {

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

void run_parity(const std::string& op, const OpCase& c, DType dt) {
  const std::string what = op + " " + c.variant;
  std::vector<AnyTensor> cpu_in = case_inputs(c, 99, dt), gpu_in;
  for (AnyTensor& x : cpu_in) {
    AnyTensor xc = x.to(Device::cuda(0));
    if (c.differentiable && is_floating(dt)) {
      x.set_requires_grad(true);
      xc.set_requires_grad(true);
    }
    gpu_in.push_back(xc);
  }
  AnyTensor y_cpu = c.fn(cpu_in), y_gpu = c.fn(gpu_in);
  REQUIRE(y_gpu.device() == Device::cuda(0));
  const double tol = parity_tolerance(dt, c.tolerance);
  check_close(y_cpu, y_gpu, tol, what + " forward " + dtype_name(dt));
  if (!c.differentiable || !y_cpu.requires_grad()) return;
  Generator gen(100);
  AnyTensor gy = Tensor<float>::rand(y_cpu.shape(), Device::cpu(), -1.0, 1.0, gen).to(y_cpu.dtype());
  y_cpu.backward(gy);
  y_gpu.backward(gy.to(Device::cuda(0)));
  for (size_t i = 0; i < cpu_in.size(); ++i) {
    if (!cpu_in[i].grad().defined()) continue;
    REQUIRE(gpu_in[i].grad().defined());
    check_close(cpu_in[i].grad(), gpu_in[i].grad(), tol * 4, what + " grad of input " + std::to_string(i));
  }
}

bool has_parity(const OpSpec& op) {
  for (const OpCase& c : op.cases)
    if (c.parity) return true;
  return false;
}

void check_parity(const OpSpec& op, DType dt) {
  for (const OpCase& c : op.cases)
    if (c.parity) run_parity(op.name, c, dt);
}

const bool registered = [] {
  for (const OpSpec& op : op_registry()) {
    if (!has_parity(op)) continue;
    for (DType dt : op.dtypes)
      register_test_case(std::string("parity CPU vs CUDA ") + dtype_name(dt) + ": " + op.name,
                         "[parity][gpu][" + op.family + "]", [&op, dt] {
                           EMBER_REQUIRE_GPU();
                           check_parity(op, dt);
                         });
    // Checks the harness itself (device moves, backward on both sides, comparisons), so that on a
    // GPU a failure points at the CUDA backend, not at this file. With a GPU the real tests run.
    register_test_case("parity harness, pretend device, " + dtype_list(op.dtypes) + ": " + op.name,
                       "[parity][" + op.family + "]", [&op] {
                         testing::PretendGpu pretend;
                         if (!pretend.active) return;
                         for (DType dt : op.dtypes) check_parity(op, dt);
                       });
  }
  return true;
}();

}  // namespace

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
