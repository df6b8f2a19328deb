// matmul, linear and linear_act (ops/linalg.hpp) and the GEMMs under them: forward values against
// a naive triple loop for every transpose combination, batched 3D/4D, batch broadcasting and
// vectors; fp16/bf16 against fp32; linear_act (Linear with its activation fused) against its
// composite, bit for bit on the CPU, and against the CPU on CUDA (a real GPU, else skipped; the
// pretend device checks the device plumbing in CI). Each op's gradient check, bad inputs and NaN
// semantics come from the registry (tests/op_cases.hpp).
#include "ember/backend/cpu/gemm.hpp"
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <array>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <ember/ember.hpp>

#include "ember/backend/cpu/gemm_choice.hpp"
#include "ember/backend/cpu/parallel.hpp"
#include "gpu_skip.hpp"
#include "pretend_gpu.hpp"
#include "test_util.hpp"

#if defined(EMBER_TEST_HAVE_CUDA)
#include <ember/backend/cuda/cublas_lt.hpp>  // the parity test checks which path linear_act takes
#endif

using namespace ember;
using namespace ember::testing;

namespace {

// Shape of a stored operand: batch dims, then [rows, cols] of op(X) transposed back if t.
Shape operand(std::vector<int64_t> batch, int64_t rows, int64_t cols, bool t) {
  batch.push_back(t ? cols : rows);
  batch.push_back(t ? rows : cols);
  return Shape(batch);
}

// Naive reference: op(A)[m,k] op(B)[k,n] per batch entry; an operand of rank 2 is shared by every
// batch entry. Returns the values of the [batch..., m, n] result.
std::vector<double> ref_matmul(const std::vector<double>& a, const Shape& as, const std::vector<double>& b,
                               const Shape& bs, bool ta, bool tb) {
  const int64_t ar = as[as.dim() - 2], ac = as[as.dim() - 1], br = bs[bs.dim() - 2], bc = bs[bs.dim() - 1];
  const int64_t na = as.numel() / (ar * ac), nb = bs.numel() / (br * bc);
  const int64_t m = ta ? ac : ar, k = ta ? ar : ac, n = tb ? br : bc;
  const int64_t batch = std::max(na, nb);
  std::vector<double> c(static_cast<size_t>(batch * m * n), 0.0);
  for (int64_t q = 0; q < batch; ++q) {
    const double* A = a.data() + (na == 1 ? 0 : q) * ar * ac;
    const double* B = b.data() + (nb == 1 ? 0 : q) * br * bc;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double av = ta ? A[p * ac + i] : A[i * ac + p];
          const double bv = tb ? B[j * bc + p] : B[p * bc + j];
          s += av * bv;
        }
        c[static_cast<size_t>((q * m + i) * n + j)] = s;
      }
  }
  return c;
}

struct MatmulCase {
  std::vector<int64_t> a_batch, b_batch;
  std::vector<int64_t> out_batch;
};

const std::vector<MatmulCase>& batch_cases() {
  static const std::vector<MatmulCase> c = {
      {{}, {}, {}},                  // 2D
      {{2}, {2}, {2}},               // batched 3D
      {{2, 3}, {2, 3}, {2, 3}},      // batched 4D
      {{3}, {}, {3}},                // 3D x 2D (batch broadcast)
      {{}, {3}, {3}},                // 2D x 3D
      {{2, 2}, {}, {2, 2}},          // 4D x 2D
      {{}, {2, 2}, {2, 2}},          // 2D x 4D
  };
  return c;
}

}  // namespace

// ================================================================ forward values

TEST_CASE("matmul float64 and float32 forward vs naive triple loop, shapes x transposes x batch layouts",
          "[linalg][forward]") {
  struct Mkn {
    int64_t m, k, n;
  };
  const std::vector<Mkn> sizes = {{1, 1, 1}, {3, 4, 5}, {7, 1, 3}, {1, 9, 1}, {17, 33, 9}, {64, 48, 40}};
  for (DType t : {DType::Float64, DType::Float32}) {
    for (const MatmulCase& mc : batch_cases()) {
      for (const Mkn& sz : sizes) {
        if (!mc.out_batch.empty() && sz.m * sz.k > 1000) continue;  // keep batched cases small
        for (bool ta : {false, true})
          for (bool tb : {false, true}) {
            INFO(dtype_name(t) << " a batch " << list_str(mc.a_batch, "[", "]") << " b batch " << list_str(mc.b_batch, "[", "]")
                               << " m,k,n " << sz.m << "," << sz.k << "," << sz.n << " trans_a " << ta << " trans_b "
                               << tb);
            const Shape as = operand(mc.a_batch, sz.m, sz.k, ta), bs = operand(mc.b_batch, sz.k, sz.n, tb);
            AnyTensor a = rand1(as, 3 + sz.m).to(t), b = rand1(bs, 5 + sz.n).to(t);
            AnyTensor c = op::matmul(a, b, ta, tb);
            std::vector<int64_t> os = mc.out_batch;
            os.push_back(sz.m);
            os.push_back(sz.n);
            CHECK(c.shape() == Shape(os));
            CHECK(c.dtype() == t);
            std::vector<double> want = ref_matmul(vals(a), as, vals(b), bs, ta, tb);
            check_close(vals(c), want, t == DType::Float64 ? 1e-12 : 1e-5, t == DType::Float64 ? 1e-13 : 1e-5);
          }
      }
    }
  }
}

TEST_CASE("matmul float64 forward known values 2x3 times 3x2 and vector shapes", "[linalg][forward]") {
  AnyTensor a = dt({1, 2, 3, 4, 5, 6}, {2, 3}), b = dt({7, 8, 9, 10, 11, 12}, {3, 2});
  check_close(vals(op::matmul(a, b)), {58, 64, 139, 154}, 0);
  check_close(vals(op::matmul(a, a, false, true)), {14, 32, 32, 77}, 0);
  check_close(vals(op::matmul(a, a, true, false)), {17, 22, 27, 22, 29, 36, 27, 36, 45}, 0);
  AnyTensor v = dt({1, 0, -1}, {3});
  AnyTensor av = op::matmul(a, v);  // [2]
  CHECK(av.shape() == Shape{2});
  check_close(vals(av), {-2, -2}, 0);
  AnyTensor vb = op::matmul(v, b);  // [2]
  CHECK(vb.shape() == Shape{2});
  check_close(vals(vb), {-4, -4}, 0);
  AnyTensor vv = op::matmul(v, v);
  CHECK(vv.dim() == 0);
  check_close(vals(vv), {2}, 0);
  AnyTensor bat = op::matmul(op::concat({a.reshape({1, 2, 3}), op::neg(a).reshape({1, 2, 3})}, 0), v);  // [2,2]
  CHECK(bat.shape() == Shape{2, 2});
  check_close(vals(bat), {-2, -2, 2, 2}, 0);
  AnyTensor vbat = op::matmul(v, op::concat({b.reshape({1, 3, 2}), b.reshape({1, 3, 2})}, 0));  // [2,2]
  CHECK(vbat.shape() == Shape{2, 2});
  check_close(vals(vbat), {-4, -4, -4, -4}, 0);
}

TEST_CASE("matmul float32 empty shapes: k = 0 gives zeros, m = 0 gives an empty result", "[linalg][forward]") {
  AnyTensor a = AnyTensor::zeros({3, 0}, DType::Float32), b = AnyTensor::zeros({0, 2}, DType::Float32);
  AnyTensor c = op::matmul(a, b);
  CHECK(c.shape() == Shape{3, 2});
  check_close(vals(c), std::vector<double>(6, 0.0), 0);
  AnyTensor e = op::matmul(AnyTensor::zeros({0, 4}, DType::Float32), AnyTensor::zeros({4, 2}, DType::Float32));
  CHECK(e.shape() == Shape{0, 2});
}

TEST_CASE("matmul accepts zero-sized dimensions anywhere: empty or zero results", "[linalg][forward]") {
  using F = Tensor<float>;
  CHECK(matmul(F::zeros({0}), F::zeros({0})).item() == 0.0f);  // an empty dot product is 0
  CHECK(matmul(F::zeros({0, 3}), F::ones({3, 4})).shape() == Shape{0, 4});
  CHECK(matmul(F::ones({2, 3}), F::ones({3, 0})).shape() == Shape{2, 0});
  CHECK(matmul(F::zeros({0, 2, 3}), F::zeros({0, 3, 4})).shape() == Shape{0, 2, 4});
  CHECK(matmul(F::ones({3}), F::ones({3, 2})).to_vector() == std::vector<float>{3, 3});
  CHECK(matmul(F::zeros({2, 0}), F::zeros({0})).to_vector() == std::vector<float>{0, 0});
}

TEST_CASE("matmul float16 and bfloat16 small integers: exact equality with float32", "[linalg][forward][lowp]") {
  for (DType t : {DType::Float16, DType::BFloat16}) {
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        INFO(dtype_name(t) << " trans_a " << ta << " trans_b " << tb);
        const Shape as = operand({2}, 5, 7, ta), bs = operand({}, 7, 6, tb);
        std::vector<double> av = vals(rand1(as, 11, -3, 4)), bv = vals(rand1(bs, 12, -3, 4));
        for (double& v : av) v = std::floor(v);
        for (double& v : bv) v = std::floor(v);
        AnyTensor a32 = dt(av, as).to(DType::Float32), b32 = dt(bv, bs).to(DType::Float32);
        AnyTensor c = op::matmul(a32.to(t), b32.to(t), ta, tb);
        CHECK(c.dtype() == t);
        check_close(vals(c), vals(op::matmul(a32, b32, ta, tb)), 0);
        check_close(vals(c), ref_matmul(av, as, bv, bs, ta, tb), 0);
      }
  }
}

TEST_CASE("matmul float16 and bfloat16 random inputs within 1e-3 / 1e-2 of float32", "[linalg][forward][lowp]") {
  for (DType t : {DType::Float16, DType::BFloat16}) {
    const double rtol = t == DType::Float16 ? 1e-3 : 1e-2;
    for (const MatmulCase& mc : batch_cases()) {
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          INFO(dtype_name(t) << " a batch " << list_str(mc.a_batch, "[", "]") << " b batch " << list_str(mc.b_batch, "[", "]")
                             << " trans_a " << ta << " trans_b " << tb);
          const Shape as = operand(mc.a_batch, 6, 16, ta), bs = operand(mc.b_batch, 16, 5, tb);
          // Positive multiples of 1/64 below 4: exact in both formats, no cancellation in the sums.
          std::vector<double> av = vals(rand1(as, 13, 0.1, 3.9)), bv = vals(rand1(bs, 14, 0.1, 3.9));
          for (double& v : av) v = std::round(v * 64) / 64;
          for (double& v : bv) v = std::round(v * 64) / 64;
          AnyTensor a32 = dt(av, as).to(DType::Float32), b32 = dt(bv, bs).to(DType::Float32);
          AnyTensor c = op::matmul(a32.to(t), b32.to(t), ta, tb);
          CHECK(c.dtype() == t);
          check_close(vals(c), vals(op::matmul(a32, b32, ta, tb)), rtol);
        }
    }
  }
}

namespace {
// C[q] = alpha op(A[q]) op(B[q]) + beta C[q] by loops, for padded leading dimensions and batch strides.
std::vector<double> ref_gemm(const GemmArgs& g, const std::vector<double>& a, const std::vector<double>& b,
                             std::vector<double> c) {
  for (int64_t q = 0; q < g.batch; ++q)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < g.k; ++p) {
          const double av = g.trans_a ? a[static_cast<size_t>(q * g.stride_a + p * g.lda + i)]
                                      : a[static_cast<size_t>(q * g.stride_a + i * g.lda + p)];
          const double bv = g.trans_b ? b[static_cast<size_t>(q * g.stride_b + j * g.ldb + p)]
                                      : b[static_cast<size_t>(q * g.stride_b + p * g.ldb + j)];
          s += av * bv;
        }
        double& cv = c[static_cast<size_t>(q * g.stride_c + i * g.ldc + j)];
        cv = g.alpha * s + g.beta * cv;
      }
  return c;
}
}  // namespace

TEST_CASE("gemm backend float32 float64 float16 bfloat16: alpha, beta, padded leading dims, batch strides",
          "[linalg][backend]") {
  const int64_t m = 3, n = 4, k = 5, pad = 2, batch = 2;
  for (DType t : {DType::Float64, DType::Float32, DType::Float16, DType::BFloat16}) {
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        INFO(dtype_name(t) << " trans_a " << ta << " trans_b " << tb);
        GemmArgs g;
        g.dtype = t;
        g.trans_a = ta;
        g.trans_b = tb;
        g.m = m;
        g.n = n;
        g.k = k;
        g.lda = (ta ? m : k) + pad;
        g.ldb = (tb ? k : n) + pad;
        g.ldc = n + pad;
        g.stride_a = (ta ? k : m) * g.lda + 1;
        g.stride_b = (tb ? n : k) * g.ldb + 3;
        g.stride_c = m * g.ldc + 2;
        g.batch = batch;
        g.alpha = 2.0;
        g.beta = 0.5;
        // Small integers: every product, sum and the alpha/beta scaling are exact in all four formats.
        auto ints = [](int64_t count, uint64_t seed) {
          std::vector<double> v = vals(rand1({count}, seed, -3, 4));
          for (double& x : v) x = std::floor(x);
          return v;
        };
        std::vector<double> av = ints(batch * g.stride_a, 21), bv = ints(batch * g.stride_b, 22);
        std::vector<double> cv = ints(batch * g.stride_c, 23);
        for (double& x : cv) x *= 2;  // beta * c stays an integer
        AnyTensor A = dt(av, {static_cast<int64_t>(av.size())}).to(t), B = dt(bv, {static_cast<int64_t>(bv.size())}).to(t);
        AnyTensor C = dt(cv, {static_cast<int64_t>(cv.size())}).to(t);
        g.a = A.data_ptr();
        g.b = B.data_ptr();
        g.c = C.data_ptr();
        cpu_backend().gemm(g);
        // Elements outside the matrices (padding, gaps between batch entries) keep their values.
        check_close(vals(C), ref_gemm(g, av, bv, cv), 0);
      }
  }
}

TEST_CASE("gemm_plain float32 and float64 (the loop used without BLAS) vs naive reference", "[linalg][backend]") {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      INFO("trans_a " << ta << " trans_b " << tb);
      GemmArgs g;
      g.trans_a = ta;
      g.trans_b = tb;
      g.m = 7;
      g.n = 5;
      g.k = 6;
      g.lda = (ta ? g.m : g.k) + 1;
      g.ldb = (tb ? g.k : g.n) + 2;
      g.ldc = g.n + 3;
      g.alpha = 1.5;
      g.beta = -0.5;
      std::vector<double> av = vals(rand1({(ta ? g.k : g.m) * g.lda}, 31));
      std::vector<double> bv = vals(rand1({(tb ? g.n : g.k) * g.ldb}, 32));
      std::vector<double> cv = vals(rand1({g.m * g.ldc}, 33));
      av[2] = 0;  // a zero in A (the loop skips its products)
      std::vector<double> want = ref_gemm(g, av, bv, cv);
      std::vector<double> c64 = cv;
      cpu::gemm_plain<double>(ta, tb, g.m, g.n, g.k, g.alpha, av.data(), g.lda, bv.data(), g.ldb, g.beta, c64.data(),
                              g.ldc);
      check_close(c64, want, 1e-13, 1e-14);
      std::vector<float> a32(av.begin(), av.end()), b32(bv.begin(), bv.end()), c32(cv.begin(), cv.end());
      cpu::gemm_plain<float>(ta, tb, g.m, g.n, g.k, 1.5f, a32.data(), g.lda, b32.data(), g.ldb, -0.5f, c32.data(),
                             g.ldc);
      check_close(std::vector<double>(c32.begin(), c32.end()), want, 1e-5, 1e-5);
    }
}

TEST_CASE("matmul typed float32 Tensor<float> wrapper and shape errors", "[linalg][errors]") {
  Tensor<float> a = Tensor<float>::from_vector({1, 2, 3, 4}, {2, 2});
  Tensor<float> b = Tensor<float>::from_vector({0, 1, 1, 0}, {2, 2});
  check_close(vals(ember::matmul(a, b)), {2, 1, 4, 3}, 0);
  check_close(vals(ember::matmul(a, b, true, false)), {3, 1, 4, 2}, 0);
  CHECK_THROWS_AS(op::matmul(AnyTensor::zeros({2, 3}, DType::Float32), AnyTensor::zeros({2, 3}, DType::Float32)),
                  ShapeError);
  CHECK_NOTHROW(op::matmul(AnyTensor::zeros({2, 3}, DType::Float32), AnyTensor::zeros({2, 3}, DType::Float32), false,
                           true));
  CHECK_THROWS_AS(op::matmul(AnyTensor::zeros({2, 2, 3}, DType::Float32), AnyTensor::zeros({3, 3, 2}, DType::Float32)),
                  ShapeError);
  CHECK_THROWS_AS(op::matmul(AnyTensor::zeros({}, DType::Float32), AnyTensor::zeros({3}, DType::Float32)), ShapeError);
  CHECK_THROWS_AS(op::matmul(AnyTensor::zeros({2, 2}, DType::Float32), AnyTensor::zeros({2, 2}, DType::Float64)),
                  DTypeError);
  CHECK_THROWS_AS(op::matmul(AnyTensor::zeros({2, 2}, DType::Int32), AnyTensor::zeros({2, 2}, DType::Int32)), DTypeError);
}

TEST_CASE("linear forward: matmul plus bias (float64 to 1e-14, float32 to 1e-6), no bias bitwise matmul",
          "[linalg][forward][linear]") {
  for (DType t : {DType::Float64, DType::Float32}) {
    INFO("dtype " << dtype_name(t));
    for (const Shape& xs : {Shape{37, 70}, Shape{3, 5, 70}, Shape{70}, Shape{1, 70}}) {
      AnyTensor x = rand1(xs, 5).to(t), w = rand1({33, 70}, 6).to(t), b = rand1({33}, 7, -3, 3).to(t);
      AnyTensor y = op::linear(x, w, b), ref = op::add(op::matmul(x, w, false, true), b);
      REQUIRE(y.shape() == ref.shape());
      REQUIRE(y.dtype() == t);
      const auto yv = y.to_double_vector(), rv = ref.to_double_vector();
      double worst = 0;
      for (size_t i = 0; i < yv.size(); ++i) worst = std::max(worst, std::abs(yv[i] - rv[i]) / (1.0 + std::abs(rv[i])));
      CHECK(worst < (t == DType::Float64 ? 1e-14 : 1e-6));
      const auto nb = op::linear(x, w).to_double_vector(), mm = op::matmul(x, w, false, true).to_double_vector();
      CHECK(nb == mm);
    }
  }
  SECTION("known values") {
    AnyTensor x = Tensor<double>::from_vector({1, 2, 3, 4}, {2, 2});
    AnyTensor w = Tensor<double>::from_vector({1, 0, 0, 1, 1, 1}, {3, 2});
    AnyTensor b = Tensor<double>::from_vector({10, 20, 30}, {3});
    check_close(vals(op::linear(x, w, b)), {11, 22, 33, 13, 24, 37}, 0);
  }
  SECTION("empty: no rows, no outputs, and no inputs (the bias alone, or zeros)") {
    AnyTensor w = rand1({3, 4}, 1), b = rand1({3}, 2);
    CHECK(op::linear(AnyTensor::zeros({0, 4}, DType::Float64), w, b).shape() == Shape{0, 3});
    CHECK(op::linear(AnyTensor::zeros({2, 0, 4}, DType::Float64), w, b).shape() == Shape{2, 0, 3});
    CHECK(op::linear(rand1({2, 4}, 3), AnyTensor::zeros({0, 4}, DType::Float64), AnyTensor::zeros({0}, DType::Float64))
              .shape() == Shape{2, 0});
    AnyTensor w0 = AnyTensor::zeros({3, 0}, DType::Float64);
    const auto bv = b.to_double_vector();
    check_close(vals(op::linear(AnyTensor::zeros({2, 0}, DType::Float64), w0, b)),
                {bv[0], bv[1], bv[2], bv[0], bv[1], bv[2]}, 0);
    check_close(vals(op::linear(AnyTensor::zeros({2, 0}, DType::Float64), w0)), {0, 0, 0, 0, 0, 0}, 0);
  }
  SECTION("the bias is not written, and a bias needing no gradient gets none") {
    AnyTensor x = rand1({4, 5}, 1).set_requires_grad(), w = rand1({3, 5}, 2), b = rand1({3}, 3);
    const auto before = b.to_double_vector();
    AnyTensor y = op::linear(x, w, b);
    op::sum(y).backward();
    CHECK(b.to_double_vector() == before);
    CHECK(!b.grad().defined());
    CHECK(!w.grad().defined());
    REQUIRE(x.grad().defined());
    // d sum(x W^T + b) / dx = column sums of W, on every row
    const auto g = x.grad().to_double_vector(), wv = w.to_double_vector();
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t c = 0; c < 5; ++c)
        CHECK(std::abs(g[static_cast<size_t>(r * 5 + c)] - (wv[static_cast<size_t>(c)] + wv[static_cast<size_t>(5 + c)] +
                                                            wv[static_cast<size_t>(10 + c)])) < 1e-14);
  }
  SECTION("float16 and bfloat16 against float32") {
    AnyTensor x = rand1({9, 24}, 1), w = rand1({7, 24}, 2), b = rand1({7}, 3);
    const auto ref = op::linear(x.to(DType::Float32), w.to(DType::Float32), b.to(DType::Float32)).to_double_vector();
    for (DType t : {DType::Float16, DType::BFloat16}) {
      const auto y = op::linear(x.to(t), w.to(t), b.to(t)).to_double_vector();
      double worst = 0;
      for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::abs(y[i] - ref[i]));
      CHECK(worst < (t == DType::Float16 ? 2e-2 : 1.5e-1));
    }
  }
}

namespace {
// The fp32 GEMM through whichever library sgemm_uses_onednn picks, on raw buffers: C prefilled
// with NaN where beta = 0 (a library that read C would give NaN), gaps in every leading dimension.
struct RawGemm {
  bool ta, tb;
  int64_t m, n, k;
  float alpha, beta;
};

std::vector<float> run_raw_gemm(const RawGemm& r, const std::vector<float>& a, const std::vector<float>& b,
                                std::vector<float> c) {
  GemmArgs g;
  g.dtype = DType::Float32;
  g.trans_a = r.ta;
  g.trans_b = r.tb;
  g.m = r.m;
  g.n = r.n;
  g.k = r.k;
  g.lda = (r.ta ? r.m : r.k) + 3;
  g.ldb = (r.tb ? r.k : r.n) + 1;
  g.ldc = r.n + 2;
  g.alpha = r.alpha;
  g.beta = r.beta;
  g.a = a.data();
  g.b = b.data();
  g.c = c.data();
  cpu_backend().gemm(g);
  return c;
}
}  // namespace

TEST_CASE("fp32 GEMM through the chosen library (oneDNN or the BLAS): values, beta = 0 over NaN, strides, "
          "1 to 3 threads, inside a parallel region, the same bits on every run",
          "[linalg][backend][threads]") {
  INFO("fp32 GEMM: " << cpu::sgemm_libraries());
#if defined(EMBER_HAVE_ONEDNN) && defined(EMBER_ONEDNN_GEMM)
  CHECK(std::string(cpu::sgemm_libraries()).find("oneDNN") != std::string::npos);
  CHECK(cpu::sgemm_uses_onednn(false, 2));
  CHECK(cpu::sgemm_uses_onednn(true, 1));
#else
  CHECK(!cpu::sgemm_uses_onednn(false, 1));
#endif
  const int saved = get_num_threads();
  // Shapes where oneDNN takes different paths: GEMV-like (m or n = 1), small M with a long K (its
  // K split across threads), the transformer's, odd sizes.
  const RawGemm cases[] = {
      {false, true, 96, 160, 64, 1.0f, 0.0f},  {true, false, 80, 64, 300, 1.0f, 0.0f},
      {false, false, 1, 200, 3000, 1.0f, 0.0f}, {true, true, 150, 1, 700, 0.5f, 0.0f},
      {false, true, 16, 300, 1024, 1.0f, 1.0f}, {true, false, 7, 5, 3, -2.0f, 0.25f},
      {false, false, 33, 65, 129, 1.0f, 1.0f},  {true, true, 64, 48, 2000, 1.5f, 0.0f},
  };
  for (const RawGemm& r : cases) {
    INFO("trans_a " << r.ta << " trans_b " << r.tb << " m " << r.m << " n " << r.n << " k " << r.k << " beta "
                    << r.beta);
    const int64_t lda = (r.ta ? r.m : r.k) + 3, ldb = (r.tb ? r.k : r.n) + 1, ldc = r.n + 2;
    std::vector<double> av = vals(rand1({(r.ta ? r.k : r.m) * lda}, 41));
    std::vector<double> bv = vals(rand1({(r.tb ? r.n : r.k) * ldb}, 42));
    std::vector<double> cv = vals(rand1({r.m * ldc}, 43));
    std::vector<float> a(av.begin(), av.end()), b(bv.begin(), bv.end()), c0(cv.begin(), cv.end());
    av.assign(a.begin(), a.end());  // the reference sees the fp32-rounded inputs
    bv.assign(b.begin(), b.end());
    cv.assign(c0.begin(), c0.end());
    if (r.beta == 0.0f)
      for (float& x : c0) x = std::numeric_limits<float>::quiet_NaN();
    GemmArgs g;
    g.trans_a = r.ta;
    g.trans_b = r.tb;
    g.m = r.m;
    g.n = r.n;
    g.k = r.k;
    g.lda = lda;
    g.ldb = ldb;
    g.ldc = ldc;
    g.alpha = r.alpha;
    g.beta = r.beta;
    std::vector<double> want = ref_gemm(g, av, bv, cv);
    // Where beta = 0 the gaps between rows keep the NaN prefill; the matrix must be finite.
    for (int threads : {1, 2, 3}) {
      INFO("threads " << threads);
      set_num_threads(threads);
      const std::vector<float> got = run_raw_gemm(r, a, b, c0);
      for (int64_t i = 0; i < r.m; ++i)
        for (int64_t j = 0; j < r.n; ++j) {
          const size_t at = static_cast<size_t>(i * ldc + j);
          double scale = std::abs(r.beta * cv[at]);
          for (int64_t p = 0; p < r.k; ++p) {
            const double x = r.ta ? av[static_cast<size_t>(p * lda + i)] : av[static_cast<size_t>(i * lda + p)];
            const double y = r.tb ? bv[static_cast<size_t>(j * ldb + p)] : bv[static_cast<size_t>(p * ldb + j)];
            scale += std::abs(r.alpha * x * y);
          }
          if (!(std::abs(got[at] - want[at]) <= 1e-6 * (1 + scale))) {
            FAIL_CHECK("C[" << i << ", " << j << "] = " << got[at] << ", want " << want[at]);
            break;
          }
        }
      for (int64_t i = 0; i < r.m; ++i)  // the gaps past each row's n columns are untouched
        for (int64_t j = r.n; j < ldc && i * ldc + j < static_cast<int64_t>(got.size()); ++j) {
          const size_t at = static_cast<size_t>(i * ldc + j);
          CHECK((std::isnan(got[at]) ? std::isnan(c0[at]) : got[at] == c0[at]));
        }
      // The same bits on a second run at this thread count.
      const std::vector<float> again = run_raw_gemm(r, a, b, c0);
      CHECK(std::memcmp(again.data(), got.data(), got.size() * sizeof(float)) == 0);
    }
    // Inside a parallel region (a kernel's chunk) the library runs on the calling thread: the
    // 1-thread bits.
    set_num_threads(1);
    const std::vector<float> one = run_raw_gemm(r, a, b, c0);
    set_num_threads(2);
    std::vector<std::vector<float>> nested(2);
    cpu::parallel_for(0, 2, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t q = lo; q < hi; ++q) nested[static_cast<size_t>(q)] = run_raw_gemm(r, a, b, c0);
    });
    for (const auto& v : nested) CHECK(std::memcmp(v.data(), one.data(), one.size() * sizeof(float)) == 0);
  }
  set_num_threads(saved);
}

// ------------------------------------------------------------------------------------------------
// linear_act: Linear with its activation, one kernel (a cuBLASLt epilogue on CUDA).

namespace {

// The composite that linear_act fuses: linear, then the activation op.
AnyTensor composite_linear_act(const AnyTensor& x, const AnyTensor& w, const AnyTensor& b, LinearActivation act) {
  const AnyTensor z = op::linear(x, w, b);
  switch (act) {
    case LinearActivation::None: return z;
    case LinearActivation::Relu: return op::relu(z);
    case LinearActivation::Gelu: return op::gelu(z, false);
    case LinearActivation::GeluTanh: return op::gelu(z, true);
  }
  return z;
}

constexpr LinearActivation kActivations[] = {LinearActivation::None, LinearActivation::Relu, LinearActivation::Gelu,
                                             LinearActivation::GeluTanh};

}  // namespace

TEST_CASE("linear_act: the composite's bits on the CPU, forward and gradients, every activation and dtype",
          "[fused][linear]") {
  ThreadsGuard threads;
  for (int nt : {1, 2}) {
    set_num_threads(nt);
    for (DType t : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
      for (const Shape& xs : {Shape{5, 7}, Shape{2, 3, 16}, Shape{16}, Shape{64, 96}}) {
        const int64_t in = xs[xs.dim() - 1], out = in == 7 ? 9 : 40;
        for (bool with_bias : {true, false}) {
          for (LinearActivation act : kActivations) {
            INFO(dtype_name(t) << " x " << xs.str() << " out " << out << " bias " << with_bias << " act "
                               << static_cast<int>(act) << " threads " << nt);
            Generator gen(static_cast<uint64_t>(in * 7 + out));
            AnyTensor x = Tensor<float>::randn(xs, Device::cpu(), 0.0, 1.0, gen).to(t);
            AnyTensor w = Tensor<float>::randn({out, in}, Device::cpu(), 0.0, 0.5, gen).to(t);
            AnyTensor b = with_bias ? Tensor<float>::randn({out}, Device::cpu(), 0.0, 0.5, gen).to(t) : AnyTensor();
            if (t == DType::Float32 && xs.numel() > 7) {  // NaN and a zero pre-activation pass the same way
              AnyTensor xn = x.to(DType::Float64);
              std::vector<double> v = xn.to_double_vector();
              v[3] = std::nan("");
              x = Tensor<double>::from_vector(v, xs).to(t);
            }
            auto run = [&](bool fused) {
              AnyTensor xr = x.detach().clone(), wr = w.detach().clone(),
                        br = b.defined() ? b.detach().clone() : AnyTensor();
              xr.set_requires_grad(true);
              wr.set_requires_grad(true);
              if (br.defined()) br.set_requires_grad(true);
              AnyTensor y = fused ? op::linear_act(xr, wr, br, act) : composite_linear_act(xr, wr, br, act);
              AnyTensor gy = Tensor<float>::randn(y.shape(), Device::cpu(), 0.0, 1.0, gen).to(t);
              y.backward(gy);
              std::vector<std::vector<uint8_t>> r{bits_of(y), bits_of(xr.grad()), bits_of(wr.grad())};
              if (br.defined()) r.push_back(bits_of(br.grad()));
              return r;
            };
            const auto state = gen.state();
            auto composite = run(false);
            gen.set_state(state);  // the same upstream gradient for both
            auto fused = run(true);
            REQUIRE(fused.size() == composite.size());
            for (size_t k = 0; k < fused.size(); ++k) REQUIRE(fused[k] == composite[k]);
          }
        }
      }
    }
  }
}

TEST_CASE("nn::Linear with an activation: Linear then ReLU/GELU, torch.nn.Linear's parameters, the printed layer",
          "[fused][linear]") {
  Generator gen(77);
  auto x = Tensor<float>::randn({6, 12}, Device::cpu(), 0.0, 1.0, gen);
  nn::Linear plain(12, 8);
  nn::Linear fused(12, 8, {.activation = LinearActivation::Relu});
  fused.load_state_dict(plain.state_dict());
  REQUIRE(fused.state_dict().size() == 2);
  REQUIRE(fused.activation() == LinearActivation::Relu);
  REQUIRE(bits_of(fused(x)) == bits_of(relu(plain(x))));
  REQUIRE(fused.extra_repr().find("activation=relu") != std::string::npos);
  REQUIRE(plain.extra_repr().find("activation") == std::string::npos);
  // forward_with: the layer's own activation is replaced, not composed
  REQUIRE(bits_of(fused.forward_with(x, LinearActivation::GeluTanh)) == bits_of(gelu(plain(x), true)));
  // the transformer's MLP runs c_fc with its GELU fused: the composite's bits on the CPU
  nn::TransformerMLP mlp(12, 48);
  auto xm = Tensor<float>::randn({2, 5, 12}, Device::cpu(), 0.0, 1.0, gen);
  auto ref = (*mlp.c_proj)(gelu((*mlp.c_fc)(xm), true));
  REQUIRE(bits_of(mlp(xm)) == bits_of(ref));
}

TEST_CASE("linear_act on a device (pretend cuda:0 in CI) equals the CPU", "[fused][linear]") {
  testing::PretendGpu pretend;
  if (!testing::cuda_device_or_skip()) return;
  Generator gen(5);
  auto x = Tensor<float>::randn({9, 16}, Device::cpu(), 0.0, 1.0, gen);
  auto w = Tensor<float>::randn({24, 16}, Device::cpu(), 0.0, 0.5, gen);
  auto b = Tensor<float>::randn({24}, Device::cpu(), 0.0, 0.5, gen);
  for (LinearActivation act : {LinearActivation::Relu, LinearActivation::GeluTanh}) {
    auto yc = op::linear_act(x, w, b, act).to_double_vector();
    auto xd = Tensor<float>(x.to(Device::cuda(0))).set_requires_grad();
    auto wd = Tensor<float>(w.to(Device::cuda(0))).set_requires_grad();
    auto yd = op::linear_act(xd, wd, b.to(Device::cuda(0)), act);
    REQUIRE(yd.device() == Device::cuda(0));
    REQUIRE(max_rel_diff(yd.to(Device::cpu()).to_double_vector(), yc) < 2e-3);
    op::sum(yd).backward();
    REQUIRE(xd.grad().device() == Device::cuda(0));
    REQUIRE(wd.grad().device() == Device::cuda(0));
  }
}

TEST_CASE("parity: linear_act (cuBLASLt epilogue), CPU versus CUDA", "[fused][cuda][parity]") {
  EMBER_REQUIRE_GPU();
  // {rows, in, out}: out % 8 == 0 takes GELU's epilogue; 13 does not (the composite on the device)
  // (The CPU side's fp16/bf16/fp64 GEMMs dominate this test's time: a 1024 x 256 x 1024 case made
  // it take 104 s on the H200 machine.)
  const std::array<int64_t, 3> shapes[] = {{64, 256, 1024}, {200, 96, 256}, {7, 33, 13}, {130, 64, 40}, {1, 8, 8}};
  for (DType t : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    for (const auto& [rows, in, out] : shapes) {
      for (bool with_bias : {true, false}) {
        for (LinearActivation act : kActivations) {
          Generator gen(static_cast<uint64_t>(rows * 31 + in + out));
          AnyTensor x = Tensor<float>::randn({rows, in}, Device::cpu(), 0.0, 1.0, gen).to(t);
          AnyTensor w = Tensor<float>::randn({out, in}, Device::cpu(), 0.0, 1.0 / std::sqrt(double(in)), gen).to(t);
          AnyTensor b = with_bias ? Tensor<float>::randn({out}, Device::cpu(), 0.0, 0.5, gen).to(t) : AnyTensor();
          AnyTensor gy = Tensor<float>::randn({rows, out}, Device::cpu(), 0.0, 1.0, gen).to(t);
          auto run = [&](Device d) {
            return output_and_grads_on(d, x, w, b, gy, [&](const AnyTensor& xd, const AnyTensor& wd, const AnyTensor& bd) {
              return op::linear_act(xd, wd, bd, act);
            });
          };
          auto c = run(Device::cpu()), g = run(Device::cuda(0));
          // fp32: GEMMs in another order, and cuBLASLt's own GELU; fp16/bf16: one rounding step
          // of the output forgiven (the epilogue rounds the unrounded sum's activation once)
          const double tol = t == DType::Float64 ? 1e-10 : t == DType::Float32 ? 1e-4 : t == DType::Float16 ? 4e-3 : 3e-2;
          const int mantissa = t == DType::Float16 ? 10 : t == DType::BFloat16 ? 7 : 0;
          for (size_t k = 0; k < c.size(); ++k) {
            const double scale = k >= 2 ? std::sqrt(static_cast<double>(rows)) : 1.0;  // sums over rows
            const double d = mantissa > 0 ? max_rel_diff_beyond_ulp(g[k], c[k], mantissa) : max_rel_diff(g[k], c[k]);
            INFO(dtype_name(t) << " " << rows << "x" << in << "->" << out << " bias " << with_bias << " act "
                               << static_cast<int>(act) << " output " << k << " diff " << d);
            REQUIRE(d < tol * scale);
          }
        }
      }
    }
  }
#if defined(EMBER_TEST_HAVE_CUDA)
  // The fused path is taken where the header says it is, not the composite.
  Backend& dev = backend_for(Device::cuda(0));
  auto alloc = [&](size_t n) { return dev.allocate(n); };
  auto release = [&](void* p, size_t n) { dev.deallocate(p, n); };
  for (DType t : {DType::Float32, DType::Float16, DType::BFloat16}) {
    AnyTensor x = AnyTensor::zeros({32, 64}, t, Device::cuda(0)), w = AnyTensor::zeros({128, 64}, t, Device::cuda(0));
    AnyTensor b = AnyTensor::zeros({128}, t, Device::cuda(0));
    AnyTensor z = AnyTensor::empty({32, 128}, t, Device::cuda(0)), y = AnyTensor::empty({32, 128}, t, Device::cuda(0));
    LinearActArgs a{.dtype = t, .rows = 32, .in = 64, .out = 128, .act = LinearActivation::GeluTanh};
    INFO(dtype_name(t));
    REQUIRE(cuda::linear_act_lt(0, cuda::current_stream(0), a, x.data_ptr(), w.data_ptr(), b.data_ptr(), z.data_ptr(),
                                y.data_ptr(), alloc, release));
    a.act = LinearActivation::Relu;
    REQUIRE(cuda::linear_act_lt(0, cuda::current_stream(0), a, x.data_ptr(), w.data_ptr(), nullptr, nullptr,
                                y.data_ptr(), alloc, release));
    a.act = LinearActivation::Gelu;  // the exact GELU has no epilogue
    REQUIRE_FALSE(cuda::linear_act_lt(0, cuda::current_stream(0), a, x.data_ptr(), w.data_ptr(), b.data_ptr(),
                                      z.data_ptr(), y.data_ptr(), alloc, release));
  }
#endif
}
