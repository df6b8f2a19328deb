// What the profiler costs per op (docs/profiling.md), on the CPU:
//   off: the hook an op runs with no profiler recording (op::detail::OpScope: one load, one
//        branch), timed alone in a loop, and as the difference between a tiny op with and
//        without it compiled in cannot be separated from noise, the hook alone is what counts;
//   on:  the same tiny op (a 1-element add) with a session recording, minus the op with none:
//        the record of one op (two clock reads, a mutex, the shape text, memory reading).
// Targets: off under 20 ns, on under 1 us. Plain main, no Google Benchmark:
//   ./bench_profiler [--ops 200000] [--repeats 5]
// Prints the median over the repeats of each figure.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include <ember/ember.hpp>
#include <ember/profile/profiler.hpp>

using namespace ember;

namespace {

// The calling thread's CPU time: on a shared machine (other processes on the same cores) wall
// time also counts the time this thread was not running; both are printed.
double cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}
double wall_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Timing {
  double cpu_ns, wall_ns;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ns per iteration of f over n iterations (thread CPU time and wall time).
template <class F>
Timing per_iter_ns(int64_t n, F&& f) {
  const double c0 = cpu_s(), w0 = wall_s();
  for (int64_t i = 0; i < n; ++i) f(i);
  return {(cpu_s() - c0) * 1e9 / static_cast<double>(n), (wall_s() - w0) * 1e9 / static_cast<double>(n)};
}
double median_of(const std::vector<Timing>& v, bool cpu) {
  std::vector<double> x;
  for (const Timing& t : v) x.push_back(cpu ? t.cpu_ns : t.wall_ns);
  return median(x);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t ops = 200000;
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--ops")) ops = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--repeats")) repeats = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--ops N] [--repeats R]\n", argv[0]);
      return 2;
    }
  }
  Tensor<float> a = Tensor<float>::ones({1}), b = Tensor<float>::ones({1});
  AnyTensor aa = a, bb = b;
  volatile int sink = 0;

  std::vector<Timing> hook_off, module_off, op_off, op_on, range_on;
  nn::Linear lin(1, 1);
  for (int r = 0; r < repeats; ++r) {
    // The hook alone, no profiler: construct and destroy the scope an op opens.
    hook_off.push_back(per_iter_ns(ops * 10, [&](int64_t) {
      op::detail::OpScope scope("add", aa, bb);
      sink = sink + 1;
    }));
    module_off.push_back(per_iter_ns(ops * 10, [&](int64_t) {
      nn::detail::ModuleScope scope(lin);
      sink = sink + 1;
    }));
    // A tiny op, no profiler.
    op_off.push_back(per_iter_ns(ops, [&](int64_t) { (void)op::add(aa, bb); }));
    // The same op with a session recording (events kept in memory, as in a real session).
    profile::Profiler p;
    p.start();
    op_on.push_back(per_iter_ns(ops, [&](int64_t) { (void)op::add(aa, bb); }));
    range_on.push_back(per_iter_ns(ops, [&](int64_t) { profile::Range range("r"); }));
    p.stop();
  }
  std::printf("ops per measurement: %lld, repeats: %d (medians; ns per op, thread CPU time / wall time)\n",
              static_cast<long long>(ops), repeats);
  auto row = [&](const char* what, const std::vector<Timing>& t, const char* note) {
    std::printf("%-48s %9.1f / %9.1f ns  %s\n", what, median_of(t, true), median_of(t, false), note);
  };
  row("op hook, profiler off (OpScope alone)", hook_off, "(target < 20 ns)");
  row("module hook, profiler off (ModuleScope alone)", module_off, "");
  row("1-element add, profiler off", op_off, "");
  row("1-element add, profiler on", op_on, "");
  row("user range, profiler on (begin + end)", range_on, "");
  const double off = median_of(hook_off, true);
  const double rec_cpu = median_of(op_on, true) - median_of(op_off, true);
  const double rec_wall = median_of(op_on, false) - median_of(op_off, false);
  std::printf("%-48s %9.1f / %9.1f ns  (target < 1000 ns)\n", "cost of recording one op (on - off)", rec_cpu, rec_wall);
  const bool ok = off < 20.0 && rec_cpu < 1000.0;
  std::printf("%s (on thread CPU time)\n", ok ? "targets met" : "TARGETS MISSED");
  return sink == -1 ? 1 : 0;
}
