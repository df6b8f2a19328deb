#pragma once
// Fused scaled dot-product attention (Backend::attention_forward/attention_backward): the
// softmax(scale q k^T + mask) v of every head in one kernel per direction, blocked so that no
// head's [L, S] score matrix is kept (see backend/cpu/attention.hpp; CUDA:
// backend/cuda/kernels/attention.cuh). The public entry, with PyTorch's argument conventions,
// masks and the composite fallback, is nn::functional::scaled_dot_product_attention
// (nn/attention.hpp); this is the kernel-level op on [bh, L, D] tensors.
//
//   op::fused_attention(q [bh, L, D], k [bh, S, D], v [bh, S, Dv], mask, mask_group,
//                       causal, scale) -> [bh, L, Dv]
//
// mask: undefined, [L, S] (every head) or [bh / mask_group, L, S] (mask_group consecutive heads
// share one), additive, of q's dtype. float32 and float64; q, k, v, mask on one device. First
// derivatives only (a graph made inside backward does not go through the kernel); the mask gets
// no gradient.
#include <cmath>

#include "ember/ops/shape.hpp"

namespace ember::op {

inline AnyTensor fused_attention(const AnyTensor& q, const AnyTensor& k, const AnyTensor& v, const AnyTensor& mask,
                                 int64_t mask_group, bool causal, double scale) {
  const char* name = "scaled_dot_product_attention";
  detail::OpScope op_scope(name, q, k, v);
  for (const AnyTensor* t : {&q, &k, &v}) detail::check_defined(name, *t);
  detail::check_same_device(name, q, k);
  detail::check_same_device(name, q, v);
  EMBER_CHECK(q.dtype() == DType::Float32 || q.dtype() == DType::Float64, DTypeError, name,
              ": the fused kernel takes float32 or float64, got ", q.desc());
  EMBER_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), DTypeError, name,
              ": query, key and value must have one dtype, got ", q.desc(), ", ", k.desc(), ", ", v.desc());
  EMBER_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, ShapeError, name,
              ": the fused op takes [heads, L, D] tensors, got ", q.desc(), ", ", k.desc(), ", ", v.desc());
  const int64_t bh = q.shape()[0], L = q.shape()[1], D = q.shape()[2];
  const int64_t S = k.shape()[1], Dv = v.shape()[2];
  EMBER_CHECK(k.shape()[0] == bh && v.shape()[0] == bh && k.shape()[2] == D && v.shape()[1] == S, ShapeError, name,
              ": query ", q.desc(), ", key ", k.desc(), " and value ", v.desc(),
              " must be [heads, L, D], [heads, S, D] and [heads, S, Dv]");
  EMBER_CHECK(D >= 1 && Dv >= 1, ShapeError, name, ": the head sizes must be at least 1, got query ", q.desc(),
              " and value ", v.desc());
  EMBER_CHECK(std::isfinite(scale), ValueError, name, ": scale must be finite, got ", scale);
  AttentionArgs a{q.dtype(), bh, L, S, D, Dv, scale, causal, 1, 0};
  if (mask.defined()) {
    detail::check_same_device(name, q, mask);
    EMBER_CHECK(mask.dtype() == q.dtype(), DTypeError, name, ": the additive mask ", mask.desc(),
                " must have the query's dtype ", dtype_name(q.dtype()));
    EMBER_CHECK(mask_group >= 1 && bh % mask_group == 0, ValueError, name, ": mask_group ", mask_group,
                " must divide the head count ", bh);
    const bool shared = mask.shape() == (Shape{L, S});
    EMBER_CHECK(shared || mask.shape() == (Shape{bh / mask_group, L, S}), ShapeError, name, ": mask ", mask.desc(),
                " must be [L, S] = [", L, ", ", S, "] or [heads / mask_group, L, S] = [", bh / mask_group, ", ", L,
                ", ", S, "]");
    a.mask_group = shared ? 1 : mask_group;
    a.mask_batch_stride = shared ? 0 : L * S;
  }
  const DType stat = q.dtype();  // float32 -> float, float64 -> double: the statistics type
  AnyTensor out = AnyTensor::empty({bh, L, Dv}, q.dtype(), q.device());
  AnyTensor lse = AnyTensor::empty({bh, L}, stat, q.device());
  auto ptr = [](const AnyTensor& t) -> const void* { return t.defined() ? t.data_ptr() : nullptr; };
  if (bh > 0 && L > 0)
    q.backend().attention_forward(a, q.data_ptr(), k.data_ptr(), v.data_ptr(), ptr(mask), out.data_ptr(),
                                  lse.data_ptr());
  if (autograd::any_requires_grad({q, k, v})) {
    EMBER_CHECK(!mask.defined() || !mask.requires_grad(), ValueError, name,
                ": the fused kernel gives the mask no gradient; mask ", mask.desc(), " requires one");
    AnyTensor sq = q.detach(), sk = k.detach(), sv = v.detach(), so = out.detach();
    AnyTensor sm = mask.defined() ? mask.detach() : AnyTensor();
    autograd::record(name, {q, k, v}, {out}, [sq, sk, sv, sm, so, lse, a](const std::vector<AnyTensor>& g) {
      AnyTensor gq = AnyTensor::empty(sq.shape(), sq.dtype(), sq.device());
      AnyTensor gk = AnyTensor::empty(sk.shape(), sk.dtype(), sk.device());
      AnyTensor gv = AnyTensor::empty(sv.shape(), sv.dtype(), sv.device());
      AnyTensor delta = AnyTensor::empty({a.bh, a.L}, lse.dtype(), sq.device());
      if (a.bh > 0 && (a.L > 0 || a.S > 0)) {
        if (a.L == 0) {  // no query: nothing flows to the keys and values
          gk.backend().fill(gk.dtype(), gk.data_ptr(), gk.numel(), 0.0);
          gv.backend().fill(gv.dtype(), gv.data_ptr(), gv.numel(), 0.0);
        } else {
          sq.backend().attention_backward(a, sq.data_ptr(), sk.data_ptr(), sv.data_ptr(),
                                          sm.defined() ? sm.data_ptr() : nullptr, so.data_ptr(), lse.data_ptr(),
                                          g[0].data_ptr(), delta.data_ptr(), gq.data_ptr(), gk.data_ptr(),
                                          gv.data_ptr());
        }
      }
      return std::vector<AnyTensor>{gq, gk, gv};
    });
  }
  return out;
}

}  // namespace ember::op
