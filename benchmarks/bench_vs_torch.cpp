// ember's half of the PyTorch comparison (twin: bench_vs_torch.py, same workloads,
// same shapes, same timing rule); benchmarks/vs_torch.sh runs the two interleaved and prints the
// ratio table. A plain main, so that it also builds against older ember trees (the "before" table).
//
// Run: ./bench_vs_torch --threads N [--min-time S] [--only NAME]
// Prints one line per workload: "<name> <threads> <median seconds per call>", then
// "copy_GBps <threads> <GB/s>" (a STREAM-like copy of 64 MB, read + write bytes counted, on N
// std::threads), "blas_core <name>" and (trees that have it) "gemm_library <description>".
// Timing rule (both twins): one warm-up call, then calls until min-time seconds and at least 3 calls;
// the median call is reported.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <ember/ember.hpp>

#if __has_include(<ember/backend/cpu/parallel.hpp>)
#include <ember/backend/cpu/parallel.hpp>
#define EMBER_BENCH_HAVE_THREADS 1
#endif
#if __has_include(<ember/backend/cpu/gemm_choice.hpp>)
#include <ember/backend/cpu/gemm_choice.hpp>
#endif

using namespace ember;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median_time(const std::function<void()>& f, double min_time) {
  f();  // warm-up
  std::vector<double> t;
  const double start = now();
  while (t.size() < 3 || now() - start < min_time) {
    const double a = now();
    f();
    t.push_back(now() - a);
    if (t.size() >= 200) break;
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// STREAM-like copy: dst = src over 16M floats, split over `threads` std::threads.
double copy_bandwidth(int threads, double min_time) {
  const size_t n = size_t{1} << 24;
  std::vector<float> src(n, 1.0f), dst(n, 0.0f);
  auto run = [&] {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const size_t lo = n * t / threads, hi = n * (t + 1) / threads;
        std::memcpy(dst.data() + lo, src.data() + lo, (hi - lo) * sizeof(float));
      });
    for (auto& th : pool) th.join();
  };
  const double s = median_time(run, min_time);
  return 2.0 * n * sizeof(float) / s / 1e9;
}

struct Workload {
  std::string name;
  std::function<std::function<void()>()> make;  // builds the state, returns one call
};

std::vector<Workload> workloads() {
  std::vector<Workload> w;
  w.push_back({"mlp_sgd", [] {
                 auto model = std::make_shared<nn::Sequential>();
                 model->emplace<nn::Linear>(784, 1024);
                 model->emplace<nn::ReLU>();
                 model->emplace<nn::Linear>(1024, 1024);
                 model->emplace<nn::ReLU>();
                 model->emplace<nn::Linear>(1024, 10);
                 auto opt = std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 0.01});
                 auto x = Tensor<float>::randn({256, 784});
                 auto y = Tensor<int64_t>::zeros({256});
                 return std::function<void()>([=] {
                   opt->zero_grad();
                   auto loss = nn::functional::cross_entropy(model->forward(x), y);
                   loss.backward();
                   opt->step();
                 });
               }});
  w.push_back({"cnn_adam", [] {
                 auto model = std::make_shared<nn::Sequential>();
                 model->emplace<nn::Conv2d>(1, 32, std::array<int64_t, 2>{3, 3}, nn::Conv2dOptions{.padding = {1, 1}});
                 model->emplace<nn::ReLU>();
                 model->emplace<nn::MaxPool2d>(2);
                 model->emplace<nn::Conv2d>(32, 64, std::array<int64_t, 2>{3, 3}, nn::Conv2dOptions{.padding = {1, 1}});
                 model->emplace<nn::ReLU>();
                 model->emplace<nn::MaxPool2d>(2);
                 model->emplace<nn::Flatten>();
                 model->emplace<nn::Linear>(64 * 7 * 7, 10);
                 auto opt = std::make_shared<optim::Adam>(model->parameters(), optim::AdamOptions{.lr = 1e-3});
                 auto x = Tensor<float>::randn({64, 1, 28, 28});
                 auto y = Tensor<int64_t>::zeros({64});
                 return std::function<void()>([=] {
                   opt->zero_grad();
                   auto loss = nn::functional::cross_entropy(model->forward(x), y);
                   loss.backward();
                   opt->step();
                 });
               }});
  w.push_back({"transformer_adamw", [] {
                 auto model = std::make_shared<nn::Sequential>();
                 for (int i = 0; i < 4; ++i) model->emplace<nn::TransformerBlock>(256, 4);
                 auto opt = std::make_shared<optim::AdamW>(model->parameters(), optim::AdamOptions{.lr = 1e-3});
                 auto x = Tensor<float>::randn({8, 128, 256});
                 return std::function<void()>([=] {
                   opt->zero_grad();
                   auto out = model->forward(x);
                   auto loss = mean(out * out);
                   loss.backward();
                   opt->step();
                 });
               }});
  w.push_back({"layernorm_fwd", [] {
                 auto ln = std::make_shared<nn::LayerNorm>(1024);
                 auto x = Tensor<float>::randn({8192, 1024});
                 return std::function<void()>([=] {
                   NoGradGuard ng;
                   auto y = ln->forward(x);
                 });
               }});
  w.push_back({"layernorm_fwd_bwd", [] {
                 auto ln = std::make_shared<nn::LayerNorm>(1024);
                 auto x = Tensor<float>::randn({8192, 1024}).set_requires_grad();
                 auto gy = Tensor<float>::randn({8192, 1024});
                 return std::function<void()>([=]() mutable {
                   x.zero_grad();
                   ln->zero_grad();
                   ln->forward(x).backward(gy);
                 });
               }});
  w.push_back({"softmax_fwd", [] {
                 auto x = Tensor<float>::randn({8192, 1024});
                 return std::function<void()>([=] {
                   NoGradGuard ng;
                   auto y = softmax(x, -1);
                 });
               }});
  w.push_back({"softmax_fwd_bwd", [] {
                 auto x = Tensor<float>::randn({8192, 1024}).set_requires_grad();
                 auto gy = Tensor<float>::randn({8192, 1024});
                 return std::function<void()>([=]() mutable {
                   x.zero_grad();
                   softmax(x, -1).backward(gy);
                 });
               }});
  w.push_back({"attention_fwd_bwd", [] {
                 // the transformer row's attention alone: batch 8, 4 heads, T 128, head size 64, causal
                 auto q = Tensor<float>::randn({8, 4, 128, 64}).set_requires_grad();
                 auto k = Tensor<float>::randn({8, 4, 128, 64}).set_requires_grad();
                 auto v = Tensor<float>::randn({8, 4, 128, 64}).set_requires_grad();
                 auto gy = Tensor<float>::randn({8, 4, 128, 64});
                 return std::function<void()>([=]() mutable {
                   q.zero_grad();
                   k.zero_grad();
                   v.zero_grad();
                   nn::functional::scaled_dot_product_attention(q, k, v, {.is_causal = true}).backward(gy);
                 });
               }});
  w.push_back({"add_16M", [] {
                 auto a = Tensor<float>::randn({int64_t{1} << 24});
                 auto b = Tensor<float>::randn({int64_t{1} << 24});
                 return std::function<void()>([=] {
                   NoGradGuard ng;
                   auto c = a + b;
                 });
               }});
  w.push_back({"sgemm_1024", [] {
                 auto a = Tensor<float>::randn({1024, 1024});
                 auto b = Tensor<float>::randn({1024, 1024});
                 return std::function<void()>([=] {
                   NoGradGuard ng;
                   auto c = matmul(a, b);
                 });
               }});
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  double min_time = 1.0;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--min-time" && i + 1 < argc) min_time = std::atof(argv[++i]);
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s --threads N [--min-time S] [--only NAME]\n", argv[0]);
      return 2;
    }
  }
#if defined(EMBER_BENCH_HAVE_THREADS)
  set_num_threads(threads);
  std::printf("blas_core %s\n", blas_core_name().empty() ? "none" : blas_core_name().c_str());
#if defined(EMBER_CPU_HAVE_SGEMM_LIBRARIES)
  std::printf("gemm_library %s\n", cpu::sgemm_libraries());
#endif
#else
  // An ember without set_num_threads: its kernels are serial; OpenBLAS follows OPENBLAS_NUM_THREADS
  // (vs_torch.sh sets it).
  std::printf("blas_core unknown(no-parallel.hpp)\n");
#endif
  for (const Workload& w : workloads()) {
    if (!only.empty() && w.name != only) continue;
    auto call = w.make();
    const double s = median_time(call, min_time);
    std::printf("%s %d %.6g\n", w.name.c_str(), threads, s);
    std::fflush(stdout);
  }
  if (only.empty() || only == "copy") std::printf("copy_GBps %d %.4g\n", threads, copy_bandwidth(threads, min_time));
  return 0;
}
