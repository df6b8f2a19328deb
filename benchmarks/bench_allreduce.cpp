// All-reduce bandwidth of dist::MpiProcessGroup (CPU tensors), reported as nccl-tests does:
//   algbw = bytes / time,  busbw = algbw * 2 (n - 1) / n   (n ranks; busbw is what each link moved
//   by a bandwidth-optimal ring, comparable across rank counts).
// Message sizes from 4 KB to 64 MB (float32, doubling). Not a Google Benchmark: every rank must run
// the same number of iterations, so the counts are fixed per size. Run:
//   mpirun -np 2 ./bench_allreduce [min_bytes] [max_bytes]
// Times are the slowest rank's (max over ranks) average per all_reduce, after warm-up.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "ember/dist/mpi.hpp"

using namespace ember;

int main(int argc, char** argv) {
  int64_t min_bytes = argc > 1 ? std::atoll(argv[1]) : 4 << 10;
  int64_t max_bytes = argc > 2 ? std::atoll(argv[2]) : 64 << 20;
  auto pg = dist::init_from_environment({.timeout = std::chrono::minutes(2)});
  const int n = pg->size();
  if (pg->rank() == 0) {
    std::printf("# ember bench_allreduce: MPI backend, %d ranks, float32 sum, in place\n", n);
    std::printf("# %12s %12s %8s %12s %10s %10s %8s\n", "size(B)", "count", "iters", "time(us)", "algbw(GB/s)",
                "busbw(GB/s)", "check");
  }
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const int64_t count = bytes / 4;
    FloatTensor t = FloatTensor::full({count}, 1.0);
    const int iters = static_cast<int>(std::clamp<int64_t>((int64_t{512} << 20) / bytes, 5, 200));
    for (int i = 0; i < 3; ++i) pg->all_reduce(t);  // warm-up
    // Check: after warm-up every element is n^3 (1 -> n -> n^2 -> n^3).
    float want = static_cast<float>(n) * n * n;
    bool ok = t.data()[0] == want && t.data()[count - 1] == want;
    FloatTensor fill = FloatTensor::full({count}, 0.0);
    pg->barrier();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) pg->all_reduce(fill);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    DoubleTensor slowest = DoubleTensor::full({1}, secs);
    pg->all_reduce(slowest, dist::ReduceOp::Max);
    secs = slowest.item();
    double algbw = static_cast<double>(bytes) / secs / 1e9;
    double busbw = algbw * 2.0 * (n - 1) / n;
    if (pg->rank() == 0) {
      std::printf("  %12lld %12lld %8d %12.1f %10.2f %10.2f %8s\n", static_cast<long long>(bytes),
                  static_cast<long long>(count), iters, secs * 1e6, algbw, busbw, ok ? "ok" : "WRONG");
      std::fflush(stdout);
    }
  }
  return 0;
}
