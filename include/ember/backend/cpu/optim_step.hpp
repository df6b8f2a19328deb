#pragma once
// CPU kernels of the fused optimizer steps (core/backend.hpp AdamStepArgs, SgdStepArgs,
// RmspropStepArgs): one pass over the parameter, its gradient and the state instead of the 5-15
// elementwise ops (each a full pass over memory) of the composites in optim/adam.hpp, sgd.hpp and
// rmsprop.hpp. Each element follows the composite's
// operations in the same order, with the scalars rounded to the state type as the scalar ops
// round them (x * S(a); a division by a scalar is a multiplication by S(1 / a)), so without FMA
// contraction (x86-64's baseline) the result is bitwise the composite's. Threaded over elements
// (each element is independent: the result never depends on the thread count). Each takes the
// GradScaler's unscale fused in (grad_unscale, step_grad below).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ember/backend/cpu/elementwise.hpp"
#include "ember/backend/cpu/parallel.hpp"

namespace ember::cpu {

// The gradient element a step uses, in G's computation type. With the GradScaler's unscale fused
// in (grad_unscale != 1: `unscale`), the element times u rounded to G, as UnaryOp::MulScalar
// computes it (elementwise.hpp), is written back first, so the gradient ends as unscale_ leaves it.
template <class G>
inline calc_t<G> step_grad(G* grad, int64_t i, bool unscale, calc_t<G> u) {
  if (!unscale) return static_cast<calc_t<G>>(grad[i]);
  const G v = from_calc<G>(static_cast<calc_t<G>>(grad[i]) * u);
  grad[i] = v;
  return static_cast<calc_t<G>>(v);
}

// The gradient an update uses, in the state type S (torch's order): element i through step_grad,
// negated when the step maximizes, plus the L2 weight decay l2 * p when l2 != 0.
template <class S, class G>
struct StepGrad {
  G* grad;
  bool unscale, maximize;
  calc_t<G> u;
  double l2;
  S l2_s;
  StepGrad(G* g, double grad_unscale, bool maximize_, double l2_weight_decay)
      : grad(g),
        unscale(grad_unscale != 1.0),
        maximize(maximize_),
        u(static_cast<calc_t<G>>(grad_unscale)),
        l2(l2_weight_decay),
        l2_s(static_cast<S>(l2_weight_decay)) {}
  S operator()(int64_t i, S p) const {
    S g = static_cast<S>(step_grad(grad, i, unscale, u));
    if (maximize) g = -g;
    if (l2 != 0.0) g = g + p * l2_s;
    return g;
  }
};

// torch's two-branch lerp(m, g, w) = m + w (g - m) of a running mean (Adam's first moment,
// RMSprop's centered mean): m + w (g - m) when |w| < 0.5, else g - (1 - w)(g - m), the weight
// rounded to S.
template <class S>
struct Lerp {
  bool low;
  S w;
  explicit Lerp(double weight) : low(std::abs(weight) < 0.5), w(static_cast<S>(low ? weight : 1.0 - weight)) {}
  S operator()(S m, S g) const {
    const S d = g - m;
    return low ? m + d * w : g - d * w;
  }
};

#if defined(__GNUC__) && defined(__SSE2__) && !defined(__CUDACC__)
#define EMBER_ADAM_F32_LANES 1
namespace detail {
// Adam on all-fp32 tensors, four lanes at a time: the scalar loop below stays scalar because
// std::sqrt under the default -fmath-errno is sqrtss plus a branch to libm for a negative input
// (errno), which the vectoriser cannot take; sqrtps is the same correctly rounded square root, and
// every other operation is the scalar loop's in the same order, so the bits are the same (the
// fused-versus-composite tests compare them bitwise). AdamW over 3.2M parameters, 1 thread:
// 4.1 ms where the scalar loop takes 13.6 (a build with -fno-math-errno vectorises the scalar loop
// to the same 4.1 ms). Returns the first element it did not do (the scalar loop does the rest).
struct AdamF32Consts {
  float decay, wd, w_s, beta2, one_minus_beta2, inv_bc2, eps, neg_step, u;
  bool decoupled, has_wd, lerp_low, unscale, maximize, amsgrad;
};
inline int64_t adam_step_f32_lanes(const AdamF32Consts& c, float* param, float* grad, float* exp_avg,
                                   float* exp_avg_sq, float* max_exp_avg_sq, int64_t lo, int64_t hi) {
  using V = float __attribute__((vector_size(16)));
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  int64_t i = lo;
  for (; i + 4 <= hi; i += 4) {
    V p, g, m, v;
    std::memcpy(&p, param + i, sizeof p);
    std::memcpy(&g, grad + i, sizeof g);
    std::memcpy(&m, exp_avg + i, sizeof m);
    std::memcpy(&v, exp_avg_sq + i, sizeof v);
    if (c.unscale) {
      g = g * c.u;
      std::memcpy(grad + i, &g, sizeof g);
    }
    if (c.maximize) g = -g;
    if (c.has_wd) {
      if (c.decoupled)
        p = p * c.decay;
      else
        g = g + p * c.wd;
    }
    const V d = g - m;
    m = c.lerp_low ? m + d * c.w_s : g - d * c.w_s;
    std::memcpy(exp_avg + i, &m, sizeof m);
    v = v * c.beta2 + (g * c.one_minus_beta2) * g;
    std::memcpy(exp_avg_sq + i, &v, sizeof v);
    if (c.amsgrad) {
      V old;
      std::memcpy(&old, max_exp_avg_sq + i, sizeof old);
      v = ((old != old) | (v != v)) ? V{} + qnan : (old > v ? old : v);
      std::memcpy(max_exp_avg_sq + i, &v, sizeof v);
    }
    const V denom = __builtin_ia32_sqrtps(v) * c.inv_bc2 + c.eps;
    p = p + (m * c.neg_step) / denom;
    std::memcpy(param + i, &p, sizeof p);
  }
  return i;
}
}  // namespace detail
#endif

// P: the parameter's element type, G: the gradient's, S: the state's (float or double).
template <class P, class G, class S>
void adam_step(const AdamStepArgs& a, P* param, G* grad, S* exp_avg, S* exp_avg_sq, S* max_exp_avg_sq) {
  const S decay = static_cast<S>(1.0 - a.lr * a.weight_decay);  // decoupled (AdamW)
  const Lerp<S> lerp(1.0 - a.beta1);                            // lerp(exp_avg, g, 1 - beta1)
  const S beta2 = static_cast<S>(a.beta2), one_minus_beta2 = static_cast<S>(1.0 - a.beta2);
  const S inv_bc2 = static_cast<S>(1.0 / a.bias_correction2_sqrt);
  const S eps = static_cast<S>(a.eps);
  const S neg_step = static_cast<S>(-a.step_size);
  const StepGrad<S, G> grad_at(grad, a.grad_unscale, a.maximize, a.decoupled ? 0.0 : a.weight_decay);
  parallel_for(0, a.n, kGrainTranscendental, [&](int64_t lo, int64_t hi) {
#if defined(EMBER_ADAM_F32_LANES)
    if constexpr (std::is_same_v<P, float> && std::is_same_v<G, float> && std::is_same_v<S, float>) {
      const detail::AdamF32Consts c{decay, static_cast<S>(a.weight_decay), lerp.w, beta2,
                                    one_minus_beta2, inv_bc2, eps, neg_step, grad_at.u, a.decoupled,
                                    a.weight_decay != 0.0, lerp.low, grad_at.unscale, a.maximize, a.amsgrad};
      lo = detail::adam_step_f32_lanes(c, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lo, hi);
    }
#endif
    for (int64_t i = lo; i < hi; ++i) {
      S p = static_cast<S>(static_cast<calc_t<P>>(param[i]));
      const S g = grad_at(i, p);
      if (a.decoupled && a.weight_decay != 0.0) p = p * decay;
      const S m = lerp(exp_avg[i], g);
      exp_avg[i] = m;
      S v = exp_avg_sq[i] * beta2 + (g * one_minus_beta2) * g;
      exp_avg_sq[i] = v;
      if (a.amsgrad) {
        const S old = max_exp_avg_sq[i];
        v = (std::isnan(old) || std::isnan(v)) ? std::numeric_limits<S>::quiet_NaN() : (old > v ? old : v);
        max_exp_avg_sq[i] = v;
      }
      const S denom = std::sqrt(v) * inv_bc2 + eps;
      p = p + (m * neg_step) / denom;
      param[i] = from_calc<P>(static_cast<calc_t<P>>(p));
    }
  });
}

// SGD with momentum, dampening, Nesterov, L2 weight decay, maximize (optim/sgd.hpp's order).
template <class P, class G, class S>
void sgd_step(const SgdStepArgs& a, P* param, G* grad, S* momentum_buffer) {
  const S momentum = static_cast<S>(a.momentum);
  const S keep = static_cast<S>(1.0 - a.dampening);  // x * 1 is exact: the composite's skip is the same value
  const S neg_lr = static_cast<S>(-a.lr);
  const bool use_momentum = a.momentum != 0.0;
  const StepGrad<S, G> grad_at(grad, a.grad_unscale, a.maximize, a.weight_decay);
  parallel_for(0, a.n, kGrainElementwise, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      S p = static_cast<S>(static_cast<calc_t<P>>(param[i]));
      S g = grad_at(i, p);
      if (use_momentum) {
        const S b = a.first_step ? g : momentum_buffer[i] * momentum + g * keep;
        momentum_buffer[i] = b;
        g = a.nesterov ? g + b * momentum : b;
      }
      p = p + g * neg_lr;
      param[i] = from_calc<P>(static_cast<calc_t<P>>(p));
    }
  });
}

// RMSprop, centered or not, with momentum, L2 weight decay, maximize (optim/rmsprop.hpp's order;
// the centered running mean is torch's two-branch lerp, as Adam's first moment).
template <class P, class G, class S>
void rmsprop_step(const RmspropStepArgs& a, P* param, G* grad, S* square_avg, S* grad_avg,
                  S* momentum_buffer) {
  const S alpha = static_cast<S>(a.alpha);
  const S one_minus_alpha = static_cast<S>(1.0 - a.alpha);
  const Lerp<S> lerp(1.0 - a.alpha);  // lerp(grad_avg, g, 1 - alpha)
  const S eps = static_cast<S>(a.eps), momentum = static_cast<S>(a.momentum), neg_lr = static_cast<S>(-a.lr);
  const bool use_momentum = a.momentum > 0.0;
  const StepGrad<S, G> grad_at(grad, a.grad_unscale, a.maximize, a.weight_decay);
  parallel_for(0, a.n, kGrainTranscendental, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      S p = static_cast<S>(static_cast<calc_t<P>>(param[i]));
      const S g = grad_at(i, p);
      const S sq = square_avg[i] * alpha + (g * one_minus_alpha) * g;
      square_avg[i] = sq;
      S avg;
      if (a.centered) {
        const S m = lerp(grad_avg[i], g);
        grad_avg[i] = m;
        avg = std::sqrt(sq + (-m) * m);
      } else {
        avg = std::sqrt(sq);
      }
      avg = avg + eps;
      if (use_momentum) {
        const S b = momentum_buffer[i] * momentum + g / avg;
        momentum_buffer[i] = b;
        p = p + b * neg_lr;
      } else {
        p = p + (g * neg_lr) / avg;
      }
      param[i] = from_calc<P>(static_cast<calc_t<P>>(p));
    }
  });
}

}  // namespace ember::cpu
