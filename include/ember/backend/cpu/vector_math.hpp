#pragma once
// Vectorised float math for the CPU kernels: the exponential (fast_expf, and the softmax /
// attention row loops over it), the row maximum, tanh and the tanh-approximated GELU with its
// derivative. The loops use GCC's vector extensions instead of relying on the auto-vectoriser:
// under GCC's default -ftrapping-math a loop with float compares or float-to-int conversions
// keeps its branches and stays scalar (perf annotate of softmax and attention showed scalar
// mulss/addss only; the same loop vectorises with -fno-trapping-math). At x86-64's baseline
// (SSE2, how Debian and ember's CMake compile) the lanes are 4 wide, with an AVX2 copy chosen at
// run time (__builtin_cpu_supports); 8 wide when the build targets AVX. No copy uses FMA, so
// every copy computes the same bits.
#include <cstdint>
#include <cstring>
#include <limits>

namespace ember::cpu {
namespace detail {

// exp(r) for fast_expf's reduced argument r (|r| <= ln 2 / 2) by the classic Cephes expf
// polynomial, on a float or on GCC vector lanes of floats. p holds the first coefficient,
// 1.9875691500e-4f, as an R on the way in (a vector is not made from a float by conversion), and
// exp(r) on the way out (vectors are not returned by value: their ABI depends on the target).
template <class R>
[[gnu::always_inline]] inline void exp_reduced(const R& r, R& p) {
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
}

// exp for float, branch-free so that the compiler vectorises loops over it: exp(x) = 2^k exp(r),
// k = round(x / ln 2), r = x - k ln 2 (two-part ln 2), exp(r) by a degree-6 polynomial
// (exp_reduced); within 2 ulp of std::exp over the whole range, exactly 0 below
// -87.34 and inf above 88.72, NaN for NaN.
inline float fast_expf(float x) {
  const float xc = x < -87.336544f ? -87.336544f : (x > 88.7228f ? 88.7228f : x);
  const float t = xc * 1.44269504088896341f;
  const int ki = static_cast<int>(t + (t >= 0.0f ? 0.5f : -0.5f));
  const float k = static_cast<float>(ki);
  const float r = (xc - k * 0.693359375f) - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  exp_reduced(r, p);
  // 2^k by building the exponent; k in [-126, 128): split in two factors so that 2^128 (x near
  // 88.72) does not overflow the exponent field.
  const int k1 = ki / 2, k2 = ki - k1;
  uint32_t b1 = static_cast<uint32_t>(k1 + 127) << 23, b2 = static_cast<uint32_t>(k2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, sizeof s1);
  std::memcpy(&s2, &b2, sizeof s2);
  float y = p * s1 * s2;
  y = x < -87.336544f ? 0.0f : y;
  y = x > 88.7228f ? std::numeric_limits<float>::infinity() : y;
  return x != x ? x : y;
}

// y[c] = fast_expf(x[c] - sub) for c in [0, n) (y may be x); returns the sum of the y[c].
// Written with GCC's vector extensions, kW lanes at a time: the scalar fast_expf loop above is
// not vectorised by GCC under its default -ftrapping-math (the compares and the float-to-int
// conversion count as possibly trapping, so the loop keeps its branches: perf annotate showed
// scalar mulss/addss only). The lanes compute exactly the scalar formula (tested bitwise); the
// sum adds the lane sums at the end, so its last bits differ from a sequential sum (it still
// depends on n only, never on the thread count). A compiler without the extensions gets the
// scalar loop.
#if defined(__GNUC__)
// The vector types of kW float / int32 lanes (vector_size cannot depend on a template parameter).
template <int kW>
struct Lanes;
template <>
struct Lanes<4> {
  using V = float __attribute__((vector_size(16)));
  using VI = int32_t __attribute__((vector_size(16)));
};
template <>
struct Lanes<8> {
  using V = float __attribute__((vector_size(32)));
  using VI = int32_t __attribute__((vector_size(32)));
};
#if !defined(__clang__) && !defined(__CUDACC__)
// 16 lanes (the AVX-512 copies below, GCC only). Not under nvcc: its C++ front end (cudafe++,
// CUDA 13.0) crashes on 64-byte vector types. A .cu file therefore compiles these functions
// without the AVX-512 copies; where it emits one (a header-only CPU backend used from a .cu
// file), the linker may keep either definition, and both compute the same bits.
#define EMBER_HAVE_LANES16 1
template <>
struct Lanes<16> {
  using V = float __attribute__((vector_size(64)));
  using VI = int32_t __attribute__((vector_size(64)));
};
#endif
#endif

#if defined(__GNUC__)
// fast_expf on kW lanes: exactly the scalar formula (tested bitwise).
template <int kW>
[[gnu::always_inline]] inline void exp_vec(const typename Lanes<kW>::V& xv, typename Lanes<kW>::V& out) {
  using V = typename Lanes<kW>::V;
  using VI = typename Lanes<kW>::VI;
  const V lo = V{} - 87.336544f, hi = V{} + 88.7228f, zero = V{};
  V xc = xv < lo ? lo : xv;
  xc = xc > hi ? hi : xc;
  const V t = xc * 1.44269504088896341f;
  const VI ki = __builtin_convertvector(t + (t >= zero ? zero + 0.5f : zero - 0.5f), VI);
  const V k = __builtin_convertvector(ki, V);
  const V r = (xc - k * 0.693359375f) - k * -2.12194440e-4f;
  V p = zero + 1.9875691500e-4f;
  exp_reduced(r, p);
  const VI k1 = ki / 2, k2 = ki - k1;
  const VI b1 = (k1 + 127) << 23, b2 = (k2 + 127) << 23;
  V s1, s2;
  std::memcpy(&s1, &b1, sizeof s1);
  std::memcpy(&s2, &b2, sizeof s2);
  V e = p * s1 * s2;
  e = xv < lo ? zero : e;
  e = xv > hi ? zero + std::numeric_limits<float>::infinity() : e;
  out = xv != xv ? xv : e;
}

// tanh on kW lanes (Cephes' tanhf scheme; the polynomial's coefficients are Cephes'):
// |x| < 0.625: x + x^3 P(x^2); else sign(x) (1 - 2 / (exp(2 |x|) + 1)). Within 3e-7 relative of
// tanh over the float range (tested), exactly +-1 from |x| = 9.1, NaN for NaN.
template <int kW>
[[gnu::always_inline]] inline void tanh_vec(const typename Lanes<kW>::V& x, typename Lanes<kW>::V& out) {
  using V = typename Lanes<kW>::V;
  using VI = typename Lanes<kW>::VI;
  VI bits;
  std::memcpy(&bits, &x, sizeof bits);
  const VI sign = bits & static_cast<int32_t>(0x80000000u);
  const VI abits = bits & 0x7fffffff;
  V ax;
  std::memcpy(&ax, &abits, sizeof ax);
  const V z = x * x;
  V p = V{} - 5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const V small_abs = p * z * ax + ax;  // odd: the magnitude, then x's sign (so tanh(-0) = -0)
  V e;
  exp_vec<kW>(ax + ax, e);
  const V big_abs = 1.0f - 2.0f / (e + 1.0f);
  const V mag = ax < 0.625f ? small_abs : big_abs;  // NaN: ax < 0.625 is false, exp(NaN) = NaN
  VI mag_bits;
  std::memcpy(&mag_bits, &mag, sizeof mag_bits);
  mag_bits |= sign;
  std::memcpy(&out, &mag_bits, sizeof out);
}

// Loads n < kW floats into zeroed lanes (the tails of the loops below), so a tail element is
// computed by the same lane code as the others.
template <int kW>
[[gnu::always_inline]] inline void load_partial(const float* x, int64_t n, typename Lanes<kW>::V& v) {
  v = typename Lanes<kW>::V{};
  std::memcpy(&v, x, static_cast<size_t>(n) * sizeof(float));
}
#endif

// y[c] = fast_expf(x[c] - sub) for c in [0, n) (y may be x); returns the sum of the y[c] (the
// lane sums added at the end: the last bits differ from a sequential sum; it depends on n only).
template <int kW>
[[gnu::always_inline]] inline float exp_sub_sum_lanes(const float* x, float* y, int64_t n, float sub) {
  int64_t c = 0;
  float total = 0.0f;
#if defined(__GNUC__)
  using V = typename Lanes<kW>::V;
  V acc = V{};
  for (; c + kW <= n; c += kW) {
    V xv;
    std::memcpy(&xv, x + c, sizeof xv);
    V e;
    exp_vec<kW>(xv - sub, e);
    std::memcpy(y + c, &e, sizeof e);
    acc += e;
  }
  for (int l = 0; l < kW; ++l) total += acc[l];
#endif
  for (; c < n; ++c) {
    const float e = fast_expf(x[c] - sub);
    y[c] = e;
    total += e;
  }
  return total;
}

// The largest of x[0..n) ignoring NaN (as `v > m ? v : m` does), -inf for none; vector
// extensions for the same reason.
template <int kW>
[[gnu::always_inline]] inline float row_max_lanes(const float* x, int64_t n) {
  int64_t c = 0;
  float m = -std::numeric_limits<float>::infinity();
#if defined(__GNUC__)
  using V = typename Lanes<kW>::V;
  V mv = V{} - std::numeric_limits<float>::infinity();
  for (; c + kW <= n; c += kW) {
    V xv;
    std::memcpy(&xv, x + c, sizeof xv);
    mv = xv > mv ? xv : mv;
  }
  for (int l = 0; l < kW; ++l) m = mv[l] > m ? mv[l] : m;
#endif
  for (; c < n; ++c) m = x[c] > m ? x[c] : m;
  return m;
}

// The elementwise functions of the maps below. Vectors go by reference: a function taking or
// returning a 32-byte vector by value in code built without AVX draws GCC's -Wpsabi note.
enum class LaneOp { Tanh, GeluTanh, GeluTanhGrad, Relu, ReluGrad };
inline constexpr float kGeluSqrt2OverPi = 0.7978845608028654f, kGeluCoef = 0.044715f;
#if defined(__GNUC__)
template <int kW, LaneOp kOp>
[[gnu::always_inline]] inline void lane_op(const typename Lanes<kW>::V& v, typename Lanes<kW>::V& out) {
  using V = typename Lanes<kW>::V;
  if constexpr (kOp == LaneOp::Relu) {
    out = v <= 0.0f ? V{} : v;  // NaN passes, -0 becomes +0: math::unary's Relu
  } else if constexpr (kOp == LaneOp::ReluGrad) {
    out = v <= 0.0f ? V{} : V{} + 1.0f;  // times gy in map_lanes: math::unary_derivative's Relu
  } else if constexpr (kOp == LaneOp::Tanh) {
    tanh_vec<kW>(v, out);
  } else {
    // GELU with the tanh approximation: math::unary's GeluTanh formula (and its derivative),
    // with tanh_vec for tanh.
    const V inner = kGeluSqrt2OverPi * (v + kGeluCoef * v * v * v);
    V t;
    tanh_vec<kW>(inner, t);
    if constexpr (kOp == LaneOp::GeluTanh) {
      out = 0.5f * v * (1.0f + t);
    } else {
      const V dinner = kGeluSqrt2OverPi * (1.0f + (3.0f * kGeluCoef) * v * v);
      out = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dinner;
    }
  }
}
#endif

// y[c] = op(x[c]) (y may be x), or with gy: gx[c] = gy[c] * op(x[c]); the tail (n % kW elements)
// goes through zero-padded lanes, so every element is computed by the same lane code.
template <int kW, LaneOp kOp>
[[gnu::always_inline]] inline void map_lanes(const float* x, const float* gy, float* y, int64_t n) {
#if defined(__GNUC__)
  using V = typename Lanes<kW>::V;
  int64_t c = 0;
  for (; c + kW <= n; c += kW) {
    V xv;
    std::memcpy(&xv, x + c, sizeof xv);
    V r;
    lane_op<kW, kOp>(xv, r);
    if (gy) {
      V gv;
      std::memcpy(&gv, gy + c, sizeof gv);
      r = gv * r;
    }
    std::memcpy(y + c, &r, sizeof r);
  }
  if (c < n) {
    V xv, r;
    load_partial<kW>(x + c, n - c, xv);
    lane_op<kW, kOp>(xv, r);
    if (gy) {
      V gv;
      load_partial<kW>(gy + c, n - c, gv);
      r = gv * r;
    }
    std::memcpy(y + c, &r, static_cast<size_t>(n - c) * sizeof(float));
  }
#endif
}

// Width by the build's target: 8 lanes with AVX; at the x86-64 baseline (SSE2, how Debian and
// ember's CMake compile) 4 lanes, plus copies chosen at run time (__builtin_cpu_supports): 16
// lanes where the processor has AVX-512F (GCC only), else 8 where it has AVX2 (8 SSE2 lanes were
// lowered piecewise: 2.7x slower than 4). No copy uses FMA, so every copy computes the same bits
// (tested at every width the processor runs): AVX2 alone does not enable FMA, but AVX-512F has
// fused multiply-adds on its 512-bit registers and GCC's gnu++20 default (-ffp-contract=fast)
// would fuse `p * r + c` across statements, so the AVX-512 copies turn contraction off. Clang
// contracts within one expression whatever the function's options, so it keeps the AVX2 copy
// (and so does nvcc: see Lanes<16>).
// Measured (fast_expf over 1024 floats, this machine): scalar 12 ns, 4 lanes 3.8-4 ns, 8 lanes
// with -march=native 1.3 ns per element; 16 lanes against 8 on an AVX-512 Xeon: GELU forward and
// backward and exp 1.5-2x faster (benchmarks/bench_fused: BM_gelu_tanh*, BM_softmax*).
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__AVX__)
#define EMBER_EXP_AVX2_DISPATCH 1
[[gnu::target("avx2")]] inline float exp_sub_sum_avx2(const float* x, float* y, int64_t n, float sub) {
  return exp_sub_sum_lanes<8>(x, y, n, sub);
}
[[gnu::target("avx2")]] inline float row_max_avx2(const float* x, int64_t n) { return row_max_lanes<8>(x, n); }
template <LaneOp kOp>
[[gnu::target("avx2")]] inline void map_avx2(const float* x, const float* gy, float* y, int64_t n) {
  map_lanes<8, kOp>(x, gy, y, n);
}
inline bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#if defined(EMBER_HAVE_LANES16)
#define EMBER_EXP_AVX512_DISPATCH 1
[[gnu::target("avx512f"), gnu::optimize("fp-contract=off")]] inline float exp_sub_sum_avx512(const float* x, float* y,
                                                                                              int64_t n, float sub) {
  return exp_sub_sum_lanes<16>(x, y, n, sub);
}
[[gnu::target("avx512f"), gnu::optimize("fp-contract=off")]] inline float row_max_avx512(const float* x, int64_t n) {
  return row_max_lanes<16>(x, n);
}
template <LaneOp kOp>
[[gnu::target("avx512f"), gnu::optimize("fp-contract=off")]] inline void map_avx512(const float* x, const float* gy,
                                                                                     float* y, int64_t n) {
  map_lanes<16, kOp>(x, gy, y, n);
}
inline bool cpu_has_avx512f() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}
#endif
#endif

// The widest lanes this processor and build run, which exp_sub_sum, row_max and map_f32 use:
// 16 (the AVX-512F copy), 8 (the AVX2 copy, or a build targeting AVX), 4 (SSE2); 1 without the
// vector extensions.
inline int lanes() {
#if defined(EMBER_EXP_AVX512_DISPATCH)
  if (cpu_has_avx512f()) return 16;
#endif
#if defined(EMBER_EXP_AVX2_DISPATCH)
  if (cpu_has_avx2()) return 8;
  return 4;
#elif defined(__AVX__)
  return 8;
#elif defined(__GNUC__)
  return 4;
#else
  return 1;
#endif
}

// Whether this processor and build run `width` lanes.
inline bool runs_lanes(int width) {
#if defined(EMBER_EXP_AVX512_DISPATCH)
  if (width == 16) return cpu_has_avx512f();
#endif
#if defined(EMBER_EXP_AVX2_DISPATCH)
  return width == 4 || (width == 8 && cpu_has_avx2());
#else
  return width == lanes();
#endif
}

// The row functions at a given width: one this processor runs (runs_lanes), anything else
// meaning lanes(). The widths compute the same bits; tests call each.
inline float exp_sub_sum_at(int width, const float* x, float* y, int64_t n, float sub) {
  if (!runs_lanes(width)) width = lanes();
#if defined(EMBER_EXP_AVX512_DISPATCH)
  if (width == 16) return exp_sub_sum_avx512(x, y, n, sub);
#endif
#if defined(EMBER_EXP_AVX2_DISPATCH)
  if (width == 8) return exp_sub_sum_avx2(x, y, n, sub);
  return exp_sub_sum_lanes<4>(x, y, n, sub);
#elif defined(__AVX__)
  return exp_sub_sum_lanes<8>(x, y, n, sub);
#else
  return exp_sub_sum_lanes<4>(x, y, n, sub);
#endif
}
inline float row_max_at(int width, const float* x, int64_t n) {
  if (!runs_lanes(width)) width = lanes();
#if defined(EMBER_EXP_AVX512_DISPATCH)
  if (width == 16) return row_max_avx512(x, n);
#endif
#if defined(EMBER_EXP_AVX2_DISPATCH)
  if (width == 8) return row_max_avx2(x, n);
  return row_max_lanes<4>(x, n);
#elif defined(__AVX__)
  return row_max_lanes<8>(x, n);
#else
  return row_max_lanes<4>(x, n);
#endif
}
template <LaneOp kOp>
inline void map_f32_at(int width, const float* x, const float* gy, float* y, int64_t n) {
  if (!runs_lanes(width)) width = lanes();
#if defined(EMBER_EXP_AVX512_DISPATCH)
  if (width == 16) return map_avx512<kOp>(x, gy, y, n);
#endif
#if defined(EMBER_EXP_AVX2_DISPATCH)
  if (width == 8) return map_avx2<kOp>(x, gy, y, n);
  map_lanes<4, kOp>(x, gy, y, n);
#elif defined(__AVX__)
  map_lanes<8, kOp>(x, gy, y, n);
#else
  map_lanes<4, kOp>(x, gy, y, n);
#endif
}

inline float exp_sub_sum(const float* x, float* y, int64_t n, float sub) {
  return exp_sub_sum_at(lanes(), x, y, n, sub);
}
inline float row_max(const float* x, int64_t n) { return row_max_at(lanes(), x, n); }

// The lane width of this build (the vector paths exist only with GCC's vector extensions).
#if defined(__GNUC__)
inline constexpr bool kHaveVectorMath = true;
#else
inline constexpr bool kHaveVectorMath = false;
#endif

// y = op(x) over n floats (y may be x); with gy, gx = gy * op(x) (GeluTanhGrad).
template <LaneOp kOp>
inline void map_f32(const float* x, const float* gy, float* y, int64_t n) {
  map_f32_at<kOp>(lanes(), x, gy, y, n);
}
inline void relu_f32(const float* x, float* y, int64_t n) { map_f32<LaneOp::Relu>(x, nullptr, y, n); }
inline void relu_backward_f32(const float* x, const float* gy, float* gx, int64_t n) {
  map_f32<LaneOp::ReluGrad>(x, gy, gx, n);
}
inline void tanh_f32(const float* x, float* y, int64_t n) { map_f32<LaneOp::Tanh>(x, nullptr, y, n); }
inline void gelu_tanh_f32(const float* x, float* y, int64_t n) { map_f32<LaneOp::GeluTanh>(x, nullptr, y, n); }
inline void gelu_tanh_backward_f32(const float* x, const float* gy, float* gx, int64_t n) {
  map_f32<LaneOp::GeluTanhGrad>(x, gy, gx, n);
}

}  // namespace detail
}  // namespace ember::cpu
