#pragma once
// CUDA kernels of the fused optimizer steps (core/backend.hpp AdamStepArgs, SgdStepArgs,
// RmspropStepArgs): one pass over a parameter, its gradient and its state, the twins of
// backend/cpu/optim_step.hpp. The scalars are
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
#include "ember/backend/cuda/kernels/launch.cuh"

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

// The gradient element a step uses (cpu::step_grad's twin): with the GradScaler's unscale fused in
// (`unscale`), the element times u in G's computation type, rounded to G as the unary MulScalar
// kernel rounds it, written back first.
template <class G>
__device__ __forceinline__ calc_t<G> step_grad(G* grad, int64_t i, bool unscale, calc_t<G> u) {
  if (!unscale) return to_calc<G>(grad[i]);
  const G v = from_calc<G>(adam_mul(to_calc<G>(grad[i]), u));
  grad[i] = v;
  return to_calc<G>(v);
}

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
__global__ void adam_step_kernel(AdamScalars<S> s, int64_t n, P* __restrict__ param, G* __restrict__ grad,
                                 bool unscale, calc_t<G> u,
                                 S* __restrict__ exp_avg, S* __restrict__ exp_avg_sq,
                                 S* __restrict__ max_exp_avg_sq) {
  EMBER_GRID_STRIDE_LOOP(i, n) {
    S p = static_cast<S>(to_calc<P>(param[i]));
    S g = static_cast<S>(step_grad(grad, i, unscale, u));
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

// SGD (cpu::sgd_step's operations in its order, rounded as there).
template <class S>
struct SgdScalars {
  S wd, momentum, keep, neg_lr;  // keep: 1 - dampening
  bool maximize, weight_decay, use_momentum, first_step, nesterov;
};

template <class S>
SgdScalars<S> sgd_scalars(const SgdStepArgs& a) {
  return {static_cast<S>(a.weight_decay), static_cast<S>(a.momentum), static_cast<S>(1.0 - a.dampening),
          static_cast<S>(-a.lr),          a.maximize,                  a.weight_decay != 0.0,
          a.momentum != 0.0,              a.first_step,                a.nesterov};
}

template <class P, class G, class S>
__global__ void sgd_step_kernel(SgdScalars<S> s, int64_t n, P* __restrict__ param, G* __restrict__ grad,
                                bool unscale, calc_t<G> u,
                                S* __restrict__ momentum_buffer) {
  EMBER_GRID_STRIDE_LOOP(i, n) {
    S p = static_cast<S>(to_calc<P>(param[i]));
    S g = static_cast<S>(step_grad(grad, i, unscale, u));
    if (s.maximize) g = -g;
    if (s.weight_decay) g = adam_add(g, adam_mul(p, s.wd));
    if (s.use_momentum) {
      const S b = s.first_step ? g : adam_add(adam_mul(momentum_buffer[i], s.momentum), adam_mul(g, s.keep));
      momentum_buffer[i] = b;
      g = s.nesterov ? adam_add(g, adam_mul(b, s.momentum)) : b;
    }
    p = adam_add(p, adam_mul(g, s.neg_lr));
    param[i] = from_calc<P>(static_cast<calc_t<P>>(p));
  }
}

// RMSprop (cpu::rmsprop_step's operations in its order, rounded as there).
template <class S>
struct RmspropScalars {
  S wd, alpha, one_minus_alpha, w, eps, momentum, neg_lr;  // w: the centered lerp's weight, as Adam's
  bool maximize, weight_decay, centered, lerp_low, use_momentum;
};

template <class S>
RmspropScalars<S> rmsprop_scalars(const RmspropStepArgs& a) {
  RmspropScalars<S> s;
  s.wd = static_cast<S>(a.weight_decay);
  s.alpha = static_cast<S>(a.alpha);
  s.one_minus_alpha = static_cast<S>(1.0 - a.alpha);
  const double w = 1.0 - a.alpha;
  s.lerp_low = std::abs(w) < 0.5;
  s.w = static_cast<S>(s.lerp_low ? w : 1.0 - w);
  s.eps = static_cast<S>(a.eps);
  s.momentum = static_cast<S>(a.momentum);
  s.neg_lr = static_cast<S>(-a.lr);
  s.maximize = a.maximize;
  s.weight_decay = a.weight_decay != 0.0;
  s.centered = a.centered;
  s.use_momentum = a.momentum > 0.0;
  return s;
}

template <class P, class G, class S>
__global__ void rmsprop_step_kernel(RmspropScalars<S> s, int64_t n, P* __restrict__ param,
                                    G* __restrict__ grad, bool unscale, calc_t<G> u, S* __restrict__ square_avg,
                                    S* __restrict__ grad_avg, S* __restrict__ momentum_buffer) {
  EMBER_GRID_STRIDE_LOOP(i, n) {
    S p = static_cast<S>(to_calc<P>(param[i]));
    S g = static_cast<S>(step_grad(grad, i, unscale, u));
    if (s.maximize) g = -g;
    if (s.weight_decay) g = adam_add(g, adam_mul(p, s.wd));
    const S sq = adam_add(adam_mul(square_avg[i], s.alpha), adam_mul(adam_mul(g, s.one_minus_alpha), g));
    square_avg[i] = sq;
    S avg;
    if (s.centered) {
      S m = grad_avg[i];
      const S d = adam_sub(g, m);
      m = s.lerp_low ? adam_add(m, adam_mul(d, s.w)) : adam_sub(g, adam_mul(d, s.w));
      grad_avg[i] = m;
      avg = adam_sqrt(adam_add(sq, adam_mul(-m, m)));
    } else {
      avg = adam_sqrt(sq);
    }
    avg = adam_add(avg, s.eps);
    if (s.use_momentum) {
      const S b = adam_add(adam_mul(momentum_buffer[i], s.momentum), adam_div(g, avg));
      momentum_buffer[i] = b;
      p = adam_add(p, adam_mul(b, s.neg_lr));
    } else {
      p = adam_add(p, adam_div(adam_mul(g, s.neg_lr), avg));
    }
    param[i] = from_calc<P>(static_cast<calc_t<P>>(p));
  }
}

// All 2 x 4 x 4 combinations of (state, parameter, gradient) types are dispatched, not only those
// the optimizers produce (S = float64 iff the parameter is float64; the gradient of the parameter's
// type, or float32 for a 16-bit parameter): each instantiation is one small kernel. The dtype
// errors are the CPU backend's (same checks in the same order, same words) plus the device, and
// come before the n == 0 return, as on the CPU. `launch` is called as
// launch.template operator()<P, G, S>().
template <class Launch>
void dispatch_optim_step(const LaunchContext& c, const char* op, DType state, DType param, DType grad, int64_t n,
                         Launch&& launch) {
  const int device = c.device;
  DeviceGuard g(device);
  if (state != DType::Float32 && state != DType::Float64)
    throw DTypeError(::ember::detail::str_cat(op, ": the state is float32 or float64, got ", dtype_name(state),
                                              " on cuda:", device));
  if (!is_floating(param) || !is_floating(grad))
    throw DTypeError(::ember::detail::str_cat(op, ": floating parameters and gradients only, got ",
                                              dtype_name(param), " and ", dtype_name(grad), " on cuda:", device));
  if (n <= 0) return;
  auto with_state = [&](auto state_tag) {
    using S = decltype(state_tag);
    // The parameter's and the gradient's floating types (dispatch_floating's error is unreachable:
    // the dtypes were checked above).
    dispatch_floating(param, op, device, [&](auto param_tag) {
      using P = decltype(param_tag);
      dispatch_floating(grad, op, device, [&](auto grad_tag) {
        using G = decltype(grad_tag);
        launch.template operator()<P, G, S>();
        EMBER_CUDA_CHECK_LAUNCH();
      });
    });
  };
  if (state == DType::Float64)
    with_state(double{});
  else
    with_state(float{});
}

inline void launch_adam_step(const LaunchContext& c, const AdamStepArgs& a, void* param, void* grad,
                             void* exp_avg, void* exp_avg_sq, void* max_exp_avg_sq) {
  const unsigned grid = grid_for(a.n, c.sm_count);
  dispatch_optim_step(c, "adam_step", a.state_dtype, a.param_dtype, a.grad_dtype, a.n,
                      [&]<class P, class G, class S>() {
                        adam_step_kernel<P, G, S><<<grid, kThreads, 0, c.stream>>>(
                            adam_scalars<S>(a), a.n, static_cast<P*>(param), static_cast<G*>(grad),
                            a.grad_unscale != 1.0, static_cast<calc_t<G>>(a.grad_unscale),
                            static_cast<S*>(exp_avg), static_cast<S*>(exp_avg_sq),
                            a.amsgrad ? static_cast<S*>(max_exp_avg_sq) : nullptr);
                      });
}

inline void launch_sgd_step(const LaunchContext& c, const SgdStepArgs& a, void* param, void* grad,
                            void* momentum_buffer) {
  const unsigned grid = grid_for(a.n, c.sm_count);
  dispatch_optim_step(c, "sgd_step", a.state_dtype, a.param_dtype, a.grad_dtype, a.n,
                      [&]<class P, class G, class S>() {
                        sgd_step_kernel<P, G, S><<<grid, kThreads, 0, c.stream>>>(
                            sgd_scalars<S>(a), a.n, static_cast<P*>(param), static_cast<G*>(grad),
                            a.grad_unscale != 1.0, static_cast<calc_t<G>>(a.grad_unscale),
                            static_cast<S*>(momentum_buffer));
                      });
}

inline void launch_rmsprop_step(const LaunchContext& c, const RmspropStepArgs& a, void* param, void* grad,
                                void* square_avg, void* grad_avg, void* momentum_buffer) {
  const unsigned grid = grid_for(a.n, c.sm_count);
  dispatch_optim_step(c, "rmsprop_step", a.state_dtype, a.param_dtype, a.grad_dtype, a.n,
                      [&]<class P, class G, class S>() {
                        rmsprop_step_kernel<P, G, S><<<grid, kThreads, 0, c.stream>>>(
                            rmsprop_scalars<S>(a), a.n, static_cast<P*>(param), static_cast<G*>(grad),
                            a.grad_unscale != 1.0, static_cast<calc_t<G>>(a.grad_unscale),
                            static_cast<S*>(square_avg), static_cast<S*>(grad_avg),
                            static_cast<S*>(momentum_buffer));
                      });
}

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
