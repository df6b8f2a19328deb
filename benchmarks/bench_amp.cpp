// Mixed precision: step time (forward, backward, AdamW step) of a GEMM-bound MLP and of a
// transformer block in float32, float16 and bfloat16 activations with fp32 master weights.
// The target on an H200: fp16/bf16 at least 2x faster than fp32 on the 4096-wide MLP.
// On the CPU, 16-bit types are emulated (converted to fp32 around each kernel), so the CPU rows
// show overhead, not speed-up; sizes are small there so a run takes seconds.
// scaler_step_{fused,unscale_then_step}: GradScaler::step on AdamW over one large fp32 parameter,
// the unscale inside the optimizer's kernel (default) against unscale_ then step
// (set_fuse_unscale(false)); memory-bound, so the ratio shows the pass over the gradients saved.
// Run: ./build/benchmarks/bench_amp [--benchmark_filter=cuda]
//      ./build/benchmarks/bench_amp --benchmark_filter=scaler_step --benchmark_repetitions=5 \
//        --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>

#include <ember/ember.hpp>

#include "bench_main.hpp"

using namespace ember;

namespace {

std::shared_ptr<nn::Sequential> make_mlp(int64_t width, int64_t depth) {
  auto m = std::make_shared<nn::Sequential>();
  for (int64_t i = 0; i < depth; ++i) {
    m->emplace<nn::Linear>(width, width);
    m->emplace<nn::GELU>(std::string("tanh"));
  }
  return m;
}

template <Element T>
void BM_mlp_step(benchmark::State& state, Device dev) {
  const int64_t width = dev.is_cpu() ? 256 : 4096, batch = dev.is_cpu() ? 64 : 4096, depth = 4;
  auto model = make_mlp(width, depth);
  model->to(dev);
  optim::AdamW opt(model->parameters(), {.lr = 1e-4});
  auto x = Tensor<float>::randn({batch, width}, dev).to<T>();
  for (auto _ : state) {
    auto y = (*model)(x);
    auto loss = mean(square(y.template to<float>()));
    opt.zero_grad();
    loss.backward();
    opt.step();
    backend_for(dev).synchronize();
  }
  const double flops = 3.0 * 2.0 * static_cast<double>(batch) * width * width * depth;
  state.counters["TFLOP/s"] =
      benchmark::Counter(flops / 1e12, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

template <Element T>
void BM_transformer_step(benchmark::State& state, Device dev) {
  const int64_t embed = dev.is_cpu() ? 64 : 1024, heads = dev.is_cpu() ? 4 : 16, tokens = dev.is_cpu() ? 32 : 512,
                batch = dev.is_cpu() ? 4 : 16;
  nn::TransformerBlock block(embed, heads);
  block.to(dev);
  optim::AdamW opt(block.parameters(), {.lr = 1e-4});
  auto x = Tensor<float>::randn({batch, tokens, embed}, dev).to<T>();
  for (auto _ : state) {
    auto y = block(x);
    auto loss = mean(square(y.template to<float>()));
    opt.zero_grad();
    loss.backward();
    opt.step();
    backend_for(dev).synchronize();
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(batch * tokens),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

// The scale alternates between 2 and 0.5 (update(new_scale)), so the gradient, unscaled in place
// every step, stays the same size (powers of two: exact) instead of sinking into denormals.
template <bool Fuse>
void BM_scaler_step(benchmark::State& state, Device dev) {
  const int64_t n = dev.is_cpu() ? (int64_t{1} << 22) : (int64_t{1} << 26);
  AnyTensor p = AnyTensor(Tensor<float>::randn({n}, dev));
  p.set_requires_grad(true);
  p.set_grad(AnyTensor(Tensor<float>::randn({n}, dev)));
  optim::AdamW opt({p}, {.lr = 1e-4});
  amp::GradScaler scaler({.init_scale = 2.0});
  scaler.set_fuse_unscale(Fuse);
  (void)scaler.scale(AnyTensor::zeros(Shape{}, DType::Float32, dev));
  bool up = false;
  for (auto _ : state) {
    benchmark::DoNotOptimize(scaler.step(opt));
    scaler.update(up ? 2.0 : 0.5);
    up = !up;
    backend_for(dev).synchronize();
  }
  state.counters["Gparam/s"] = benchmark::Counter(static_cast<double>(n) / 1e9,
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

void register_all(Device dev, const std::string& suffix) {
  auto reg = [&](const std::string& name, void (*fn)(benchmark::State&, Device)) {
    benchmark::RegisterBenchmark((name + suffix).c_str(), fn, dev)->Unit(benchmark::kMillisecond)->UseRealTime();
  };
  reg("mlp_step_fp32", BM_mlp_step<float>);
  reg("mlp_step_fp16", BM_mlp_step<half>);
  reg("mlp_step_bf16", BM_mlp_step<bfloat16>);
  reg("transformer_step_fp32", BM_transformer_step<float>);
  reg("transformer_step_fp16", BM_transformer_step<half>);
  reg("transformer_step_bf16", BM_transformer_step<bfloat16>);
  reg("scaler_step_fused", BM_scaler_step<true>);
  reg("scaler_step_unscale_then_step", BM_scaler_step<false>);
}

}  // namespace

int main(int argc, char** argv) { return bench::run(argc, argv, register_all); }
