// Threading (backend/cpu/parallel.hpp), the threaded CPU kernels and the fused ops (LayerNorm,
// RMSNorm, softmax/log_softmax, cross-entropy from logits): values against plain references,
// gradient checks in double, results independent of the thread count, bad inputs, and CPU-versus-
// CUDA parity (real GPU, else skipped; the pretend device checks the device plumbing in CI).
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <stdexcept>
#include <vector>

#include <ember/ember.hpp>

#include "gpu_skip.hpp"
#include "gradcheck.hpp"
#include "pretend_gpu.hpp"

using namespace ember;

namespace {

// Restores the thread count a test changed.
struct ThreadsGuard {
  int saved = get_num_threads();
  ~ThreadsGuard() { set_num_threads(saved); }
};

}  // namespace

TEST_CASE("parallel_for covers the range exactly once, in chunks of at least the grain", "[fused][threads]") {
  ThreadsGuard guard;
  for (int threads : {1, 2, 3, 8}) {
    set_num_threads(threads);
    REQUIRE(get_num_threads() == threads);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{100003}}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int> calls{0}, empty{0};
      cpu::parallel_for(5, 5 + n, 100, [&](int64_t lo, int64_t hi) {  // Catch2 asserts are not thread-safe
        calls.fetch_add(1);
        if (lo >= hi) empty.fetch_add(1);
        for (int64_t i = lo; i < hi; ++i) hits[static_cast<size_t>(i - 5)].fetch_add(1);
      });
      REQUIRE(empty.load() == 0);
      for (int64_t i = 0; i < n; ++i) REQUIRE(hits[static_cast<size_t>(i)].load() == 1);
      if (n == 0) REQUIRE(calls.load() == 0);
      if (n > 0 && n <= 100) REQUIRE(calls.load() == 1);  // below the grain: serial, one call
      REQUIRE(calls.load() <= threads);
      if (has_openmp() && threads > 1 && n == 100003) REQUIRE(calls.load() > 1);
    }
  }
}

TEST_CASE("parallel_for stays serial inside a parallel region and rethrows a chunk's exception", "[fused][threads]") {
  ThreadsGuard guard;
  set_num_threads(2);
  std::atomic<int> inner_calls{0}, whole{0};
  cpu::parallel_for(0, 1 << 20, 1, [&](int64_t, int64_t) {
    cpu::parallel_for(0, 1 << 20, 1, [&](int64_t lo, int64_t hi) {
      inner_calls.fetch_add(1);
      if (lo == 0 && hi == (1 << 20)) whole.fetch_add(1);  // nested: one serial call over everything
    });
  });
  REQUIRE(inner_calls.load() == (has_openmp() ? 2 : 1));
  REQUIRE(whole.load() == inner_calls.load());
  REQUIRE_THROWS_AS(cpu::parallel_for(0, 1 << 20, 1,
                                      [&](int64_t lo, int64_t) {
                                        if (lo == 0) throw ValueError("chunk failed");
                                      }),
                    ValueError);
}

TEST_CASE("set_num_threads rejects counts below 1", "[fused][threads]") {
  ThreadsGuard guard;
  REQUIRE(get_num_threads() >= 1);
  REQUIRE_THROWS_WITH(set_num_threads(0), Catch::Contains("set_num_threads") && Catch::Contains("got 0"));
  REQUIRE_THROWS_AS(set_num_threads(-3), ValueError);
}
