// All-reduce bandwidth of ember's process groups, reported as nccl-tests does:
//   algbw = bytes / time,  busbw = algbw * 2 (n - 1) / n   (n ranks; busbw is what each link moved
//   by a bandwidth-optimal ring, comparable across rank counts; 0 for one rank).
// Message sizes double from --min-bytes to --max-bytes (float32, sum, in place). Not a Google
// Benchmark: every rank must run the same number of iterations, so the counts are fixed per size.
//
// Two programs are built from this file (benchmarks/CMakeLists.txt):
//   bench_allreduce       MPI backend only (dist::MpiProcessGroup, CPU tensors); needs ember::mpi.
//   bench_allreduce_nccl  NCCL backend (dist::NcclProcessGroup, float32 tensors on cuda:k), built
//                         where the CUDA backend is (EMBER_HAVE_CUDA); also the MPI backend when
//                         ember::mpi exists. Default backend: nccl.
// Run:
//   mpirun -np 2 ./bench_allreduce [--min-bytes N] [--max-bytes N] [--iters N]
//   mpirun -np 8 ./bench_allreduce_nccl [--max-bytes 256M]  one GPU per rank: cuda:<local rank>
//   ./bench_allreduce_nccl                                   one rank on cuda:0 (also without MPI)
//   ./bench_allreduce_nccl --single-process [--devices N]    one process drives the first N (default:
//       all) visible GPUs: NcclProcessGroup::create_all, the collectives of all devices issued by
//       one thread inside a dist::NcclGroup scope, as nccl.hpp prescribes
// Options: --backend mpi|nccl, --min-bytes N (default 4K), --max-bytes N (default 64M), --iters N
// (timed iterations per size; default 512 MiB / size, clamped to [5, 200]); sizes take a K, M or
// G suffix (binary). The old positional form `bench_allreduce [min_bytes] [max_bytes]` still works.
//
// Method, both backends: per size, 5 warm-up all-reduces of a tensor of ones, then the check (every
// element must be n^5: 1 -> n -> ... -> n^5; computed with min/max over the whole tensor, on the
// tensor's device), then the timed all-reduces of a tensor of zeros. MPI: blocking all_reduce
// calls between a barrier and the host clock. NCCL: the ranks are aligned (barrier, or a host wait
// for everything already issued in single-process mode), then all `iters` collectives are issued
// with all_reduce_async (handles kept, as DataParallel does with its buckets) and the host waits
// for all of them (a tight poll of the last collective's event, then the group's checked wait,
// NcclProcessGroup::synchronize()); time = host clock from the first issue to the end of that wait,
// as nccl-tests measures. Times are the slowest rank's (max over ranks) average per all_reduce; a
// wrong value on any rank prints WRONG and makes the exit status 1.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ember/ember.hpp"
#include "ember/ops/reduce.hpp"

#if EMBER_BENCH_MPI
#include "ember/dist/mpi.hpp"
#endif

#if EMBER_BENCH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include "ember/dist/nccl.hpp"
#endif

using namespace ember;

namespace {

constexpr int kWarmup = 5;

std::string g_program = "bench_allreduce";  // argv[0]'s base name, for messages

struct Options {
  std::string backend;  // "mpi" or "nccl"; empty: the program's default
  int64_t min_bytes = int64_t{4} << 10;
  int64_t max_bytes = int64_t{64} << 20;
  int iters = 0;  // 0: by size
  bool single_process = false;
  int devices = 0;  // single-process mode: the first N visible GPUs; 0: all
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const char* kUsage =
    "usage: bench_allreduce[_nccl] [--backend mpi|nccl] [--min-bytes N] [--max-bytes N] [--iters N]\n"
    "                              [--single-process [--devices N]]   (sizes: 4096, 4K, 64M, 1G)\n";

// "4096", "4K", "64M", "1G" (binary multiples; a trailing "B" or "iB" is allowed).
int64_t parse_bytes(const std::string& s, const char* what) {
  size_t pos = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &pos);
  } catch (const std::exception&) {
    throw UsageError(std::string(what) + ": not a size: '" + s + "'");
  }
  std::string suffix = s.substr(pos);
  for (auto& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int64_t mult = 1;
  if (!suffix.empty() && (suffix[0] == 'K' || suffix[0] == 'M' || suffix[0] == 'G')) {
    mult = suffix[0] == 'K' ? int64_t{1} << 10 : suffix[0] == 'M' ? int64_t{1} << 20 : int64_t{1} << 30;
    suffix.erase(0, 1);
  }
  if (!(suffix.empty() || suffix == "B" || suffix == "IB") || v <= 0) {
    throw UsageError(std::string(what) + ": not a positive size: '" + s + "'");
  }
  return static_cast<int64_t>(v) * mult;
}

int parse_int(const std::string& s, const char* what) {
  size_t pos = 0;
  int v = 0;
  try {
    v = std::stoi(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos != s.size() || v <= 0) throw UsageError(std::string(what) + ": not a positive integer: '" + s + "'");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  int positional = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(a + " needs a value");
      return argv[++i];
    };
    if (a == "--backend") {
      o.backend = value();
      if (o.backend != "mpi" && o.backend != "nccl") throw UsageError("--backend: mpi or nccl, not '" + o.backend + "'");
    } else if (a == "--min-bytes") {
      o.min_bytes = parse_bytes(value(), "--min-bytes");
    } else if (a == "--max-bytes") {
      o.max_bytes = parse_bytes(value(), "--max-bytes");
    } else if (a == "--iters") {
      o.iters = parse_int(value(), "--iters");
    } else if (a == "--single-process") {
      o.single_process = true;
    } else if (a == "--devices") {
      o.devices = parse_int(value(), "--devices");
    } else if (a == "-h" || a == "--help") {
      throw UsageError("");
    } else if (!a.empty() && a[0] != '-' && positional < 2) {
      // The old form: bench_allreduce [min_bytes] [max_bytes].
      if (positional == 0) o.min_bytes = parse_bytes(a, "min_bytes");
      else o.max_bytes = parse_bytes(a, "max_bytes");
      ++positional;
    } else {
      throw UsageError("unknown argument '" + a + "'");
    }
  }
  if (o.min_bytes < 4) throw UsageError("--min-bytes must be at least 4 (one float32)");
  if (o.max_bytes < o.min_bytes) throw UsageError("--max-bytes is smaller than --min-bytes");
  if (o.devices > 0 && !o.single_process) throw UsageError("--devices goes with --single-process");
  return o;
}

int iters_for(const Options& o, int64_t bytes) {
  if (o.iters > 0) return o.iters;
  return static_cast<int>(std::clamp<int64_t>((int64_t{512} << 20) / bytes, 5, 200));
}

// After kWarmup in-place sums of ones over n ranks every element is n^kWarmup.
double expected_after_warmup(int n) { return std::pow(static_cast<double>(n), kWarmup); }

// Every element equals `want` (min and max over the whole tensor, computed on its device).
bool all_equal(const FloatTensor& t, double want) {
  const double lo = FloatTensor(op::min(t)).item();
  const double hi = FloatTensor(op::max(t)).item();
  const double tol = 1e-6 * want;
  return std::abs(lo - want) <= tol && std::abs(hi - want) <= tol;
}

void print_columns() {
  std::printf("# %12s %12s %8s %12s %10s %10s %8s\n", "size(B)", "count", "iters", "time(us)", "algbw(GB/s)",
              "busbw(GB/s)", "check");
}

void print_row(int64_t bytes, int iters, double secs, int n, bool ok) {
  const double algbw = static_cast<double>(bytes) / secs / 1e9;
  const double busbw = algbw * 2.0 * (n - 1) / n;
  std::printf("  %12lld %12lld %8d %12.1f %10.2f %10.2f %8s\n", static_cast<long long>(bytes),
              static_cast<long long>(bytes / 4), iters, secs * 1e6, algbw, busbw, ok ? "ok" : "WRONG");
  std::fflush(stdout);
}

#if EMBER_BENCH_NCCL
// Environment variables a launcher sets for a job of more than one process.
bool launched_with_several_ranks() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS", "WORLD_SIZE"}) {
    if (const char* v = std::getenv(var); v && std::atoi(v) > 1) return true;
  }
  return false;
}
#endif

// ---------------------------------------------------------------- MPI backend (CPU tensors)
#if EMBER_BENCH_MPI
int run_mpi(const Options& o) {
  auto pg = dist::init_from_environment({.timeout = std::chrono::minutes(2)});
  const int n = pg->size();
  if (pg->rank() == 0) {
    std::printf("# ember bench_allreduce: MPI backend, %d rank%s, CPU tensors, float32 sum, in place\n", n,
                n == 1 ? "" : "s");
    print_columns();
  }
  bool all_ok = true;
  for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
    const int64_t count = bytes / 4;
    FloatTensor t = FloatTensor::full({count}, 1.0);
    const int iters = iters_for(o, bytes);
    for (int i = 0; i < kWarmup; ++i) pg->all_reduce(t);
    const bool ok = all_equal(t, expected_after_warmup(n));
    FloatTensor fill = FloatTensor::full({count}, 0.0);
    pg->barrier();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) pg->all_reduce(fill);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    // The slowest rank's time, and whether any rank saw a wrong value.
    DoubleTensor worst = DoubleTensor::from_vector({secs, ok ? 0.0 : 1.0});
    pg->all_reduce(worst, dist::ReduceOp::Max);
    const std::vector<double> w = worst.to_vector();
    all_ok = all_ok && w[1] == 0.0;
    if (pg->rank() == 0) print_row(bytes, iters, w[0], n, w[1] == 0.0);
  }
  return all_ok ? 0 : 1;
}
#endif

// ---------------------------------------------------------------- NCCL backend (CUDA tensors)
#if EMBER_BENCH_NCCL
std::string gpu_name(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "?";
  }
  return prop.name;
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "?";
  // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch (since 2.9).
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

// The number of visible GPUs, or a clear error when there is none.
int visible_gpus() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw DeviceError(::ember::detail::str_cat("the NCCL backend needs a GPU, but none is usable: cudaGetDeviceCount: ",
                                               cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
  }
  if (count == 0) throw DeviceError("the NCCL backend needs a GPU, but no CUDA device is visible");
  if (!cuda::is_available()) {
    throw DeviceError(::ember::detail::str_cat("the CUDA runtime sees ", count, " GPU(s) but ember's CUDA backend has ",
                                               cuda::device_count(), " (is ember::cuda linked?)"));
  }
  return count;
}

// One process's part of the benchmark: `groups[i]` works on `devices[i]` (one group per rank in
// the process-per-GPU mode; every device of the set in single-process mode). `slowest(secs, ok)`
// returns the slowest rank's time and whether every rank was right (identity with one process).
int run_nccl_loop(const Options& o, std::vector<std::unique_ptr<dist::NcclProcessGroup>>& groups,
                  const std::vector<int>& devices, int n, bool print,
                  const std::function<std::pair<double, bool>(double, bool)>& slowest) {
  // Issues one all_reduce per group: inside an NcclGroup scope in single-process mode (one thread
  // issues the collectives of every device), plainly for a group of one device per process.
  auto issue = [&](std::vector<FloatTensor>& ts, std::vector<std::shared_ptr<dist::Work>>& works) {
    if (o.single_process) {
      dist::NcclGroup scope;
      for (size_t i = 0; i < groups.size(); ++i) works.push_back(groups[i]->all_reduce_async(ts[i]));
    } else {
      for (size_t i = 0; i < groups.size(); ++i) works.push_back(groups[i]->all_reduce_async(ts[i]));
    }
  };
  // Host wait for everything issued so far, on every device (ember's streams and the NCCL streams).
  auto sync_all = [&] {
    for (int d : devices) ember::synchronize(Device::cuda(d));
    for (auto& g : groups) g->synchronize();
  };
  // The end of the timed loop: a tight poll of the last collective's "done" event on every device
  // (collectives finish in order on a group's NCCL stream), bounded by the group's timeout, so that
  // the clock stops when they finish; NcclProcessGroup::synchronize() then does the group's own
  // checked host wait (asynchronous NCCL errors), which is immediate by then. Its own polling sleeps
  // 100 us between polls once a wait gets long: too coarse a clock for the small sizes.
  auto spin_until_done = [&](const std::vector<std::shared_ptr<dist::Work>>& works) {
    const auto deadline = std::chrono::steady_clock::now() + groups[0]->options().timeout;
    for (size_t i = works.size() - groups.size(), j = 0; i < works.size(); ++i, ++j) {
      auto* w = dynamic_cast<dist::NcclWork*>(works[i].get());
      if (w == nullptr) continue;
      cuda::DeviceGuard guard(devices[j]);
      while (cudaEventQuery(w->event()) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline) {
      }
      (void)cudaGetLastError();  // an error is for synchronize() to report
    }
  };
  bool all_ok = true;
  for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
    const int64_t count = bytes / 4;
    const int iters = iters_for(o, bytes);
    std::vector<FloatTensor> t, fill;
    for (int d : devices) t.push_back(FloatTensor::full({count}, 1.0, Device::cuda(d)));
    {
      std::vector<std::shared_ptr<dist::Work>> works;
      for (int i = 0; i < kWarmup; ++i) issue(t, works);
      for (auto& w : works) w->wait();  // ember's streams are ordered after the collectives
    }
    bool ok = true;
    for (auto& x : t) ok = all_equal(x, expected_after_warmup(n)) && ok;  // reads back: syncs ember's stream
    t.clear();
    for (int d : devices) fill.push_back(FloatTensor::zeros({count}, Device::cuda(d)));
    sync_all();
    if (!o.single_process) groups[0]->barrier();  // aligns the ranks (a host-waited 1-element all-reduce)
    std::vector<std::shared_ptr<dist::Work>> works;
    works.reserve(static_cast<size_t>(iters) * groups.size());
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) issue(fill, works);
    spin_until_done(works);
    for (auto& g : groups) g->synchronize();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    for (auto& w : works) w->wait();
    works.clear();
    auto [worst, every_ok] = slowest(secs, ok);
    all_ok = all_ok && every_ok;
    if (print) print_row(bytes, iters, worst, n, every_ok);
  }
  sync_all();
  return all_ok ? 0 : 1;
}

// Process per GPU: under mpirun one rank per GPU (cuda:<local rank>), or one rank without MPI.
int run_nccl_ranks(const Options& o) {
  dist::NcclOptions nopts;
  nopts.timeout = std::chrono::minutes(2);
#if EMBER_BENCH_MPI
  auto cpu = dist::init_from_environment({.timeout = std::chrono::minutes(2)});
  const int rank = cpu->rank();
  const int size = cpu->size();
  const int local_rank = cpu->local_rank();
  // Every rank checks its GPU, then all agree, so that a rank without one stops the whole job with
  // the same message instead of leaving the others waiting for it.
  std::string problem;
  try {
    const int count = visible_gpus();
    if (local_rank >= count) {
      problem = ::ember::detail::str_cat("local rank ", local_rank, " needs cuda:", local_rank, " but only ", count,
                                         " GPU(s) are visible (one GPU per rank: start at most ", count,
                                         " ranks per node)");
    }
  } catch (const std::exception& e) {
    problem = e.what();
  }
  DoubleTensor bad = DoubleTensor::from_vector({problem.empty() ? 0.0 : 1.0});
  cpu->all_reduce(bad, dist::ReduceOp::Max);
  if (bad.item() != 0.0) {
    throw DeviceError(problem.empty() ? std::string("another rank has no usable GPU (see its message)")
                                      : ::ember::detail::str_cat("rank ", rank, ": ", problem));
  }
  const int device = local_rank;
  std::vector<std::unique_ptr<dist::NcclProcessGroup>> groups;
  groups.push_back(dist::NcclProcessGroup::create(*cpu, device, nopts));
  auto slowest = [&](double secs, bool ok) {
    DoubleTensor worst = DoubleTensor::from_vector({secs, ok ? 0.0 : 1.0});
    cpu->all_reduce(worst, dist::ReduceOp::Max);
    const std::vector<double> w = worst.to_vector();
    return std::pair<double, bool>(w[0], w[1] == 0.0);
  };
#else
  if (launched_with_several_ranks()) {
    throw UsageError("this bench_allreduce_nccl was built without MPI (no ember::mpi): it runs one rank; use "
                     "--single-process to drive several GPUs from one process");
  }
  const int rank = 0, size = 1, device = 0;
  (void)visible_gpus();
  std::vector<std::unique_ptr<dist::NcclProcessGroup>> groups;
  groups.push_back(std::make_unique<dist::NcclProcessGroup>(dist::nccl_unique_id(), 0, 1, device, nopts));
  auto slowest = [](double secs, bool ok) { return std::pair<double, bool>(secs, ok); };
#endif
  if (rank == 0) {
    std::printf("# ember bench_allreduce: NCCL backend (NCCL %s), %d rank%s, one process per GPU (cuda:<local rank>), "
                "GPU of rank 0: cuda:%d %s; float32 sum, in place, CUDA tensors; time: host clock, issue to "
                "synchronize, max over ranks\n",
                nccl_version().c_str(), size, size == 1 ? "" : "s", device, gpu_name(device).c_str());
    print_columns();
  }
  return run_nccl_loop(o, groups, {device}, size, rank == 0, slowest);
}

// One process drives the first o.devices (default: all) visible GPUs.
int run_nccl_single_process(const Options& o) {
  if (launched_with_several_ranks()) {
    throw UsageError("--single-process drives every GPU from one process: start it once, not under mpirun -np N > 1");
  }
  const int count = visible_gpus();
  if (o.devices > count) {
    throw DeviceError(::ember::detail::str_cat("--devices ", o.devices, ": only ", count, " GPU(s) are visible"));
  }
  const int n = o.devices > 0 ? o.devices : count;
  std::vector<int> devices;
  for (int d = 0; d < n; ++d) devices.push_back(d);
  dist::NcclOptions nopts;
  nopts.timeout = std::chrono::minutes(2);
  auto groups = dist::NcclProcessGroup::create_all(devices, nopts);
  std::string names;
  for (int d : devices) names += ::ember::detail::str_cat(d ? ", " : "", "cuda:", d, " ", gpu_name(d));
  std::printf("# ember bench_allreduce: NCCL backend (NCCL %s), single process driving %d GPU%s (create_all; one "
              "thread issues every device's collective inside a dist::NcclGroup); GPUs: %s; float32 sum, in place, "
              "CUDA tensors; time: host clock, issue to synchronize\n",
              nccl_version().c_str(), n, n == 1 ? "" : "s", names.c_str());
  print_columns();
  auto same = [](double secs, bool ok) { return std::pair<double, bool>(secs, ok); };
  return run_nccl_loop(o, groups, devices, n, true, same);
}
#endif

int run(const Options& o) {
#if EMBER_BENCH_NCCL
  const std::string backend = o.backend.empty() ? "nccl" : o.backend;
#else
  const std::string backend = o.backend.empty() ? "mpi" : o.backend;
#endif
  if (o.single_process && backend != "nccl") {
    throw UsageError("--single-process is a mode of --backend nccl (bench_allreduce_nccl)");
  }
  if (backend == "nccl") {
#if EMBER_BENCH_NCCL
    return o.single_process ? run_nccl_single_process(o) : run_nccl_ranks(o);
#else
    throw UsageError("this program has no NCCL backend: run bench_allreduce_nccl (built with ember's CUDA backend)");
#endif
  }
#if EMBER_BENCH_MPI
  return run_mpi(o);
#else
  throw UsageError("this program was built without MPI (no ember::mpi target): --backend mpi is not available");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 0 && argv[0] && *argv[0]) {
    g_program = argv[0];
    g_program = g_program.substr(g_program.find_last_of('/') + 1);
  }
  try {
    return run(parse(argc, argv));
  } catch (const UsageError& e) {
    if (*e.what()) std::fprintf(stderr, "%s: %s\n", g_program.c_str(), e.what());
    std::fputs(kUsage, stderr);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", g_program.c_str(), e.what());
    return 1;
  }
}
