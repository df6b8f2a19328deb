// Layers: forward + backward of Linear, Conv2d, LayerNorm and self-attention, and one AdamW
// step, on the CPU (and on cuda:0 when present). Reports time per call and GFLOP/s (GEMM-shaped
// layers) or GB/s (LayerNorm, the optimizer step).
// Run: ./build/benchmarks/bench_layers [--benchmark_filter=...] [--benchmark_format=json]
// benchmarks/bench_torch.py measures the same workloads in PyTorch for side-by-side ratios.
#include <benchmark/benchmark.h>

#include <ember/ember.hpp>

#include "bench_main.hpp"

using namespace ember;

namespace {

struct Sizes {  // smaller on the CPU so a run takes seconds
  int64_t batch, features, image, channels, tokens, embed, heads;
};
Sizes sizes_for(Device d) {
  return d.is_cpu() ? Sizes{64, 512, 16, 32, 128, 128, 4} : Sizes{256, 4096, 32, 128, 512, 1024, 16};
}

void rate(benchmark::State& state, const char* name, double per_iter) {
  state.counters[name] =
      benchmark::Counter(per_iter, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

// Runs forward and backward of `f` on x (which requires grad) once per iteration.
template <class F>
void fwd_bwd(benchmark::State& state, Device dev, const Tensor<float>& x, F&& f) {
  for (auto _ : state)
    bench::timed(state, dev, [&] {
      auto y = f(x);
      sum(y).backward();
    });
}

void BM_linear(benchmark::State& state, Device dev) {
  Sizes s = sizes_for(dev);
  nn::Linear lin(s.features, s.features);
  lin.to(dev);
  auto x = Tensor<float>::randn({s.batch, s.features}, dev).set_requires_grad();
  fwd_bwd(state, dev, x, [&](const Tensor<float>& in) { return lin(in); });
  rate(state, "GFLOP/s", 3 * 2.0 * static_cast<double>(s.batch * s.features * s.features));  // fwd + 2 bwd GEMMs
}

void BM_conv2d(benchmark::State& state, Device dev) {
  Sizes s = sizes_for(dev);
  nn::Conv2d conv(s.channels, s.channels, 3, {.padding = {1, 1}});
  conv.to(dev);
  auto x = Tensor<float>::randn({s.batch / 4, s.channels, s.image, s.image}, dev).set_requires_grad();
  fwd_bwd(state, dev, x, [&](const Tensor<float>& in) { return conv(in); });
  const double flops = 2.0 * static_cast<double>(s.batch / 4 * s.channels * s.channels * 9 * s.image * s.image);
  rate(state, "GFLOP/s", 3 * flops);
}

void BM_layernorm(benchmark::State& state, Device dev) {
  Sizes s = sizes_for(dev);
  nn::LayerNorm ln(s.embed);
  ln.to(dev);
  auto x = Tensor<float>::randn({s.batch * s.tokens / 4, s.embed}, dev).set_requires_grad();
  fwd_bwd(state, dev, x, [&](const Tensor<float>& in) { return ln(in); });
  rate(state, "GB/s(min)", 4.0 * 4 * static_cast<double>(x.numel()));  // x, y, gy, gx at least once
}

void BM_attention(benchmark::State& state, Device dev) {
  Sizes s = sizes_for(dev);
  nn::MultiheadAttention attn(s.embed, s.heads);
  attn.to(dev);
  const int64_t n = std::max<int64_t>(1, s.batch / 16);
  auto x = Tensor<float>::randn({n, s.tokens, s.embed}, dev).set_requires_grad();
  fwd_bwd(state, dev, x, [&](const Tensor<float>& in) { return attn.forward(in, nn::AttentionMask{.is_causal = true}); });
  const double proj = 2.0 * static_cast<double>(n * s.tokens) * s.embed * 4 * s.embed;
  const double scores = 2.0 * 2 * static_cast<double>(n * s.tokens * s.tokens * s.embed);
  rate(state, "GFLOP/s", 3 * (proj + scores));
}

void BM_adamw_step(benchmark::State& state, Device dev) {
  const int64_t n = dev.is_cpu() ? (1 << 20) : (1 << 24);
  auto p = Tensor<float>::randn({n}, dev).set_requires_grad();
  p.set_grad(Tensor<float>::randn({n}, dev));
  optim::AdamW opt({p}, {.lr = 1e-3});
  for (auto _ : state) bench::timed(state, dev, [&] { opt.step(); });
  rate(state, "GB/s(min)", 4.0 * 7 * static_cast<double>(n));  // read p, g, m, v; write p, m, v
}

void register_all(Device dev, const std::string& suffix) {
  for (auto [name, fn] : std::vector<std::pair<std::string, bench::Case>>{
           {"linear_fwd_bwd", BM_linear}, {"conv2d_fwd_bwd", BM_conv2d}, {"layernorm_fwd_bwd", BM_layernorm},
           {"attention_fwd_bwd", BM_attention}, {"adamw_step", BM_adamw_step}})
    bench::reg(name + suffix, fn, dev)->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) { return bench::run(argc, argv, register_all); }
