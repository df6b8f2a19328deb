// The BLAS on the transformer's GEMM shapes: which library to link, and whether a
// GELU applied to each block of rows right after the GEMM beats the GEMM then a GELU pass.
// A plain main calling the Fortran sgemm_ symbol, so the same source links any BLAS:
//   ./bench_blas_shapes [min seconds per shape, default 0.5] [--gelu-epilogue] [--onednn]
// --onednn: the same shapes through oneDNN's dnnl_sgemm instead (builds with oneDNN; the fp32
// GEMM that backend/cpu/gemm.hpp chooses, docs/performance.md "GEMM through oneDNN"). Run the
// two interleaved, OMP_NUM_THREADS=1 and 2.
// CMake links the BLAS ember found (Debian's OpenBLAS). Against MKL from PyPI (`pip download mkl
// intel-openmp`, wheels unzipped under $MKL) the same file builds with
//   g++ -O2 -std=c++20 -I include benchmarks/bench_blas_shapes.cpp -o bench_blas_shapes_mkl \
//       -L$MKL/lib -lmkl_rt -Wl,-rpath,$MKL/lib -fopenmp
// and runs with MKL_THREADING_LAYER=GNU MKL_INTERFACE_LAYER=GNU,LP64 (libgomp, as OpenBLAS's
// OpenMP build). Run both interleaved with OMP_NUM_THREADS=1 (docs/performance.md, "MKL instead
// of OpenBLAS").
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ember/backend/cpu/vector_math.hpp"
#if defined(EMBER_HAVE_ONEDNN)
#include <dnnl.h>
#endif

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

namespace {

bool use_onednn = false;

struct GemmShape {
  const char* name;
  int m, n, k;  // row-major C[m, n] = op(A)[m, k] op(B)[k, n]
  bool ta, tb;
  int batch;
};

// Row-major C = op(A) op(B) + beta C through the column-major BLAS (operands swapped), as ember's
// backend/cpu/gemm.hpp calls it.
void gemm_rm(bool ta, bool tb, int m, int n, int k, const float* a, const float* b, float beta, float* c) {
  const char tA = ta ? 'T' : 'N', tB = tb ? 'T' : 'N';
  const int lda = ta ? m : k, ldb = tb ? k : n, ldc = n;
  const float alpha = 1.0f;
#if defined(EMBER_HAVE_ONEDNN)
  if (use_onednn) {
    dnnl_sgemm(tA, tB, m, n, k, alpha, a, ta ? m : k, b, tb ? k : n, beta, c, n);
    return;
  }
#endif
  sgemm_(&tB, &tA, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);
}

template <class F>
double best_seconds(double min_time, F&& f) {
  f();  // warm-up
  double best = 1e30, elapsed = 0;
  int runs = 0;
  while (elapsed < min_time || runs < 3) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
    elapsed += s;
    ++runs;
  }
  return best;
}

void fill(std::vector<float>& v, int mul) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * static_cast<size_t>(mul)) % 13) * 0.05f - 0.3f;
}

// The transformer of bench_vs_torch (d 256, 4 heads, T 128, batch 8: 1024 rows, MLP 1024).
void shapes(double min_time) {
  const GemmShape list[] = {
      {"qkv forward 1024x768x256 (x W^T)", 1024, 768, 256, false, true, 1},
      {"out_proj forward 1024x256x256", 1024, 256, 256, false, true, 1},
      {"c_fc forward 1024x1024x256", 1024, 1024, 256, false, true, 1},
      {"c_proj forward 1024x256x1024", 1024, 256, 1024, false, true, 1},
      {"qkv dx 1024x256x768 (gy W)", 1024, 256, 768, false, false, 1},
      {"qkv dW 768x256x1024 (gy^T x)", 768, 256, 1024, true, false, 1},
      {"c_fc dx 1024x256x1024", 1024, 256, 1024, false, false, 1},
      {"c_fc dW 1024x256x1024", 1024, 256, 1024, true, false, 1},
      {"c_proj dx 1024x1024x256", 1024, 1024, 256, false, false, 1},
      {"c_proj dW 256x1024x1024", 256, 1024, 1024, true, false, 1},
      {"attention scores 32 x 128x128x64", 128, 128, 64, false, true, 32},
      {"attention output 32 x 128x64x128", 128, 64, 128, false, false, 32},
      {"sgemm 1024^3", 1024, 1024, 1024, false, false, 1},
  };
  double total = 0;
  for (const GemmShape& s : list) {
    std::vector<float> a(static_cast<size_t>(s.m) * s.k * s.batch), b(static_cast<size_t>(s.k) * s.n * s.batch),
        c(static_cast<size_t>(s.m) * s.n * s.batch);
    fill(a, 7);
    fill(b, 5);
    const double t = best_seconds(min_time, [&] {
      for (int i = 0; i < s.batch; ++i)
        gemm_rm(s.ta, s.tb, s.m, s.n, s.k, a.data() + static_cast<size_t>(i) * s.m * s.k,
                b.data() + static_cast<size_t>(i) * s.k * s.n, 0.0f, c.data() + static_cast<size_t>(i) * s.m * s.n);
    });
    total += t;
    std::printf("%-36s %8.3f ms %7.1f GFLOP/s\n", s.name, t * 1e3, 2.0 * s.m * s.n * s.k * s.batch / t / 1e9);
  }
  std::printf("%-36s %8.3f ms\n", "total", total * 1e3);
}

// y = gelu(x W^T + b), x [1024, 256], W [1024, 256]: whole GEMM then one GELU pass, against the GELU
// applied to each block of rows right after its GEMM (the block still in cache).
void gelu_epilogue(double min_time) {
  const int m = 1024, n = 1024, k = 256;
  std::vector<float> x(static_cast<size_t>(m) * k), w(static_cast<size_t>(n) * k), bias(n, 0.01f),
      pre(static_cast<size_t>(m) * n), y(static_cast<size_t>(m) * n);
  fill(x, 7);
  fill(w, 5);
  auto rows = [&](int r0, int count) {
    for (int r = r0; r < r0 + count; ++r) std::memcpy(&pre[static_cast<size_t>(r) * n], bias.data(), sizeof(float) * n);
    gemm_rm(false, true, count, n, k, &x[static_cast<size_t>(r0) * k], w.data(), 1.0f, &pre[static_cast<size_t>(r0) * n]);
    ember::cpu::detail::gelu_tanh_f32(&pre[static_cast<size_t>(r0) * n], &y[static_cast<size_t>(r0) * n],
                                      static_cast<int64_t>(count) * n);
  };
  const double gemm = best_seconds(min_time, [&] { gemm_rm(false, true, m, n, k, x.data(), w.data(), 1.0f, pre.data()); });
  const double pass = best_seconds(min_time, [&] { ember::cpu::detail::gelu_tanh_f32(pre.data(), y.data(), int64_t{m} * n); });
  std::printf("GEMM alone %.3f ms, GELU pass alone %.3f ms (%d lanes)\n", gemm * 1e3, pass * 1e3,
              ember::cpu::detail::lanes());
  for (int block : {m, 256, 128, 64}) {
    const double t = best_seconds(min_time, [&] {
      for (int r0 = 0; r0 < m; r0 += block) rows(r0, std::min(block, m - r0));
    });
    std::printf("bias + GEMM + GELU by blocks of %4d rows: %.3f ms\n", block, t * 1e3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  double min_time = 0.5;
  bool epilogue = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--gelu-epilogue") == 0) epilogue = true;
    else if (std::strcmp(argv[i], "--onednn") == 0) {
#if defined(EMBER_HAVE_ONEDNN)
      use_onednn = true;
#else
      std::fprintf(stderr, "bench_blas_shapes: built without oneDNN, --onednn is not available\n");
      return 2;
#endif
    }
    else min_time = std::atof(argv[i]);
  }
  if (epilogue) gelu_epilogue(min_time);
  else shapes(min_time);
  return 0;
}
