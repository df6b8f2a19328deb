#pragma once
// softmax and log_softmax over one dimension, numerically stable (the row maximum is subtracted
// first); fp16/bf16 inputs are computed in fp32 inside the kernels.
#include "ember/ops/shape.hpp"

namespace ember::op {

namespace detail {
inline AnyTensor softmax_last(const AnyTensor& x, bool log) {
  AnyTensor y = AnyTensor::empty(x.shape(), x.dtype(), x.device());
  const int64_t cols = x.dim() == 0 ? 1 : x.shape()[x.dim() - 1];
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  if (y.numel() > 0) x.backend().softmax(x.dtype(), x.data_ptr(), y.data_ptr(), rows, cols, log);
  if (autograd::any_requires_grad({x})) {
    AnyTensor sy = y.detach();
    autograd::record(log ? "log_softmax" : "softmax", {x}, {y}, [sy, rows, cols, log](const std::vector<AnyTensor>& g) {
      AnyTensor gx = AnyTensor::empty(sy.shape(), sy.dtype(), sy.device());
      if (gx.numel() > 0)
        gx.backend().softmax_backward(sy.dtype(), sy.data_ptr(), g[0].data_ptr(), gx.data_ptr(), rows, cols, log);
      return std::vector<AnyTensor>{gx};
    });
  }
  return y;
}

inline AnyTensor softmax_dim(const char* name, const AnyTensor& x, int dim, bool log) {
  OpScope op_scope(name, x);
  check_defined(name, x);
  check_floating(name, x);
  if (x.dim() == 0) {  // dimension 0 or -1, as in PyTorch
    normalize_dim(dim, 1, name);
    return softmax_last(x, log);
  }
  int d = normalize_dim(dim, x.dim(), name);
  if (d == x.dim() - 1) return softmax_last(x, log);
  // Move the dimension last, compute, move it back (tensors are contiguous).
  AnyTensor moved = transpose(x, d, -1);
  return transpose(softmax_last(moved, log), d, -1);
}
}  // namespace detail

inline AnyTensor softmax(const AnyTensor& x, int dim = -1) { return detail::softmax_dim("softmax", x, dim, false); }
inline AnyTensor log_softmax(const AnyTensor& x, int dim = -1) {
  return detail::softmax_dim("log_softmax", x, dim, true);
}

}  // namespace ember::op

namespace ember {
template <Element T> Tensor<T> softmax(const Tensor<T>& x, int dim = -1) { return Tensor<T>(op::softmax(x, dim)); }
template <Element T> Tensor<T> log_softmax(const Tensor<T>& x, int dim = -1) { return Tensor<T>(op::log_softmax(x, dim)); }
}  // namespace ember
