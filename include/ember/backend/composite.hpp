#pragma once
// Composites written with the kernel table's own entries: what a backend without a fused kernel
// runs (the CPU), and what a fused kernel falls back to where it cannot run a problem (CUDA). Both
// backends run the same sequence, so their results differ only where the primitives do.
#include "ember/core/backend.hpp"

namespace ember {

// Linear with bias and activation (LinearActArgs), in the order op::linear then the activation
// take: z filled with the broadcast bias, the GEMM adds x W^T into it (beta = 1), then
// y = act(z) elementwise.
inline void linear_act_composite(Backend& be, const LinearActArgs& a, const void* x, const void* w, const void* b,
                                 void* z, void* y) {
  if (a.rows <= 0 || a.out <= 0) return;
  const bool keep_z = linear_act_needs_z(a.act);
  void* pre = keep_z ? z : y;
  if (b != nullptr) {
    StridedArgs s;
    s.ndim = 2;
    s.shape[0] = a.rows;
    s.shape[1] = a.out;
    s.stride_a[0] = 0;
    s.stride_a[1] = 1;
    be.strided_copy(a.dtype, b, pre, s);
  }
  if (a.in == 0) {
    if (b == nullptr) be.fill(a.dtype, pre, a.rows * a.out, 0.0);
  } else {
    GemmArgs g;
    g.dtype = a.dtype;
    g.trans_b = true;
    g.m = a.rows;
    g.n = a.out;
    g.k = a.in;
    g.a = x;
    g.lda = a.in;
    g.b = w;
    g.ldb = a.in;
    g.c = pre;
    g.ldc = a.out;
    g.stride_c = a.rows * a.out;
    g.beta = b != nullptr ? 1.0 : 0.0;
    be.gemm(g);
  }
  switch (a.act) {
    case LinearActivation::None: return;
    case LinearActivation::Relu: be.unary(UnaryOp::Relu, a.dtype, pre, y, a.rows * a.out, 0.0, 0.0); return;
    case LinearActivation::Gelu: be.unary(UnaryOp::Gelu, a.dtype, pre, y, a.rows * a.out, 0.0, 0.0); return;
    case LinearActivation::GeluTanh: be.unary(UnaryOp::GeluTanh, a.dtype, pre, y, a.rows * a.out, 0.0, 0.0); return;
  }
}

}  // namespace ember
