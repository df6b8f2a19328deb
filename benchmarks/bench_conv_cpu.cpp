// CPU convolution, pooling and batch norm on the shapes of the PyTorch comparison's CNN step
// (1x28x28 input, Conv(1->32, 3x3, pad 1) ReLU MaxPool(2) Conv(32->64, 3x3, pad 1) ReLU MaxPool(2)
// Linear, batch 64, Adam), at 1 and 2 threads (ember::set_num_threads, which also sets OpenBLAS's).
//
//   conv_<dir>/<shape>/<path>/threads:N   one kernel call: dir fwd | bwd_input | bwd_weight,
//                                         path dispatch (what the CPU backend runs), im2col
//                                         (im2col + OpenBLAS sgemm, threaded), onednn (its
//                                         blocked layouts, reorders around) or onednn_plain
//   max_pool_<fwd|bwd>/<shape>/threads:N  the CPU backend's pooling kernels
//   batchnorm_fwd_bwd/<shape>/threads:N   nn::BatchNorm2d (training) forward + backward
//   cnn_step/<plain|bn>/threads:N         the whole training step (forward, cross-entropy,
//                                         backward, Adam), plain or with BatchNorm2d after each conv
//
// Compare paths in one run with interleaved repetitions (the machine may be loaded):
//   ./bench_conv_cpu --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
//                    --benchmark_report_aggregates_only=true
// docs/performance-conv.md has the measured figures and the choice they made.
#include "ember/backend/cpu/conv.hpp"
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include <ember/backend/cpu/conv.hpp>
#include <ember/backend/cpu/onednn.hpp>
#include <ember/backend/cpu/parallel.hpp>
#include <ember/ember.hpp>

using namespace ember;

namespace {

struct ConvShape {
  const char* name;
  int64_t n, c_in, hw, c_out;
};
// The CNN's two convolutions (3x3, stride 1, padding 1).
const ConvShape kConvShapes[] = {{"c1_1x28x28_32", 64, 1, 28, 32}, {"c2_32x14x14_64", 64, 32, 14, 64}};

Conv2dArgs conv_args(const ConvShape& s) {
  Conv2dArgs a;
  a.dtype = DType::Float32;
  a.n = s.n;
  a.c_in = s.c_in;
  a.h = a.w = s.hw;
  a.c_out = s.c_out;
  a.kh = a.kw = 3;
  a.pad_h = a.pad_w = 1;
  a.out_h = a.out_w = s.hw;
  return a;
}

std::vector<float> random_vector(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<int64_t>(s >> 40) % 2001 - 1000) / 1000.0f;
  }
  return v;
}

template <class F>
void timed_loop(benchmark::State& state, F&& work) {
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    work();
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}

enum class Path { Dispatch, Im2col, OneDnn, OneDnnPlain };
enum class Dir { Fwd, BwdInput, BwdWeight };

void bm_conv(benchmark::State& state, ConvShape s, Dir dir, Path path, int threads) {
  set_num_threads(threads);
  const Conv2dArgs a = conv_args(s);
  auto x = random_vector(a.n * a.c_in * a.h * a.w, 1), w = random_vector(a.c_out * a.c_in * 9, 2),
       y = random_vector(a.n * a.c_out * a.out_h * a.out_w, 3);
  std::vector<float> gx(x.size()), gw(w.size());
  Backend& be = backend_for(Device::cpu());
  auto run = [&] {
    using cpu::onednn::Layouts;
    const Layouts l = path == Path::OneDnnPlain ? Layouts::Plain : Layouts::Blocked;
    switch (dir) {
      case Dir::Fwd:
        if (path == Path::Dispatch) be.conv2d_forward(a, x.data(), w.data(), y.data());
        if (path == Path::Im2col) cpu::im2col_conv2d_forward(a, x.data(), w.data(), y.data());
        if (path >= Path::OneDnn) cpu::onednn::conv2d_forward(a, x.data(), w.data(), y.data(), l);
        break;
      case Dir::BwdInput:
        if (path == Path::Dispatch) be.conv2d_backward_input(a, y.data(), w.data(), gx.data());
        if (path == Path::Im2col) cpu::im2col_conv2d_backward_input(a, y.data(), w.data(), gx.data());
        if (path >= Path::OneDnn) cpu::onednn::conv2d_backward_input(a, y.data(), w.data(), gx.data(), l);
        break;
      case Dir::BwdWeight:
        if (path == Path::Dispatch) be.conv2d_backward_weight(a, x.data(), y.data(), gw.data());
        if (path == Path::Im2col) cpu::im2col_conv2d_backward_weight(a, x.data(), y.data(), gw.data());
        if (path >= Path::OneDnn) cpu::onednn::conv2d_backward_weight(a, x.data(), y.data(), gw.data(), l);
        break;
    }
  };
  run();  // warm-up: oneDNN builds its primitive on the first call
  timed_loop(state, run);
  const double flops = 2.0 * static_cast<double>(a.n * a.c_out * a.c_in * 9 * a.out_h * a.out_w);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

struct PoolShape {
  const char* name;
  int64_t n, c, hw;
};
const PoolShape kPoolShapes[] = {{"p1_32x28x28", 64, 32, 28}, {"p2_64x14x14", 64, 64, 14}};

void bm_max_pool(benchmark::State& state, PoolShape s, bool backward, int threads) {
  set_num_threads(threads);
  Pool2dArgs p;
  p.n = s.n;
  p.c = s.c;
  p.h = p.w = s.hw;
  p.kh = p.kw = p.stride_h = p.stride_w = 2;
  p.out_h = p.out_w = s.hw / 2;
  auto x = random_vector(p.n * p.c * p.h * p.w, 4), gx = x;
  auto y = random_vector(p.n * p.c * p.out_h * p.out_w, 5), gy = y;
  std::vector<int64_t> idx(y.size());
  Backend& be = backend_for(Device::cpu());
  be.max_pool2d_forward(p, x.data(), y.data(), idx.data());
  timed_loop(state, [&] {
    if (backward)
      be.max_pool2d_backward(p, gy.data(), idx.data(), gx.data());
    else
      be.max_pool2d_forward(p, x.data(), y.data(), idx.data());
  });
  state.counters["GB/s"] = benchmark::Counter(4.0 * static_cast<double>(x.size() + y.size() * 3),
                                              benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}

void bm_batchnorm(benchmark::State& state, PoolShape s, int threads) {
  set_num_threads(threads);
  nn::BatchNorm2d bn(s.c);
  auto x = Tensor<float>::randn({s.n, s.c, s.hw, s.hw}).set_requires_grad();
  auto gy = Tensor<float>::randn({s.n, s.c, s.hw, s.hw});
  timed_loop(state, [&] {
    auto y = bn(x);
    y.backward(gy);
  });
  state.counters["GB/s(min)"] = benchmark::Counter(4.0 * 4 * static_cast<double>(x.numel()),  // x, y, gy, gx
                                                   benchmark::Counter::kIsIterationInvariantRate,
                                                   benchmark::Counter::kIs1000);
}

std::shared_ptr<nn::Sequential> make_cnn(bool batch_norm) {
  auto m = std::make_shared<nn::Sequential>();
  m->emplace<nn::Conv2d>(1, 32, 3, nn::Conv2dOptions{.padding = {1, 1}});
  if (batch_norm) m->emplace<nn::BatchNorm2d>(32);
  m->emplace<nn::ReLU>();
  m->emplace<nn::MaxPool2d>(2);  // 28 -> 14
  m->emplace<nn::Conv2d>(32, 64, 3, nn::Conv2dOptions{.padding = {1, 1}});
  if (batch_norm) m->emplace<nn::BatchNorm2d>(64);
  m->emplace<nn::ReLU>();
  m->emplace<nn::MaxPool2d>(2);  // 14 -> 7
  m->emplace<nn::Flatten>();
  m->emplace<nn::Linear>(64 * 7 * 7, 10);
  return m;
}

void bm_cnn_step(benchmark::State& state, bool batch_norm, int threads) {
  set_num_threads(threads);
  manual_seed(0);
  auto model = make_cnn(batch_norm);
  optim::Adam opt(model->parameters(), {.lr = 1e-3});
  auto x = Tensor<float>::randn({64, 1, 28, 28});
  std::vector<int64_t> labels(64);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 10);
  auto y = Tensor<int64_t>::from_vector(labels, {64});
  auto step = [&] {
    opt.zero_grad();
    auto loss = nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    opt.step();
  };
  step();
  timed_loop(state, step);
}

void register_all() {
  const char* dirs[] = {"fwd", "bwd_input", "bwd_weight"};
  std::vector<std::pair<Path, const char*>> paths{{Path::Dispatch, "dispatch"}, {Path::Im2col, "im2col"}};
  if (cpu::onednn::available()) {
    paths.push_back({Path::OneDnn, "onednn"});
    paths.push_back({Path::OneDnnPlain, "onednn_plain"});
  }
  for (int t : {1, 2}) {
    const std::string ts = "/threads:" + std::to_string(t);
    for (const ConvShape& s : kConvShapes)
      for (int d = 0; d < 3; ++d)
        for (auto [p, pname] : paths)
          benchmark::RegisterBenchmark((std::string("conv_") + dirs[d] + "/" + s.name + "/" + pname + ts).c_str(),
                                       bm_conv, s, static_cast<Dir>(d), p, t)
              ->UseManualTime()
              ->Unit(benchmark::kMicrosecond);
    for (const PoolShape& s : kPoolShapes) {
      for (bool b : {false, true})
        benchmark::RegisterBenchmark((std::string("max_pool_") + (b ? "bwd/" : "fwd/") + s.name + ts).c_str(),
                                     bm_max_pool, s, b, t)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark((std::string("batchnorm_fwd_bwd/") + s.name + ts).c_str(), bm_batchnorm, s, t)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
    for (bool bn : {false, true})
      benchmark::RegisterBenchmark((std::string("cnn_step/") + (bn ? "bn" : "plain") + ts).c_str(), bm_cnn_step, bn, t)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  benchmark::AddCustomContext("OPENBLAS_CORETYPE", coretype ? coretype : "(unset: OpenBLAS's own choice)");
  benchmark::AddCustomContext("openblas_core", blas_core_name());
  benchmark::AddCustomContext("onednn", cpu::onednn::available() ? "yes" : "no");
#if defined(EMBER_HAVE_ONEDNN)
  for (const ConvShape& s : kConvShapes)
    for (auto [d, name] : {std::pair{cpu::onednn::ConvDirection::Forward, "fwd"},
                           std::pair{cpu::onednn::ConvDirection::BackwardInput, "bwd_input"},
                           std::pair{cpu::onednn::ConvDirection::BackwardWeight, "bwd_weight"}})
      for (auto l : {cpu::onednn::Layouts::Blocked, cpu::onednn::Layouts::Plain})
        benchmark::AddCustomContext(std::string(l == cpu::onednn::Layouts::Plain ? "onednn_plain/" : "onednn/") +
                                        s.name + "/" + name,
                                    cpu::onednn::implementation(conv_args(s), d, l));
#endif
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
