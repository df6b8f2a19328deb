// Threads inside an op (backend/cpu/parallel.hpp): parallel_for's chunks, nesting and exceptions;
// the thread count (set_num_threads, and its default from EMBER_NUM_THREADS / OMP_NUM_THREADS);
// OpenBLAS's threads; and the threaded elementwise and reduction kernels, whose results do not
// depend on the thread count. (Threads of the program itself, one model per thread: test_threads.)
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <stdexcept>
#include <vector>

#include <ember/backend/cpu/parallel.hpp>
#include <ember/ember.hpp>

#include "test_util.hpp"

using namespace ember;
using namespace ember::testing;

TEST_CASE("parallel_for covers the range exactly once, in chunks of at least the grain", "[parallel][threads]") {
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

TEST_CASE("parallel_for stays serial inside a parallel region and rethrows a chunk's exception",
          "[parallel][threads]") {
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

TEST_CASE("set_num_threads rejects counts below 1", "[parallel][threads]") {
  ThreadsGuard guard;
  REQUIRE(get_num_threads() >= 1);
  REQUIRE_THROWS_WITH(set_num_threads(0), Catch::Contains("set_num_threads") && Catch::Contains("got 0"));
  REQUIRE_THROWS_AS(set_num_threads(-3), ValueError);
}

TEST_CASE("default thread count: EMBER_NUM_THREADS, else OMP_NUM_THREADS, else the cores", "[parallel][threads]") {
  using ember::detail::default_num_threads;
  using ember::detail::parse_thread_count;
  CHECK(default_num_threads(nullptr, nullptr, 6) == 6);
  CHECK(default_num_threads("3", "5", 6) == 3);
  CHECK(default_num_threads(nullptr, "5", 6) == 5);
  CHECK(default_num_threads(nullptr, "4,2", 6) == 4);  // OpenMP's nested list: its first level
  CHECK(default_num_threads(" 2 ", nullptr, 6) == 2);
  // Not a whole number >= 1: unset, the next source decides.
  for (const char* bad : {"", "0", "-1", "auto", "4x", "1e3", "99999999999"}) {
    CAPTURE(bad);
    CHECK(parse_thread_count(bad) == 0);
    CHECK(default_num_threads(bad, "5", 6) == 5);
    CHECK(default_num_threads(nullptr, bad, 6) == 6);
  }
  CHECK(default_num_threads(nullptr, nullptr, 0) == 1);
}

#if defined(EMBER_OPENBLAS_WEAK)
extern "C" int openblas_get_num_threads(void) __attribute__((weak));
extern "C" int openblas_get_parallel(void) __attribute__((weak));  // 0 serial, 1 pthreads, 2 OpenMP
#endif

// CMake linked OpenBLAS's OpenMP build (cmake/EmberBlas.cmake): the loader must have taken it, not
// the pthread build that libopenblas.so.0 names by default (the RUNPATH decides).
TEST_CASE("OpenBLAS is the OpenMP build that CMake chose", "[parallel][threads]") {
#if defined(EMBER_TEST_OPENBLAS_OPENMP) && defined(EMBER_OPENBLAS_WEAK)
  REQUIRE(openblas_get_parallel != nullptr);
  CHECK(openblas_get_parallel() == 2);
#else
  WARN("SKIPPED: CMake did not choose OpenBLAS's OpenMP build (not installed, no OpenMP, or EMBER_BLAS_OPENMP=OFF)");
#endif
}

// ctest runs each test case in a process of its own, so the default is still unread here.
TEST_CASE("EMBER_NUM_THREADS reaches OpenBLAS at the first GEMM", "[parallel][threads]") {
#if defined(EMBER_OPENBLAS_WEAK)
  if (openblas_get_num_threads == nullptr) {
    WARN("SKIPPED: the program does not link OpenBLAS");
    return;
  }
  ::setenv("EMBER_NUM_THREADS", "1", 1);
  if (get_num_threads() != 1) {
    WARN("SKIPPED: the thread default was read before this test (run it in a process of its own)");
    return;
  }
  auto a = Tensor<float>::ones({64, 64}), b = Tensor<float>::ones({64, 64});
  auto c = ember::matmul(a, b);
  CHECK(c.to_vector()[0] == 64.0f);
  CHECK(openblas_get_num_threads() == 1);
#else
  WARN("SKIPPED: built without OpenBLAS");
#endif
}

// ---------------------------------------------------------------- threaded elementwise / reductions

TEST_CASE("threaded kernels: add, broadcast add, relu, cast, sum and softmax do not depend on the thread count",
          "[parallel][threads]") {
  ThreadsGuard guard;
  Generator gen(7);
  auto a = Tensor<float>::randn({300, 1000}, Device::cpu(), 0.0, 1.0, gen);
  auto b = Tensor<float>::randn({300, 1000}, Device::cpu(), 0.0, 1.0, gen);
  auto bias = Tensor<float>::randn({1000}, Device::cpu(), 0.0, 1.0, gen);
  auto col = Tensor<float>::randn({300, 1}, Device::cpu(), 0.0, 1.0, gen);
  auto run = [&] {
    std::vector<std::vector<float>> out;
    out.push_back(to_vec<float>(a + b));
    out.push_back(to_vec<float>(a + bias));
    out.push_back(to_vec<float>(a * col));
    out.push_back(to_vec<float>(relu(a)));
    out.push_back(to_vec<float>(exp(a)));
    out.push_back(to_vec<float>(sum(a, std::vector<int>{1}, false)));
    out.push_back(to_vec<float>(sum(a, std::vector<int>{0}, false)));
    out.push_back(to_vec<float>(sum(a)));
    out.push_back(to_vec<float>(softmax(a, -1)));
    out.push_back(to_vec<float>(log_softmax(a, -1)));
    out.push_back(to_vec<float>(Tensor<float>(a.to(DType::Float64).to(DType::Float32))));
    return out;
  };
  set_num_threads(1);
  auto one = run();
  set_num_threads(2);
  auto two = run();
  set_num_threads(3);
  auto three = run();
  REQUIRE(one == two);
  REQUIRE(one == three);
  // and against plain references
  const auto av = a.to_double_vector(), bv = b.to_double_vector(), biasv = bias.to_double_vector();
  const auto colv = col.to_double_vector();
  for (size_t i = 0; i < av.size(); i += 997) {
    REQUIRE(one[0][i] == static_cast<float>(av[i] + bv[i]));
    REQUIRE(one[1][i] == static_cast<float>(av[i] + biasv[i % 1000]));
    REQUIRE(one[2][i] == static_cast<float>(av[i] * colv[i / 1000]));
    REQUIRE(one[3][i] == static_cast<float>(std::max(av[i], 0.0)));
  }
  double total = 0;
  for (double v : av) total += v;
  REQUIRE(std::abs(one[7][0] - total) < 1e-3);
  for (int64_t r = 0; r < 300; r += 37) {
    double mx = -1e30, s = 0, rs = 0;
    for (int64_t j = 0; j < 1000; ++j) mx = std::max(mx, av[static_cast<size_t>(r * 1000 + j)]);
    for (int64_t j = 0; j < 1000; ++j) s += std::exp(av[static_cast<size_t>(r * 1000 + j)] - mx);
    for (int64_t j = 0; j < 1000; ++j) rs += av[static_cast<size_t>(r * 1000 + j)];
    REQUIRE(std::abs(one[5][static_cast<size_t>(r)] - rs) < 1e-3);
    for (int64_t j = 0; j < 1000; j += 101) {
      const double p = std::exp(av[static_cast<size_t>(r * 1000 + j)] - mx) / s;
      REQUIRE(std::abs(one[8][static_cast<size_t>(r * 1000 + j)] - p) <= 1e-6 * p + 1e-9);
      REQUIRE(std::abs(one[9][static_cast<size_t>(r * 1000 + j)] - std::log(p)) <= 2e-6 * (1 + std::abs(std::log(p))));
    }
  }
}
