#pragma once
// CPU threading: one thread count for every ember CPU kernel and for the BLAS.
//
//   ember::set_num_threads(n)   n >= 1; ember's kernels and OpenBLAS (when linked) use n threads
//   ember::get_num_threads()    default: EMBER_NUM_THREADS, else OMP_NUM_THREADS, else the cores
//                               available to the process (sched_getaffinity)
//   ember::cpu::parallel_for(begin, end, grain, f)
//                               calls f(lo, hi) on contiguous chunks of [begin, end) that
//                               together cover it exactly once
//
// The threads come from OpenMP, which the CMake target ember::ember carries (OpenMP::OpenMP_CXX,
// option EMBER_OPENMP). A program compiled without OpenMP (no -fopenmp: _OPENMP undefined) gets
// the same results serially: every kernel splits its work so that each output element is
// computed by exactly one chunk, with the same arithmetic, so the thread count never changes a
// result (reductions that combine per-chunk partials say so where they do).
//
// parallel_for runs f serially (one call f(begin, end)) when the range is at most `grain` long,
// when one thread is set, when it is already inside an OpenMP parallel region (no nested teams:
// a kernel called from a threaded kernel stays on its thread), or without OpenMP. An exception
// thrown by f on any thread is rethrown on the caller after every chunk has finished.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>

#if defined(__linux__)
#include <sched.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "ember/core/error.hpp"

// OpenBLAS's own thread setting and kernel name, declared weak: they resolve to OpenBLAS when the
// program links it and to null with another BLAS or none, so ember never needs <cblas.h>.
#if defined(EMBER_HAVE_CBLAS) && (defined(__GNUC__) || defined(__clang__))
extern "C" {
void openblas_set_num_threads(int num_threads) __attribute__((weak));
char* openblas_get_corename(void) __attribute__((weak));
char* openblas_get_config(void) __attribute__((weak));
}
#define EMBER_OPENBLAS_WEAK 1
#endif

namespace ember {

namespace detail {

// The cores this process may run on (its affinity mask), at least 1.
inline int available_cores() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
#if defined(_OPENMP)
  return std::max(1, omp_get_num_procs());
#else
  return 1;
#endif
}

// A thread count from the environment: a whole number >= 1 (OpenMP's list form "4,2" gives its
// first level), else 0. Anything else ("", "auto", "-1", "4x") counts as unset.
inline int parse_thread_count(const char* value) {
  if (value == nullptr) return 0;
  long n = 0;
  const char* p = value;
  while (*p == ' ') ++p;
  if (*p < '0' || *p > '9') return 0;
  for (; *p >= '0' && *p <= '9'; ++p) {
    n = n * 10 + (*p - '0');
    if (n > 1 << 20) return 0;  // absurd: ignore
  }
  while (*p == ' ') ++p;
  if (*p != '\0' && *p != ',') return 0;
  return static_cast<int>(n);
}

// The default thread count: EMBER_NUM_THREADS, else OMP_NUM_THREADS (as PyTorch reads it), else
// the cores available to the process. So `OMP_NUM_THREADS=2 mpirun -np 4 ...` (four ranks sharing
// a machine) needs no code; set_num_threads overrides it.
inline int default_num_threads(const char* ember_env, const char* omp_env, int cores) {
  if (const int n = parse_thread_count(ember_env); n > 0) return n;
  if (const int n = parse_thread_count(omp_env); n > 0) return n;
  return std::max(1, cores);
}

inline std::atomic<int>& num_threads_slot() {
  static std::atomic<int> slot{
      default_num_threads(std::getenv("EMBER_NUM_THREADS"), std::getenv("OMP_NUM_THREADS"), available_cores())};
  return slot;
}

#if defined(_OPENMP)
// Sets this thread's OpenMP thread count (omp_get_max_threads, which oneDNN sizes its team by and
// OpenBLAS's OpenMP build reads) to n for one library call and puts the previous value back,
// also when the call throws: a program's own OpenMP setting is left as it was. Inside a parallel
// region nothing is changed (the libraries stay on the calling thread there).
class OmpThreadsForCall {
 public:
  explicit OmpThreadsForCall(int n) : before_(omp_in_parallel() ? n : omp_get_max_threads()), want_(n) {
    if (before_ != want_) omp_set_num_threads(want_);
  }
  ~OmpThreadsForCall() {
    if (before_ != want_) omp_set_num_threads(before_);
  }
  OmpThreadsForCall(const OmpThreadsForCall&) = delete;
  OmpThreadsForCall& operator=(const OmpThreadsForCall&) = delete;

 private:
  int before_, want_;
};
#endif

}  // namespace detail

// Sets the threads of ember's CPU kernels and, when ember was linked with OpenBLAS, of its GEMM.
// Takes effect for kernels started after the call; safe to call from any thread.
inline void set_num_threads(int n) {
  if (n < 1)
    throw ValueError("ember::set_num_threads: the thread count must be at least 1, got " + std::to_string(n));
  detail::num_threads_slot().store(n, std::memory_order_relaxed);
#if defined(_OPENMP)
  omp_set_num_threads(n);  // for OpenMP code outside ember's parallel_for (which names its team size)
#endif
#if defined(EMBER_OPENBLAS_WEAK)
  if (openblas_set_num_threads) openblas_set_num_threads(n);
#endif
}

inline int get_num_threads() { return detail::num_threads_slot().load(std::memory_order_relaxed); }

namespace detail {
// OpenBLAS reads OPENBLAS_NUM_THREADS or OMP_NUM_THREADS itself when it loads, but not
// EMBER_NUM_THREADS: without this, EMBER_NUM_THREADS=1 left OpenBLAS on every core, its idle
// threads spinning (sched_yield) beside ember's. Called before each BLAS call; acts once, and only
// when EMBER_NUM_THREADS is set (set_num_threads sets OpenBLAS itself), so that a program's own
// OPENBLAS_NUM_THREADS is otherwise left alone.
inline void apply_ember_threads_to_blas() {
#if defined(EMBER_OPENBLAS_WEAK)
  static const bool applied = [] {
    if (openblas_set_num_threads && parse_thread_count(std::getenv("EMBER_NUM_THREADS")) > 0)
      openblas_set_num_threads(get_num_threads());
    return true;
  }();
  (void)applied;
#endif
}
}  // namespace detail

// True when ember was compiled with OpenMP (parallel_for can use more than one thread).
constexpr bool has_openmp() {
#if defined(_OPENMP)
  return true;
#else
  return false;
#endif
}

// The BLAS kernel OpenBLAS chose for this CPU (e.g. "Haswell", "SkylakeX", "Zen"), or "" when the
// program was not linked with OpenBLAS. Benchmarks report it (OPENBLAS_CORETYPE may force it).
inline std::string blas_core_name() {
#if defined(EMBER_OPENBLAS_WEAK)
  if (openblas_get_corename) {
    const char* s = openblas_get_corename();
    return s ? std::string(s) : std::string();
  }
#endif
  return {};
}

namespace cpu {

// True inside a parallel region (an OpenMP team of more than one thread).
inline bool in_parallel_region() {
#if defined(_OPENMP)
  return omp_in_parallel() != 0;
#else
  return false;
#endif
}

// Calls f(lo, hi) over [begin, end) split into at most get_num_threads() contiguous chunks of at
// least `grain` elements each (grain < 1 counts as 1). Chunk bounds depend only on the range,
// grain and thread count.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& f) {
  if (end <= begin) return;
  [[maybe_unused]] const int64_t n = end - begin;
  grain = std::max<int64_t>(grain, 1);
#if defined(_OPENMP)
  const int threads = get_num_threads();
  if (threads > 1 && n > grain && !in_parallel_region()) {
    const int64_t chunks = std::min<int64_t>(threads, (n + grain - 1) / grain);
    std::exception_ptr error;
    std::mutex error_mutex;
#pragma omp parallel num_threads(static_cast<int>(chunks))
    {
      // The team may be smaller than asked (OMP_THREAD_LIMIT, dynamic teams): split by its size.
      const int64_t team = omp_get_num_threads();
      const int64_t t = omp_get_thread_num();
      const int64_t lo = begin + n * t / team, hi = begin + n * (t + 1) / team;
      if (lo < hi) {
        try {
          f(lo, hi);
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mutex);
          if (!error) error = std::current_exception();
        }
      }
    }
    if (error) std::rethrow_exception(error);
    return;
  }
#endif
  f(begin, end);
}

// Grain sizes (elements per chunk below which a kernel stays on one thread): a thread start and
// join costs a few microseconds, about what one core streams through in 32K floats.
inline constexpr int64_t kGrainElementwise = 32768;  // cheap per element (add, copy, relu, cast)
inline constexpr int64_t kGrainTranscendental = 4096;  // exp, tanh, erf, ... per element

// Rows per chunk for a row-wise kernel over rows of `cols` elements: about kGrainElementwise
// elements per chunk.
inline int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, kGrainElementwise / std::max<int64_t>(cols, 1)); }

}  // namespace cpu
}  // namespace ember
