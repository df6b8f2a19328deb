// Core op throughput against the floor each op should reach:
//  - matmul: ember's op vs calling the BLAS directly on the same sizes (GFLOP/s);
//  - elementwise and reductions: ember's op vs memcpy moving the same bytes (GB/s).
// Run: ./build/benchmarks/bench_core [--benchmark_filter=...] [--benchmark_format=json]
// On a GPU (CUDA backend and a device present) the same ops also run on cuda:0 (bench *_cuda).
#include <benchmark/benchmark.h>

#include <cstring>
#include <string>
#include <vector>

#include <ember/ember.hpp>

#include "bench_main.hpp"

using namespace ember;

namespace {

// ---- matmul --------------------------------------------------------------------------------
void BM_matmul_ember(benchmark::State& state, Device dev) {
  const int64_t n = state.range(0);
  auto a = Tensor<float>::randn({n, n}, dev), b = Tensor<float>::randn({n, n}, dev);
  for (auto _ : state)
    bench::timed(state, dev, [&] {
      auto c = matmul(a, b);
      benchmark::DoNotOptimize(c.data_ptr());
    });
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}

// The same product through the backend's GEMM entry with a preallocated output: the BLAS call
// and nothing else (on the CPU this is OpenBLAS's sgemm, on CUDA cuBLAS).
void BM_matmul_blas_direct(benchmark::State& state, Device dev) {
  const int64_t n = state.range(0);
  auto a = Tensor<float>::randn({n, n}, dev), b = Tensor<float>::randn({n, n}, dev);
  auto c = Tensor<float>::empty({n, n}, dev);
  GemmArgs g;
  g.m = g.n = g.k = n;
  g.a = a.data_ptr();
  g.b = b.data_ptr();
  g.c = c.data_ptr();
  g.lda = g.ldb = g.ldc = n;
  for (auto _ : state)
    bench::timed(state, dev, [&] {
      backend_for(dev).gemm(g);
      benchmark::DoNotOptimize(c.data_ptr());
    });
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}

// ---- memory-bound ops ----------------------------------------------------------------------
void set_bytes(benchmark::State& state, double bytes_per_iter) {
  state.counters["GB/s"] =
      benchmark::Counter(bytes_per_iter, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

// memcpy of n floats into a preallocated buffer: reads 4n bytes, writes 4n bytes.
void BM_memcpy(benchmark::State& state, Device dev) {
  const int64_t n = state.range(0);
  auto a = Tensor<float>::randn({n}, dev), b = Tensor<float>::empty({n}, dev);
  for (auto _ : state)
    bench::timed(state, dev, [&] {
      backend_for(dev).copy(b.data_ptr(), a.data_ptr(), static_cast<size_t>(n) * 4);
    });
  set_bytes(state, 8.0 * static_cast<double>(n));
}

void BM_add(benchmark::State& state, Device dev) {  // reads 8n, writes 4n
  const int64_t n = state.range(0);
  auto a = Tensor<float>::randn({n}, dev), b = Tensor<float>::randn({n}, dev);
  for (auto _ : state)
    bench::timed(state, dev, [&] {
      auto c = a + b;
      benchmark::DoNotOptimize(c.data_ptr());
    });
  set_bytes(state, 12.0 * static_cast<double>(n));
}

void BM_mul_scalar(benchmark::State& state, Device dev) {  // reads 4n, writes 4n
  const int64_t n = state.range(0);
  auto a = Tensor<float>::randn({n}, dev);
  for (auto _ : state)
    bench::timed(state, dev, [&] {
      auto c = a * 1.5;
      benchmark::DoNotOptimize(c.data_ptr());
    });
  set_bytes(state, 8.0 * static_cast<double>(n));
}

void BM_relu(benchmark::State& state, Device dev) {  // reads 4n, writes 4n
  const int64_t n = state.range(0);
  auto a = Tensor<float>::randn({n}, dev);
  for (auto _ : state)
    bench::timed(state, dev, [&] {
      auto c = relu(a);
      benchmark::DoNotOptimize(c.data_ptr());
    });
  set_bytes(state, 8.0 * static_cast<double>(n));
}

void BM_sum_rows(benchmark::State& state, Device dev) {  // reads 4n (a [n/1024, 1024] matrix, sum per row)
  const int64_t n = state.range(0);
  auto a = Tensor<float>::randn({n / 1024, 1024}, dev);
  for (auto _ : state)
    bench::timed(state, dev, [&] {
      auto c = sum(a, {1});
      benchmark::DoNotOptimize(c.data_ptr());
    });
  set_bytes(state, 4.0 * static_cast<double>(n));
}

void BM_softmax_rows(benchmark::State& state, Device dev) {  // reads 4n, writes 4n
  const int64_t n = state.range(0);
  auto a = Tensor<float>::randn({n / 1024, 1024}, dev);
  for (auto _ : state)
    bench::timed(state, dev, [&] {
      auto c = softmax(a, 1);
      benchmark::DoNotOptimize(c.data_ptr());
    });
  set_bytes(state, 8.0 * static_cast<double>(n));
}

void register_all(Device dev, const std::string& suffix) {
  auto reg = [&](const std::string& name, bench::Case fn) { return bench::reg(name + suffix, fn, dev); };
  const int64_t mm = dev.is_cpu() ? 1024 : 4096;
  reg("matmul_ember", BM_matmul_ember)->Arg(256)->Arg(mm)->Unit(benchmark::kMillisecond);
  reg("matmul_blas_direct", BM_matmul_blas_direct)->Arg(256)->Arg(mm)->Unit(benchmark::kMillisecond);
  const int64_t n = dev.is_cpu() ? (1 << 22) : (1 << 26);
  for (auto [name, fn] : std::vector<std::pair<std::string, bench::Case>>{
           {"memcpy", BM_memcpy}, {"add", BM_add}, {"mul_scalar", BM_mul_scalar}, {"relu", BM_relu},
           {"sum_rows", BM_sum_rows}, {"softmax_rows", BM_softmax_rows}})
    reg(name, fn)->Arg(n)->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) { return bench::run(argc, argv, register_all); }
