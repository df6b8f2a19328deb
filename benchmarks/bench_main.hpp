#pragma once
// The main() every Google Benchmark program of ember shares: the OpenBLAS core-type fix, the
// CPU benchmarks, the same benchmarks on cuda:0 when a GPU is present, then Google Benchmark.
#include <benchmark/benchmark.h>

#include <string>

#include <ember/ember.hpp>

#include "../examples/common/openblas_env.hpp"

namespace bench {

// register_all(device, suffix) registers one program's benchmarks for a device.
inline int run(int argc, char** argv, void (*register_all)(ember::Device, const std::string&)) {
  examples::ensure_openblas_coretype(argv);
  register_all(ember::Device::cpu(), "_cpu");
  if (ember::cuda::is_available()) register_all(ember::Device::cuda(0), "_cuda");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace bench
