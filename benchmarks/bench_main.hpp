#pragma once
// What every Google Benchmark program of ember shares: main() (OPENBLAS_CORETYPE in the output's
// context, the CPU benchmarks, the same benchmarks on cuda:0 when a GPU is present, then Google Benchmark),
// bench::reg (registration that turns a failing case into an error row of the JSON instead of
// ending the program) and bench::timed (one iteration timed the way the PyTorch twin,
// benchmarks/bench_torch.py, times its calls).
//
// Timing, the same on both sides of an ember/PyTorch ratio: on a CUDA device, a CUDA event is
// recorded on ember's stream before and after the iteration's work and the host waits for the
// second one; the elapsed time between the events is the iteration's time (Google Benchmark's
// manual time). bench_torch.py records torch.cuda.Event pairs around each call the same way. A
// host synchronisation timed with a wall clock (what the benchmarks did before) adds the launch
// and wake-up latency of every iteration to ember's side only. On the CPU the work is timed with
// steady_clock. Run the CUDA cases alone with --benchmark_filter=_cuda.
#include <benchmark/benchmark.h>

#include <chrono>
#include <exception>
#include <string>

#include <ember/ember.hpp>

#if defined(EMBER_BENCH_HAVE_CUDA)
#include <cuda_runtime.h>

#include <ember/backend/cuda/runtime.hpp>
#endif

#include <cstdlib>

namespace bench {

using Case = void (*)(benchmark::State&, ember::Device);

// Registers `fn` on `dev` as `name`, timed by bench::timed (manual time). An exception from the
// case (an op that fails on this device, a CUDA error) becomes SkipWithError: the case is an
// error row in the output with the message, and the program goes on with the next case.
inline benchmark::internal::Benchmark* reg(const std::string& name, Case fn, ember::Device dev) {
  return benchmark::RegisterBenchmark(name.c_str(),
                                      [fn, dev](benchmark::State& state) {
                                        try {
                                          fn(state, dev);
                                        } catch (const std::exception& e) {
                                          state.SkipWithError(e.what());
                                        } catch (...) {
                                          state.SkipWithError("unknown exception");
                                        }
                                      })
      ->UseManualTime();
}

#if defined(EMBER_BENCH_HAVE_CUDA)
namespace detail {
// Two events per device, made once and never destroyed (cheap, and valid until the process ends).
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
};
inline EventPair& events(int device) {
  static EventPair pairs[64];
  EventPair& p = pairs[device];
  if (!p.start) {
    ember::cuda::DeviceGuard guard(device);
    EMBER_CUDA_CHECK(cudaEventCreate(&p.start));
    EMBER_CUDA_CHECK(cudaEventCreate(&p.stop));
  }
  return p;
}
}  // namespace detail
#endif

// One iteration of `work` on `dev`, its time given to Google Benchmark (register with
// UseManualTime(), as bench::reg does). Use inside the loop: for (auto _ : state) bench::timed(...).
template <class F>
void timed(benchmark::State& state, ember::Device dev, F&& work) {
#if defined(EMBER_BENCH_HAVE_CUDA)
  if (dev.is_cuda()) {
    detail::EventPair& e = detail::events(dev.index());
    cudaStream_t s = ember::cuda::current_stream(dev.index());
    EMBER_CUDA_CHECK(cudaEventRecord(e.start, s));
    work();
    EMBER_CUDA_CHECK(cudaEventRecord(e.stop, s));
    EMBER_CUDA_CHECK(cudaEventSynchronize(e.stop));
    float ms = 0.0f;
    EMBER_CUDA_CHECK(cudaEventElapsedTime(&ms, e.start, e.stop));
    state.SetIterationTime(static_cast<double>(ms) * 1e-3);
    return;
  }
#endif
  const auto t0 = std::chrono::steady_clock::now();
  work();
  ember::backend_for(dev).synchronize();
  state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// register_all(device, suffix) registers one program's benchmarks for a device.
inline int run(int argc, char** argv, void (*register_all)(ember::Device, const std::string&)) {
  // Which OpenBLAS kernels ran depends on OPENBLAS_CORETYPE (read when OpenBLAS loads): say it
  // in the output's context rather than changing it (a program should not rewrite its environment).
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  benchmark::AddCustomContext("OPENBLAS_CORETYPE", coretype ? coretype : "(unset: OpenBLAS's own choice)");
  register_all(ember::Device::cpu(), "_cpu");
  if (ember::cuda::is_available()) register_all(ember::Device::cuda(0), "_cuda");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace bench
