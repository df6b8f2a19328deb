#pragma once
// CUDA kernel of the fused Adam / AdamW step (core/kernel_table.hpp AdamStepArgs): one pass over a
// parameter, its gradient and the moments, the twin of backend/cpu/optim_step.hpp. The scalars are
// rounded to the state type S on the host exactly as the CPU kernel rounds them (and the lerp
// branch is chosen there), and each element does the CPU's operations in the CPU's order.
//
// Why the __fmul_rn / __fadd_rn / ... intrinsics: nvcc contracts a * b + c into one FMA by default
// (one rounding instead of two), while the CPU (x86-64 baseline, no FMA, no contraction) rounds the
// product and the sum separately. The intrinsics are never contracted, so every operation below is
// rounded once to nearest-even, as on the CPU, and the CUDA result is bitwise the CPU's. Division
// and square root are IEEE-correct too (nvcc's -prec-div / -prec-sqrt defaults, no fast math), and
// denormals are kept, as on the CPU. A NaN stays a NaN but its bits may differ: CUDA arithmetic
// returns the canonical NaN where x86 passes an operand's NaN on (the amsgrad maximum itself
// returns std::numeric_limits<S>::quiet_NaN()'s bits, as the CPU kernel does).
#if defined(__CUDACC__)
#include <cmath>
#include <cstdint>

#include "ember/backend/cuda/kernels/common.cuh"

namespace ember::cuda_impl {
namespace {

// Round-to-nearest operations of S (float or double) that nvcc never fuses.
__device__ __forceinline__ float adam_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double adam_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float adam_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double adam_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float adam_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double adam_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float adam_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double adam_div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float adam_sqrt(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double adam_sqrt(double a) { return __dsqrt_rn(a); }
// std::numeric_limits<S>::quiet_NaN()'s bits (the CPU's amsgrad maximum of a NaN).
__device__ __forceinline__ float adam_quiet_nan(float) { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ double adam_quiet_nan(double) { return __longlong_as_double(0x7ff8000000000000LL); }

// The step's scalars, rounded to S on the host as cpu::adam_step rounds them.
template <class S>
struct AdamScalars {
  S decay;            // 1 - lr * weight_decay (decoupled)
  S wd;               // weight_decay (coupled: g + p * wd)
  S w;                // the lerp weight: 1 - beta1 when lerp_low, else beta1 (= 1 - (1 - beta1))
  S beta2, one_minus_beta2;
  S inv_bc2;          // 1 / bias_correction2_sqrt
  S eps;
  S neg_step;         // -step_size
  bool maximize, weight_decay, decoupled, lerp_low, amsgrad;
};

template <class S>
AdamScalars<S> adam_scalars(const AdamStepArgs& a) {
  AdamScalars<S> s;
  s.decay = static_cast<S>(1.0 - a.lr * a.weight_decay);
  s.wd = static_cast<S>(a.weight_decay);
  const double w = 1.0 - a.beta1;  // lerp(exp_avg, g, w)
  s.lerp_low = std::abs(w) < 0.5;
  s.w = static_cast<S>(s.lerp_low ? w : 1.0 - w);
  s.beta2 = static_cast<S>(a.beta2);
  s.one_minus_beta2 = static_cast<S>(1.0 - a.beta2);
  s.inv_bc2 = static_cast<S>(1.0 / a.bias_correction2_sqrt);
  s.eps = static_cast<S>(a.eps);
  s.neg_step = static_cast<S>(-a.step_size);
  s.maximize = a.maximize;
  s.weight_decay = a.weight_decay != 0.0;
  s.decoupled = a.decoupled;
  s.amsgrad = a.amsgrad;
  return s;
}

// P: the parameter's element type, G: the gradient's, S: the state's (float or double). The flags
// are uniform across the grid, so their branches cost nothing next to the memory traffic.
template <class P, class G, class S>
__global__ void adam_step_kernel(AdamScalars<S> s, int64_t n, P* __restrict__ param, const G* __restrict__ grad,
                                 S* __restrict__ exp_avg, S* __restrict__ exp_avg_sq,
                                 S* __restrict__ max_exp_avg_sq) {
  EMBER_GRID_STRIDE_LOOP(i, n) {
    S p = static_cast<S>(to_calc<P>(param[i]));
    S g = static_cast<S>(to_calc<G>(grad[i]));
    if (s.maximize) g = -g;
    if (s.weight_decay) {
      if (s.decoupled)
        p = adam_mul(p, s.decay);
      else
        g = adam_add(g, adam_mul(p, s.wd));
    }
    S m = exp_avg[i];
    const S d = adam_sub(g, m);
    m = s.lerp_low ? adam_add(m, adam_mul(d, s.w)) : adam_sub(g, adam_mul(d, s.w));
    exp_avg[i] = m;
    S v = adam_add(adam_mul(exp_avg_sq[i], s.beta2), adam_mul(adam_mul(g, s.one_minus_beta2), g));
    exp_avg_sq[i] = v;
    if (s.amsgrad) {
      const S old = max_exp_avg_sq[i];
      v = (isnan(old) || isnan(v)) ? adam_quiet_nan(S{}) : (old > v ? old : v);
      max_exp_avg_sq[i] = v;
    }
    const S denom = adam_add(adam_mul(adam_sqrt(v), s.inv_bc2), s.eps);
    p = adam_add(p, adam_div(adam_mul(m, s.neg_step), denom));
    param[i] = from_calc<P>(static_cast<calc_t<P>>(p));
  }
}

// The four floating types (the parameter's and the gradient's).
template <class F>
void adam_dispatch_floating(DType t, F&& f) {
  switch (t) {
    case DType::Float32: f(float{}); return;
    case DType::Float64: f(double{}); return;
    case DType::Float16: f(half{}); return;
    case DType::BFloat16: f(bfloat16{}); return;
    default: return;  // unreachable: launch_adam_step checks the dtypes first
  }
}

// All 2 x 4 x 4 combinations of (state, parameter, gradient) types are dispatched, not only those
// the optimizer produces (S = float64 iff the parameter is float64; the gradient of the parameter's
// type, or float32 for a 16-bit parameter): each instantiation is one small kernel. The dtype
// errors are the CPU backend's (same checks in the same order, same words) plus the device, and
// come before the n == 0 return, as on the CPU.
inline void launch_adam_step(const AdamStepArgs& a, void* param, const void* grad, void* exp_avg,
                             void* exp_avg_sq, void* max_exp_avg_sq, int device, unsigned grid,
                             cudaStream_t stream) {
  if (a.state_dtype != DType::Float32 && a.state_dtype != DType::Float64)
    throw DTypeError(::ember::detail::str_cat("adam_step: the state is float32 or float64, got ",
                                              dtype_name(a.state_dtype), " on cuda:", device));
  if (!is_floating(a.param_dtype) || !is_floating(a.grad_dtype))
    throw DTypeError(::ember::detail::str_cat("adam_step: floating parameters and gradients only, got ",
                                              dtype_name(a.param_dtype), " and ", dtype_name(a.grad_dtype),
                                              " on cuda:", device));
  if (a.n <= 0) return;
  auto with_state = [&](auto state_tag) {
    using S = decltype(state_tag);
    adam_dispatch_floating(a.param_dtype, [&](auto param_tag) {
      using P = decltype(param_tag);
      adam_dispatch_floating(a.grad_dtype, [&](auto grad_tag) {
        using G = decltype(grad_tag);
        adam_step_kernel<P, G, S><<<grid, kThreads, 0, stream>>>(
            adam_scalars<S>(a), a.n, static_cast<P*>(param), static_cast<const G*>(grad),
            static_cast<S*>(exp_avg), static_cast<S*>(exp_avg_sq), a.amsgrad ? static_cast<S*>(max_exp_avg_sq) : nullptr);
        EMBER_CUDA_CHECK_LAUNCH();
      });
    });
  };
  if (a.state_dtype == DType::Float64)
    with_state(double{});
  else
    with_state(float{});
}

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
