// Recomputation of activations (nn::recompute): step time (forward + backward) and peak
// activation memory of
//   mlp16:        16 blocks of Linear(W, W) + ReLU                 (CPU: W 256, batch 64)
//   transformer:  a stack of nn::TransformerBlock                  (CPU: 4 blocks, E 128, 4 heads, 8 x 128 tokens)
// without recomputation ("plain"), with nn::recompute_sequential in 4 segments ("seq4") and with
// one recomputed segment per block ("per_block"), on the CPU and on cuda:0 when present.
//
// Counters:
//   peak_MB        peak bytes above what was live before one step (the gradients are allocated
//                  by a warm-up step, so this is activations and backward temporaries)
//   plain_peak_MB  the same for the plain step
//   mem_saved_%    100 * (1 - peak / plain_peak)
//   time_ratio     recomputing step time / plain step time; each iteration runs one plain step
//                  outside the timed region right after the timed recomputing one, so the ratio
//                  compares steps run under the same conditions
//   cpu_time_ratio the same ratio of process CPU time (CPU runs only: steadier on a busy machine)
// The target (on an H200): time_ratio <= 1.35 with mem_saved_% >= 40.
// Run: ./build/benchmarks/bench_recompute [--benchmark_filter=...] [--benchmark_format=json]
#include <benchmark/benchmark.h>

#include <time.h>

#include <chrono>
#include <functional>
#include <memory>

#include <ember/ember.hpp>

#include "bench_main.hpp"

using namespace ember;

namespace {

enum class Mode { Plain, Seq4, PerBlock };

struct Workload {
  std::shared_ptr<nn::Sequential> model;  // one layer per block
  AnyTensor x;
};

// 16 blocks, each a Sequential(Linear, ReLU) so that a block is one layer of the outer model.
Workload make_mlp16(Device dev) {
  const int64_t width = dev.is_cpu() ? 256 : 4096, batch = dev.is_cpu() ? 64 : 1024;
  manual_seed(1);
  Workload w{std::make_shared<nn::Sequential>(), {}};
  for (int b = 0; b < 16; ++b)
    w.model->push_back(std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(width, width),
                                                        std::make_shared<nn::ReLU>()));
  w.model->to(dev);
  w.x = Tensor<float>::randn({batch, width}, dev);
  return w;
}

Workload make_transformer(Device dev) {
  const bool cpu = dev.is_cpu();
  const int64_t blocks = cpu ? 4 : 8, embed = cpu ? 128 : 1024, heads = cpu ? 4 : 16, batch = 8,
                tokens = cpu ? 128 : 1024;
  manual_seed(2);
  Workload w{std::make_shared<nn::Sequential>(), {}};
  for (int64_t b = 0; b < blocks; ++b)
    w.model->emplace<nn::TransformerBlock>(embed, heads, nn::TransformerBlockOptions{.dropout = 0.1});
  w.model->to(dev);
  w.x = Tensor<float>::randn({batch, tokens, embed}, dev);
  return w;
}

AnyTensor forward(const Workload& w, Mode mode) {
  switch (mode) {
    case Mode::Plain: return w.model->forward_any(w.x);
    case Mode::Seq4: return nn::recompute_sequential(*w.model, 4, w.x);
    case Mode::PerBlock: {
      AnyTensor h = w.x;
      for (const auto& block : w.model->layers())
        h = nn::recompute([block](const AnyTensor& t) { return block->forward_any(t); }, h);
      return h;
    }
  }
  return {};
}

// One training step without the optimizer: forward, mean-square loss, backward (gradients
// accumulate into the .grad tensors the warm-up created).
void step(const Workload& w, Mode mode, Device dev) {
  AnyTensor y = forward(w, mode);
  op::mean(op::mul(y, y)).backward();
  synchronize(dev);
}

int64_t activation_peak(const Workload& w, Mode mode, Device dev) {
  step(w, mode, dev);  // warm-up: allocates every .grad
  const int64_t before = memory_stats(dev).current_bytes;
  reset_peak_memory(dev);
  step(w, mode, dev);
  return memory_stats(dev).peak_bytes - before;
}

// Wall-clock and process CPU seconds of f (CPU time is the steadier measure of the work on a
// loaded machine; it is meaningless for GPU work).
struct Seconds {
  double wall = 0.0, cpu = 0.0;
  Seconds& operator+=(const Seconds& o) {
    wall += o.wall;
    cpu += o.cpu;
    return *this;
  }
};
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
Seconds seconds_of(const std::function<void()>& f) {
  const double c0 = process_cpu_seconds();
  auto t0 = std::chrono::steady_clock::now();
  f();
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), process_cpu_seconds() - c0};
}

void BM_recompute(benchmark::State& state, Workload (*make)(Device), Mode mode, Device dev) {
  Workload w = make(dev);
  const int64_t plain_peak = activation_peak(w, Mode::Plain, dev);
  const int64_t peak = mode == Mode::Plain ? plain_peak : activation_peak(w, mode, dev);
  Seconds timed, plain;
  for (auto _ : state) {
    timed += seconds_of([&] { step(w, mode, dev); });
    if (mode != Mode::Plain) {
      state.PauseTiming();
      plain += seconds_of([&] { step(w, Mode::Plain, dev); });
      state.ResumeTiming();
    }
  }
  state.counters["peak_MB"] = static_cast<double>(peak) / (1 << 20);
  state.counters["plain_peak_MB"] = static_cast<double>(plain_peak) / (1 << 20);
  state.counters["mem_saved_%"] = 100.0 * (1.0 - static_cast<double>(peak) / static_cast<double>(plain_peak));
  state.counters["time_ratio"] = mode == Mode::Plain ? 1.0 : timed.wall / plain.wall;
  if (dev.is_cpu()) state.counters["cpu_time_ratio"] = mode == Mode::Plain ? 1.0 : timed.cpu / plain.cpu;
}

void register_all(Device dev, const std::string& suffix) {
  const std::pair<const char*, Workload (*)(Device)> workloads[] = {{"mlp16", make_mlp16},
                                                                    {"transformer", make_transformer}};
  const std::pair<const char*, Mode> modes[] = {{"plain", Mode::Plain}, {"seq4", Mode::Seq4}, {"per_block", Mode::PerBlock}};
  for (auto [wname, make] : workloads)
    for (auto [mname, mode] : modes)
      benchmark::RegisterBenchmark((std::string(wname) + "_" + mname + suffix).c_str(), BM_recompute, make, mode, dev)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) { return bench::run(argc, argv, register_all); }
