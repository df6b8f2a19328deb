// Microbenchmark for the GPU run (not part of the CMake build): the packed softmax and LayerNorm
// row kernels (kernels/softmax.cuh, norm.cuh) against the loop / register kernels, CUDA events,
// median of 50, outputs checked against a double reference and against each other. On the GPU
// machine, from the repository root:
//   nvcc -O3 -std=c++20 --expt-relaxed-constexpr -arch=sm_90 -Iinclude \
//     tools/kernel-variants/rows_microbench.cu -o /tmp/rows && /tmp/rows
//   python3 tools/kernel-variants/torch_rows.py   (PyTorch on the same shapes)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "ember/backend/cuda/kernels/norm.cuh"

using namespace ember;
using namespace ember::cuda_impl;

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); return 1; } } while (0)

template <class T> T from_f(float v) { if constexpr (std::is_same_v<T, float>) return v; else return T(v); }
template <class T> double to_d(T v) { if constexpr (std::is_same_v<T, float>) return v; else return static_cast<double>(static_cast<float>(v)); }

template <class F>
float median_us(F&& f, cudaStream_t s) {
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  for (int i = 0; i < 5; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < 50; ++i) {
    cudaEventRecord(a, s); f(); cudaEventRecord(b, s); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); t.push_back(ms * 1000.f);
  }
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a); cudaEventDestroy(b);
  return t[t.size() / 2];
}

template <class T>
int run(const char* tname, int64_t rows, int64_t cols, bool log, int sms, cudaStream_t s) {
  const size_t n = size_t(rows) * cols;
  std::vector<T> hx(n), hg(n);
  std::mt19937 gen(42);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (auto& v : hx) v = from_f<T>(nd(gen));
  for (auto& v : hg) v = from_f<T>(nd(gen));
  T *x, *y, *y2, *g, *gx, *gx2;
  CK(cudaMalloc(&x, n * sizeof(T))); CK(cudaMalloc(&y, n * sizeof(T))); CK(cudaMalloc(&y2, n * sizeof(T)));
  CK(cudaMalloc(&g, n * sizeof(T))); CK(cudaMalloc(&gx, n * sizeof(T))); CK(cudaMalloc(&gx2, n * sizeof(T)));
  CK(cudaMemcpy(x, hx.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(g, hg.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemset(y, 0xff, n * sizeof(T))); CK(cudaMemset(gx, 0xff, n * sizeof(T)));  // poisoned (NaN)
  const SoftmaxLaunch l = softmax_launch(rows, cols, sms);
  auto lib_f = [&] { launch_softmax_forward<T>(x, y, rows, cols, log, sms, s); };
  auto loop_f = [&] {
    if (l.block_per_row) softmax_kernel<T, true><<<l.grid, l.threads, 0, s>>>(x, y2, rows, cols, log);
    else softmax_kernel<T, false><<<l.grid, l.threads, 0, s>>>(x, y2, rows, cols, log);
  };
  auto lib_b = [&] { launch_softmax_backward<T>(y, g, gx, rows, cols, log, sms, s); };
  auto loop_b = [&] {
    if (l.block_per_row) softmax_backward_kernel<T, true><<<l.grid, l.threads, 0, s>>>(y, g, gx2, rows, cols, log);
    else softmax_backward_kernel<T, false><<<l.grid, l.threads, 0, s>>>(y, g, gx2, rows, cols, log);
  };
  lib_f(); loop_f(); CK(cudaStreamSynchronize(s)); lib_b(); loop_b();
  CK(cudaStreamSynchronize(s));
  CK(cudaGetLastError());
  // correctness: first 256 rows against a double reference; lib vs loop over everything
  std::vector<T> hy(n), hy2(n), hgx(n), hgx2(n);
  CK(cudaMemcpy(hy.data(), y, n * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hy2.data(), y2, n * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hgx.data(), gx, n * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hgx2.data(), gx2, n * sizeof(T), cudaMemcpyDeviceToHost));
  double ref_err = 0, ref_gerr = 0, lib_loop = 0, lib_loop_g = 0;
  for (int64_t r = 0; r < std::min<int64_t>(rows, 256); ++r) {
    double mx = -INFINITY, sum = 0;
    for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, to_d(hx[r * cols + c]));
    for (int64_t c = 0; c < cols; ++c) sum += std::exp(to_d(hx[r * cols + c]) - mx);
    double dot = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double yy = to_d(hy[r * cols + c]);  // the backward's input is the device's y
      dot += log ? to_d(hg[r * cols + c]) : to_d(hg[r * cols + c]) * yy;
    }
    for (int64_t c = 0; c < cols; ++c) {
      const double xv = to_d(hx[r * cols + c]);
      const double ref = log ? xv - mx - std::log(sum) : std::exp(xv - mx) / sum;
      ref_err = std::max(ref_err, std::abs(to_d(hy[r * cols + c]) - ref) / (std::abs(ref) + (log ? 1.0 : 1e-3)));
      const double yy = to_d(hy[r * cols + c]), gg = to_d(hg[r * cols + c]);
      const double gref = log ? gg - std::exp(yy) * dot : yy * (gg - dot);
      ref_gerr = std::max(ref_gerr, std::abs(to_d(hgx[r * cols + c]) - gref) / (std::abs(gref) + 1e-3));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const double a = to_d(hy[i]), b = to_d(hy2[i]);
    lib_loop = std::max(lib_loop, std::isnan(a) != std::isnan(b) ? 1e9 : std::abs(a - b) / (std::abs(b) + 1e-6));
    const double c = to_d(hgx[i]), d = to_d(hgx2[i]);
    lib_loop_g = std::max(lib_loop_g, std::isnan(c) != std::isnan(d) ? 1e9 : std::abs(c - d) / (std::abs(d) + 1e-3));
  }
  const int k = softmax_packs_per_lane<T>(cols, {x, y});
  const float t_lib_f = median_us(lib_f, s), t_loop_f = median_us(loop_f, s);
  const float t_lib_b = median_us(lib_b, s), t_loop_b = median_us(loop_b, s);
  CK(cudaGetLastError());
  const double gb = 2.0 * n * sizeof(T) / 1e3, gbb = 3.0 * n * sizeof(T) / 1e3;
  printf("%-5s %6lld x %5lld %-3s packs/lane %2d | fwd lib %8.1f us (%5.0f GB/s) loop %8.1f | bwd lib %8.1f (%5.0f GB/s) loop %8.1f | err ref %.1e/%.1e lib-loop %.1e/%.1e\n",
         tname, (long long)rows, (long long)cols, log ? "log" : "sm", k, t_lib_f, gb / t_lib_f, t_loop_f, t_lib_b, gbb / t_lib_b,
         t_loop_b, ref_err, ref_gerr, lib_loop, lib_loop_g);
  cudaFree(x); cudaFree(y); cudaFree(y2); cudaFree(g); cudaFree(gx); cudaFree(gx2);
  return 0;
}

template <class T>
int run_norm(const char* tname, int64_t rows, int64_t cols, bool rms, int sms, cudaStream_t s) {
  using S = norm_stat_t<T>;
  const size_t n = size_t(rows) * cols;
  std::vector<T> hx(n), hg(n), hw(cols), hb(cols);
  std::mt19937 gen(7);
  std::normal_distribution<float> nd(0.5f, 2.f);
  for (auto& v : hx) v = from_f<T>(nd(gen));
  for (auto& v : hg) v = from_f<T>(nd(gen));
  for (auto& v : hw) v = from_f<T>(nd(gen));
  for (auto& v : hb) v = from_f<T>(nd(gen));
  T *x, *g, *w, *b, *y, *y2, *gx, *gx2;
  S *m, *m2, *rs, *rs2;
  CK(cudaMalloc(&x, n * sizeof(T))); CK(cudaMalloc(&g, n * sizeof(T))); CK(cudaMalloc(&y, n * sizeof(T)));
  CK(cudaMalloc(&y2, n * sizeof(T))); CK(cudaMalloc(&gx, n * sizeof(T))); CK(cudaMalloc(&gx2, n * sizeof(T)));
  CK(cudaMalloc(&w, cols * sizeof(T))); CK(cudaMalloc(&b, cols * sizeof(T)));
  CK(cudaMalloc(&m, rows * sizeof(S))); CK(cudaMalloc(&m2, rows * sizeof(S)));
  CK(cudaMalloc(&rs, rows * sizeof(S))); CK(cudaMalloc(&rs2, rows * sizeof(S)));
  CK(cudaMemcpy(x, hx.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(g, hg.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(w, hw.data(), cols * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(b, hb.data(), cols * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemset(y, 0xff, n * sizeof(T))); CK(cudaMemset(gx, 0xff, n * sizeof(T)));
  const SoftmaxLaunch l = softmax_launch(rows, cols, sms);
  T* bb = rms ? nullptr : b;
  auto lib_f = [&] { launch_norm_forward<T>(x, w, bb, y, rms ? nullptr : m, rs, rows, cols, 1e-5, rms, sms, s); };
  auto reg_f = [&] { norm_forward_kernel<T, false><<<l.grid, l.threads, 0, s>>>(x, w, bb, y2, rms ? nullptr : m2, rs2, rows, cols, 1e-5, rms); };
  auto lib_b = [&] { launch_norm_backward<T>(x, w, m, rs, g, gx, rows, cols, rms, sms, s); };
  auto reg_b = [&] { norm_backward_kernel<T, false><<<l.grid, l.threads, 0, s>>>(x, w, m, rs, g, gx2, rows, cols, rms); };
  lib_f(); reg_f(); CK(cudaStreamSynchronize(s)); lib_b(); reg_b();
  CK(cudaStreamSynchronize(s)); CK(cudaGetLastError());
  std::vector<T> a(n), c(n), d(n), e(n);
  CK(cudaMemcpy(a.data(), y, n * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(c.data(), y2, n * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(d.data(), gx, n * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(e.data(), gx2, n * sizeof(T), cudaMemcpyDeviceToHost));
  double dy = 0, dg = 0;
  for (size_t i = 0; i < n; ++i) {
    const double p = to_d(a[i]), q = to_d(c[i]);
    dy = std::max(dy, std::isnan(p) != std::isnan(q) ? 1e9 : std::abs(p - q) / (std::abs(q) + 1e-2));
    const double u = to_d(d[i]), v = to_d(e[i]);
    dg = std::max(dg, std::isnan(u) != std::isnan(v) ? 1e9 : std::abs(u - v) / (std::abs(v) + 1e-2));
  }
  const int k = softmax_packs_per_lane<T>(cols, {x, y, w, bb});
  const float t1 = median_us(lib_f, s), t2 = median_us(reg_f, s), t3 = median_us(lib_b, s), t4 = median_us(reg_b, s);
  CK(cudaGetLastError());
  printf("norm  %-5s %6lld x %5lld %-3s packs/lane %2d | fwd lib %8.1f us (%5.0f GB/s) reg %8.1f | bwd lib %8.1f (%5.0f GB/s) reg %8.1f | lib-reg %.1e/%.1e\n",
         tname, (long long)rows, (long long)cols, rms ? "rms" : "ln", k, t1, 2.0 * n * sizeof(T) / 1e3 / t1, t2, t3,
         3.0 * n * sizeof(T) / 1e3 / t3, t4, dy, dg);
  cudaFree(x); cudaFree(g); cudaFree(w); cudaFree(b); cudaFree(y); cudaFree(y2); cudaFree(gx); cudaFree(gx2);
  cudaFree(m); cudaFree(m2); cudaFree(rs); cudaFree(rs2);
  return 0;
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaStream_t s;
  cudaStreamCreate(&s);
  int rc = 0;
  rc |= run<float>("f32", 65536, 1024, false, sms, s);
  rc |= run<float>("f32", 65536, 1024, true, sms, s);
  rc |= run<ember::half>("f16", 65536, 1024, false, sms, s);
  rc |= run<ember::bfloat16>("bf16", 65536, 1024, false, sms, s);
  rc |= run<double>("f64", 32768, 1024, false, sms, s);
  rc |= run<float>("f32", 262144, 256, false, sms, s);
  rc |= run<float>("f32", 524288, 128, false, sms, s);
  rc |= run<float>("f32", 65536, 1000, false, sms, s);
  rc |= run<float>("f32", 65536, 4096, false, sms, s);
  rc |= run<float>("f32", 131072, 512, true, sms, s);
  rc |= run<ember::half>("f16", 262144, 256, true, sms, s);
  rc |= run<float>("f32", 1000, 8, false, sms, s);
  rc |= run_norm<float>("f32", 32768, 1024, false, sms, s);
  rc |= run_norm<float>("f32", 32768, 1024, true, sms, s);
  rc |= run_norm<ember::half>("f16", 32768, 1024, false, sms, s);
  rc |= run_norm<ember::bfloat16>("bf16", 32768, 1024, false, sms, s);
  rc |= run_norm<float>("f32", 65536, 768, false, sms, s);
  rc |= run_norm<float>("f32", 131072, 256, false, sms, s);
  rc |= run_norm<double>("f64", 32768, 512, false, sms, s);
  return rc;
}
