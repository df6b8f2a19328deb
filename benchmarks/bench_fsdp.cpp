// DataParallel against FullyShardedDataParallel (ZeRO-2, ZeRO-3) on a GPT, one process per rank:
//   mpirun -np 4 ./build/benchmarks/bench_fsdp [--layers 12] [--embd 768] [--heads 12] [--vocab 50257]
//                                              [--seq 64] [--batch 1] [--rounds 5] [--profile-steps 3]
// Default: GPT-2 small (124M parameters, 1024 positions), AdamW. Each rank builds the three
// variants side by side and times one step of each per round, interleaved (after a barrier), so
// that drift in the machine's load hits them alike; per variant the slowest rank's median.
//   persistent  bytes a rank holds between steps (parameters, gradients, AdamW state, the
//               wrapper's buffers): memory_stats().current_bytes after the variant's first step,
//               less before the variant was built;
//   peak        persistent + the most a step adds on top (memory_stats().peak_bytes during a
//               step less current_bytes before it): the variant's peak were it alone;
//   comm        from a profiled run of --profile-steps steps per variant (profile::Profiler; the
//               first step left out): "total" is the collectives from launch to completion
//               (all_reduce buckets; all_gather and reduce_scatter per unit), "exposed" the
//               training thread waiting for them (Phase::Communication); hidden = 1 - exposed / total.
// Each rank computes with one thread (ember's kernels and OpenBLAS): the ranks share this
// machine's cores as each would own a device.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <ember/dist/data_parallel.hpp>
#include <ember/dist/fsdp.hpp>
#include <ember/dist/mpi.hpp>
#include <ember/ember.hpp>
#include <ember/nn/gpt.hpp>
#include <ember/profile/profiler.hpp>

using namespace ember;

namespace {

// Re-executes once with one OpenBLAS thread per rank (read when OpenBLAS loads, before main).
void ensure_benchmark_environment(char** argv) {
  if (std::getenv("EMBER_NO_REEXEC") || std::getenv("OPENBLAS_NUM_THREADS")) return;
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  setenv("EMBER_NO_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Variant {
  std::string name;
  int stage = 0;  // 0: DataParallel
  std::shared_ptr<nn::GPT> model;
  std::unique_ptr<dist::DataParallel> dp;
  std::unique_ptr<dist::FullyShardedDataParallel> fsdp;
  std::unique_ptr<optim::AdamW> opt;
  int64_t persistent = 0, transient = 0;
  std::vector<double> ms;
  profile::StepFigures fig;
};

}  // namespace

int main(int argc, char** argv) {
  ensure_benchmark_environment(argv);
  set_num_threads(1);
  auto pg = dist::init_from_environment({.timeout = std::chrono::seconds(600)});
  const int rank = pg->rank(), world = pg->size();
  nn::GPTConfig cfg;  // GPT-2 small
  int64_t seq = 64, batch = 1;
  int rounds = 5, profile_steps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool v = i + 1 < argc;
    if (a == "--layers" && v) cfg.n_layer = std::atoll(argv[++i]);
    else if (a == "--embd" && v) cfg.n_embd = std::atoll(argv[++i]);
    else if (a == "--heads" && v) cfg.n_head = std::atoll(argv[++i]);
    else if (a == "--vocab" && v) cfg.vocab_size = std::atoll(argv[++i]);
    else if (a == "--seq" && v) seq = std::atoll(argv[++i]);
    else if (a == "--batch" && v) batch = std::atoll(argv[++i]);
    else if (a == "--rounds" && v) rounds = std::atoi(argv[++i]);
    else if (a == "--profile-steps" && v) profile_steps = std::atoi(argv[++i]);
    else {
      if (rank == 0)
        std::fprintf(stderr, "usage: %s [--layers L] [--embd E] [--heads H] [--vocab V] [--seq T] [--batch B] "
                             "[--rounds N] [--profile-steps N]\n", argv[0]);
      return 2;
    }
  }

  std::mt19937_64 rng(100 + static_cast<uint64_t>(rank));
  auto tokens = [&] {
    std::vector<int64_t> ids(static_cast<size_t>(batch * seq));
    for (auto& t : ids) t = static_cast<int64_t>(rng() % static_cast<uint64_t>(cfg.vocab_size));
    return Tensor<int64_t>::from_vector(ids, {batch, seq});
  };
  auto step = [&](Variant& v) {
    auto ids = tokens(), targets = tokens();
    v.opt->zero_grad();
    Tensor<float> loss;
    {
      trace::PhaseScope phase(trace::Phase::Forward);
      Tensor<float> logits(v.model->forward_any(ids));
      loss = nn::functional::cross_entropy(logits.reshape({-1, cfg.vocab_size}), targets.reshape({-1}));
    }
    {
      trace::PhaseScope phase(trace::Phase::Backward);
      loss.backward();
    }
    trace::PhaseScope phase(trace::Phase::Optimizer);
    v.opt->step();
  };

  std::vector<Variant> variants(3);
  variants[0].name = "DataParallel";
  variants[1].name = "ZeRO-2";
  variants[1].stage = 2;
  variants[2].name = "ZeRO-3";
  variants[2].stage = 3;
  int64_t params = 0;
  for (Variant& v : variants) {
    pg->barrier();
    const int64_t base = memory_stats().current_bytes;
    manual_seed(1);
    v.model = std::make_shared<nn::GPT>(cfg);
    params = v.model->parameter_count();
    std::vector<AnyTensor> ps;
    if (v.stage == 0) {
      v.dp = std::make_unique<dist::DataParallel>(v.model, *pg, dist::DataParallelOptions{.gradient_as_bucket_view = true});
      ps = v.model->parameters();
    } else {
      v.fsdp = std::make_unique<dist::FullyShardedDataParallel>(v.model, *pg, dist::FullyShardedOptions{.stage = v.stage});
      ps = v.fsdp->parameters();
    }
    v.opt = std::make_unique<optim::AdamW>(ps, optim::AdamOptions{.lr = 1e-4, .weight_decay = 0.1});
    step(v);  // warm-up: AdamW's state exists from here on
    v.persistent = memory_stats().current_bytes - base;
  }

  for (int r = 0; r < rounds; ++r)
    for (Variant& v : variants) {
      pg->barrier();
      const int64_t before = memory_stats().current_bytes;
      reset_peak_memory();
      const auto t0 = std::chrono::steady_clock::now();
      step(v);
      v.ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      v.transient = std::max(v.transient, memory_stats().peak_bytes - before);
    }

  for (Variant& v : variants) {
    profile::Profiler prof(profile::ProfilerOptions{.record_shapes = false, .profile_memory = false, .window = profile_steps});
    pg->barrier();
    prof.start();
    for (int s = 0; s < profile_steps; ++s) {
      step(v);
      prof.step(batch);
    }
    prof.stop();
    v.fig = prof.average_figures();
  }

  // The slowest rank's figures: synchronous data parallelism runs at its pace.
  std::vector<double> mine;
  for (Variant& v : variants)
    for (double x : {median(v.ms), static_cast<double>(v.persistent), static_cast<double>(v.persistent + v.transient),
                     v.fig.communication_total_ms, v.fig.communication_exposed_ms, v.fig.forward_ms,
                     v.fig.backward_ms, v.fig.optimizer_ms})
      mine.push_back(x);
  AnyTensor t = Tensor<double>::from_vector(mine);
  pg->all_reduce(t, dist::ReduceOp::Max);
  const auto all = t.to_double_vector();
  if (rank != 0) return 0;
  const size_t k = 8;
  auto at = [&](size_t v, size_t i) { return all[v * k + i]; };
  const double mb = 1.0 / (1024.0 * 1024.0);
  std::printf("GPT %lld x %lld (vocab %lld, %lld positions, %.1fM parameters), batch %lld x %lld tokens per rank, "
              "AdamW, %d ranks, 1 thread each; slowest rank, median of %d interleaved rounds\n",
              static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.n_embd),
              static_cast<long long>(cfg.vocab_size), static_cast<long long>(cfg.block_size), params / 1e6,
              static_cast<long long>(batch), static_cast<long long>(seq), world, rounds);
  std::printf("| variant | step ms | x DDP | persistent MiB/rank | x DDP | peak MiB/rank | forward ms | backward ms "
              "| optimizer ms | comm total ms | comm exposed ms | hidden |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (size_t v = 0; v < variants.size(); ++v)
    std::printf("| %s | %.0f | %.2f | %.0f | %.3f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f%% |\n",
                variants[v].name.c_str(), at(v, 0), at(v, 0) / at(0, 0), at(v, 1) * mb, at(v, 1) / at(0, 1),
                at(v, 2) * mb, at(v, 5), at(v, 6), at(v, 7), at(v, 3), at(v, 4),
                at(v, 3) > 0 ? 100.0 * std::max(0.0, 1.0 - at(v, 4) / at(v, 3)) : 0.0);
  std::printf("ZeRO-3: %.2fx DataParallel's step time (target <= 1.3), %.3fx its persistent memory per rank "
              "(target <= %.3f)\n",
              at(2, 0) / at(0, 0), at(2, 1) / at(0, 1), 1.0 / world);
  return 0;
}
