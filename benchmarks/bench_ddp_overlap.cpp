// How much of DataParallel's communication hides behind backward, on CPU MPI:
//   mpirun -np 2 ./build/benchmarks/bench_ddp_overlap [--rounds N] [--width W] [--depth D]
//                                                     [--batch B] [--device-ms MS]
// Times versions of the same training step (forward, backward, SGD step) on an MLP of `depth`
// Linear(width, width) layers, with buckets of two layers each (depth / 2 buckets):
//   local          - no communication at all (the floor),
//   ddp            - DataParallel: bucket all-reduces start from the gradient-ready hooks during
//                    backward and MPI's progress thread moves them while backward computes,
//   ddp, no thread - the same with MpiOptions::comm_thread = false (MPI moves a collective
//                    only when the training thread enters MPI: at the wait after backward),
//   blocking       - the same all-reduces issued one after another after backward (no overlap).
// The versions run interleaved, one step each per round (after a barrier), so that drift in the
// machine's load hits them alike; medians over the rounds, the slowest rank's. Reported:
//   hidden = (blocking - ddp) / (blocking - local): the share of the communication time that
//   overlapped backward. The target is "all but the last bucket": (buckets - 1) / buckets.
// Each rank computes with one BLAS thread (OPENBLAS_NUM_THREADS=1 unless set): the ranks share
// this machine's cores as they would each own a GPU.
//
// Two regimes:
// - Real CPU compute (default: batch 64): backward keeps every core busy. The all-reduces are
//   themselves CPU work (shared-memory copies and sums), so they cannot hide behind compute
//   that already uses every core: expect little or nothing hidden on a machine with as many
//   cores as ranks. This is the honest figure for CPU data parallelism on such a machine.
// - Emulated accelerator (--device-ms MS, e.g. with --batch 1): after every Linear a layer whose
//   forward and backward sleep MS milliseconds stands for kernels running on a device while the
//   host waits, as on a GPU. The cores are then free for communication, and the figure measures
//   the overlap machinery itself: buckets started from the hooks, moved during backward, waited
//   for at its end. Target: all but the last bucket hidden.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <ember/dist/data_parallel.hpp>
#include <ember/dist/mpi.hpp>
#include <ember/ember.hpp>

using namespace ember;

namespace {

// Re-executes once with one BLAS thread per rank (read when OpenBLAS loads, before main). The
// BLAS kernel type (OPENBLAS_CORETYPE) is left as the environment has it.
void ensure_benchmark_environment(char** argv) {
  if (std::getenv("EMBER_NO_REEXEC")) return;
  bool changed = false;
  if (!std::getenv("OPENBLAS_NUM_THREADS")) {
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    changed = true;
  }
  if (!changed) return;
  setenv("EMBER_NO_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
}

// Identity whose forward and backward each take `ms` of (sleeping) time: an accelerator's kernels
// that the host waits for.
class DeviceTime : public nn::ModuleBase<DeviceTime> {
 public:
  explicit DeviceTime(double ms) : us_(static_cast<int64_t>(ms * 1000)) {}
  std::string type_name() const override { return "DeviceTime"; }
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    AnyTensor y;
    {
      NoGradGuard no_grad;
      std::this_thread::sleep_for(std::chrono::microseconds(us_));
      y = x.detach().clone();
    }
    const int64_t us = us_;
    autograd::record("DeviceTime", {x}, {y}, [us](const std::vector<AnyTensor>& g) {
      std::this_thread::sleep_for(std::chrono::microseconds(us));
      return std::vector<AnyTensor>{g[0]};
    });
    return Tensor<T>(y);
  }

 private:
  int64_t us_;
};

std::shared_ptr<nn::Sequential> make_mlp(int64_t width, int64_t depth, double device_ms) {
  manual_seed(1);
  auto m = std::make_shared<nn::Sequential>();
  for (int64_t i = 0; i < depth; ++i) {
    m->emplace<nn::Linear>(width, width);
    if (device_ms > 0) m->emplace<DeviceTime>(device_ms);
    m->emplace<nn::Tanh>();
  }
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Variant {
  const char* name;
  std::function<void()> step;
  std::vector<double> ms;
};

}  // namespace

int main(int argc, char** argv) {
  ensure_benchmark_environment(argv);
  auto pg = dist::init_from_environment();
  dist::MpiOptions no_thread;
  no_thread.comm_thread = false;
  auto pg_no_thread = std::make_shared<dist::MpiProcessGroup>(no_thread);

  int rounds = 20;
  int64_t width = 512, depth = 8, batch = 64;
  double device_ms = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--rounds" && v) rounds = std::atoi(argv[++i]);
    else if (a == "--width" && v) width = std::atoll(argv[++i]);
    else if (a == "--depth" && v) depth = std::atoll(argv[++i]);
    else if (a == "--batch" && v) batch = std::atoll(argv[++i]);
    else if (a == "--device-ms" && v) device_ms = std::atof(argv[++i]);
    else {
      if (pg->rank() == 0)
        std::fprintf(stderr, "usage: %s [--rounds N] [--width W] [--depth D] [--batch B] [--device-ms MS]\n", argv[0]);
      return 2;
    }
  }
  auto x = Tensor<float>::randn({batch, width});
  const size_t bucket = static_cast<size_t>(2 * width * (width + 1) * 4);  // two layers
  const int64_t buckets = (depth + 1) / 2;
  auto local = make_mlp(width, depth, device_ms);
  optim::SGD opt_local(local->parameters(), {.lr = 1e-3});

  const dist::DataParallelOptions buckets_of_two_layers{.bucket_cap_bytes = bucket, .first_bucket_bytes = bucket};
  dist::DataParallelOptions as_view = buckets_of_two_layers;
  as_view.gradient_as_bucket_view = true;
  struct Replica {
    std::shared_ptr<nn::Sequential> model;
    std::unique_ptr<dist::DataParallel> dp;
    std::unique_ptr<optim::SGD> opt;
  };
  auto replica = [&](dist::ProcessGroup& g, const dist::DataParallelOptions& o) {
    Replica r;
    r.model = make_mlp(width, depth, device_ms);
    r.dp = std::make_unique<dist::DataParallel>(r.model, g, o);
    r.opt = std::make_unique<optim::SGD>(r.model->parameters(), optim::SGDOptions{.lr = 1e-3});
    return r;
  };
  Replica ddp = replica(*pg, buckets_of_two_layers);
  Replica ddp_view = replica(*pg, as_view);
  Replica ddp_nt = replica(*pg_no_thread, buckets_of_two_layers);
  auto ddp_step = [&](Replica& r) {
    r.opt->zero_grad();
    mean(square((*r.dp)(x))).backward();  // all-reduces overlap backward; waited for at its end
    r.opt->step();
  };

  auto blocking = make_mlp(width, depth, device_ms);
  optim::SGD opt_blocking(blocking->parameters(), {.lr = 1e-3});
  auto params = blocking->parameters();

  std::vector<Variant> variants;
  variants.push_back({"local (no communication)", [&] {
                        opt_local.zero_grad();
                        mean(square((*local)(x))).backward();
                        opt_local.step();
                      }, {}});
  variants.push_back({"ddp (comm thread)", [&] { ddp_step(ddp); }, {}});
  variants.push_back({"ddp (+ bucket views)", [&] { ddp_step(ddp_view); }, {}});
  variants.push_back({"ddp (no comm thread)", [&] { ddp_step(ddp_nt); }, {}});
  variants.push_back({"blocking all-reduces", [&] {
                        opt_blocking.zero_grad();
                        mean(square((*blocking)(x))).backward();
                        // The same buckets, reduced after backward one at a time, the averages
                        // copied back into the gradients.
                        NoGradGuard no_grad;
                        for (size_t i = 0; i < params.size(); i += 4) {  // 2 layers = 4 tensors per bucket
                          std::vector<AnyTensor> grads;
                          const size_t end = std::min(params.size(), i + 4);
                          for (size_t j = i; j < end; ++j) grads.push_back(params[j].grad().reshape({-1}));
                          AnyTensor flat = op::concat(grads, 0);
                          pg->all_reduce(flat, dist::ReduceOp::Avg);
                          int64_t offset = 0;
                          for (size_t j = i; j < end; ++j) {
                            AnyTensor g = params[j].grad();
                            g.copy_(flat.slice(offset, offset + g.numel()).reshape(g.shape()));
                            offset += g.numel();
                          }
                        }
                        opt_blocking.step();
                      }, {}});
  const size_t kBlocking = variants.size() - 1;

  for (int r = 0; r < rounds + 2; ++r) {
    for (auto& v : variants) {
      pg->barrier();
      const auto t0 = std::chrono::steady_clock::now();
      v.step();
      const auto t1 = std::chrono::steady_clock::now();
      if (r >= 2) v.ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());  // 2 warm-up rounds
    }
  }

  // Every rank's median per variant, then the slowest rank's: synchronous data parallelism cannot
  // beat its slowest rank, so the floor is the slowest rank's local step, and a rank that computes
  // a little slower than another does not count as communication.
  std::vector<double> mine;
  for (auto& v : variants) mine.push_back(median(v.ms));
  DoubleTensor slowest = DoubleTensor::from_vector(mine);
  pg->all_reduce(slowest, dist::ReduceOp::Max);
  const std::vector<double> med = slowest.to_vector();
  if (pg->rank() == 0) {
    std::printf("ranks %d, MLP %lldx%lld, batch %lld per rank (%lld buckets of %.1f MB), %s, comm thread %s, "
                "slowest rank's median of %d rounds:\n",
                pg->size(), static_cast<long long>(depth), static_cast<long long>(width), static_cast<long long>(batch),
                static_cast<long long>(buckets), static_cast<double>(bucket) / 1e6,
                device_ms > 0 ? ::ember::detail::str_cat("emulated device, ", device_ms, " ms per layer and pass").c_str()
                              : "real CPU compute",
                pg->has_comm_thread() ? "on" : "unavailable (MPI lacks MPI_THREAD_MULTIPLE)", rounds);
    for (size_t i = 0; i < variants.size(); ++i) std::printf("  %-26s %8.2f ms\n", variants[i].name, med[i]);
    const double comm = med[kBlocking] - med[0];
    std::printf("  communication (blocking - local) %.2f ms; target: all but the last bucket hidden (%.0f%%)\n", comm,
                100.0 * static_cast<double>(buckets - 1) / static_cast<double>(buckets));
    for (size_t i = 1; i < kBlocking; ++i) {
      const double exposed = med[i] - med[0];
      std::printf("  %-26s exposed %6.2f ms: %.0f%% hidden behind backward\n", variants[i].name,
                  exposed, comm > 0 ? 100.0 * (comm - exposed) / comm : 0.0);
    }
  }
  return 0;
}
