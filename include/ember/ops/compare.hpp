#pragma once
// Comparisons (eq, ne, lt, le, gt, ge; broadcasting; uint8 results, no gradient) and
// where(cond, a, b), which is differentiable in a and b.
#include <cmath>
#include <limits>
#include <type_traits>

#include "ember/ops/detail/common.hpp"

namespace ember::op {

inline AnyTensor compare(CompareOp cop, const AnyTensor& a, const AnyTensor& b) {
  static const char* names[] = {"eq", "ne", "lt", "le", "gt", "ge"};
  const char* name = names[static_cast<int>(cop)];
  detail::OpScope op_scope(name, a, b);
  detail::check_operands(name, a, b);
  Shape os = detail::broadcast_shapes(name, a.shape(), b.shape());
  AnyTensor out = AnyTensor::empty(os, DType::UInt8, a.device());
  Shape as = a.shape(), bs = b.shape();
  if (out.numel() > 0)
    a.backend().compare(cop, a.dtype(), a.data_ptr(), b.data_ptr(), static_cast<uint8_t*>(out.data_ptr()),
                        detail::strided_args(os, &as, &bs));
  return out;
}
inline AnyTensor compare(CompareOp cop, const AnyTensor& a, double s) {
  // An integer tensor against a scalar its dtype cannot hold (0.5, -1 for uint8) compares values in
  // double, as PyTorch does: converting the scalar would truncate or wrap it (int 0 < 0.5 is true).
  const bool exact = dispatch_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>)
      return s == std::trunc(s) && s >= static_cast<double>(std::numeric_limits<T>::min()) &&
             s <= static_cast<double>(std::numeric_limits<T>::max());
    else
      return true;
  });
  if (!exact)
    return compare(cop, a.detach().to(DType::Float64), AnyTensor::full(Shape{}, s, DType::Float64, a.device()));
  return compare(cop, a, AnyTensor::full(Shape{}, s, a.dtype(), a.device()));
}

inline AnyTensor eq(const AnyTensor& a, const AnyTensor& b) { return compare(CompareOp::Eq, a, b); }
inline AnyTensor ne(const AnyTensor& a, const AnyTensor& b) { return compare(CompareOp::Ne, a, b); }
inline AnyTensor lt(const AnyTensor& a, const AnyTensor& b) { return compare(CompareOp::Lt, a, b); }
inline AnyTensor le(const AnyTensor& a, const AnyTensor& b) { return compare(CompareOp::Le, a, b); }
inline AnyTensor gt(const AnyTensor& a, const AnyTensor& b) { return compare(CompareOp::Gt, a, b); }
inline AnyTensor ge(const AnyTensor& a, const AnyTensor& b) { return compare(CompareOp::Ge, a, b); }

// cond (uint8, broadcast) ? a : b; the gradient of each branch is masked and summed to its shape.
inline AnyTensor where(const AnyTensor& cond, const AnyTensor& a, const AnyTensor& b) {
  detail::OpScope op_scope("where", cond, a, b);
  detail::check_defined("where", cond, "condition");
  detail::check_defined("where", a, "first input");
  detail::check_defined("where", b, "second input");
  EMBER_CHECK(cond.dtype() == DType::UInt8, DTypeError, "where: the condition must be uint8 (a comparison result), got ",
              cond.desc());
  detail::check_same_device("where", cond, a);
  detail::check_same_device("where", a, b);
  detail::check_same_dtype("where", a, b);
  Shape os = detail::broadcast_shapes("where", detail::broadcast_shapes("where", a.shape(), b.shape()), cond.shape());
  AnyTensor out = AnyTensor::empty(os, a.dtype(), a.device());
  Shape as = a.shape(), bs = b.shape(), cs = cond.shape();
  if (out.numel() > 0)
    a.backend().where(a.dtype(), static_cast<const uint8_t*>(cond.data_ptr()), a.data_ptr(), b.data_ptr(),
                      out.data_ptr(), detail::strided_args(os, &as, &bs, &cs));
  if (autograd::any_requires_grad({a, b})) {
    const bool ga = a.requires_grad(), gb = b.requires_grad();
    AnyTensor sc = cond.detach();
    autograd::record("where", {a, b}, {out}, [sc, as, bs, cs, os, ga, gb](const std::vector<AnyTensor>& g) {
      const AnyTensor& gy = g[0];
      AnyTensor zero = AnyTensor::zeros(Shape{}, gy.dtype(), gy.device());
      Shape zs{};
      StridedArgs st = detail::strided_args(os, &os, &zs, &cs);
      AnyTensor da, db;
      if (ga) {
        da = AnyTensor::empty(os, gy.dtype(), gy.device());
        gy.backend().where(gy.dtype(), static_cast<const uint8_t*>(sc.data_ptr()), gy.data_ptr(), zero.data_ptr(),
                           da.data_ptr(), st);
        da = detail::sum_to_raw(da, as);
      }
      if (gb) {
        StridedArgs sb = detail::strided_args(os, &zs, &os, &cs);
        db = AnyTensor::empty(os, gy.dtype(), gy.device());
        gy.backend().where(gy.dtype(), static_cast<const uint8_t*>(sc.data_ptr()), zero.data_ptr(), gy.data_ptr(),
                           db.data_ptr(), sb);
        db = detail::sum_to_raw(db, bs);
      }
      return std::vector<AnyTensor>{da, db};
    });
  }
  return out;
}

}  // namespace ember::op

namespace ember {
template <Element T> Tensor<uint8_t> eq(const Tensor<T>& a, const Tensor<T>& b) { return Tensor<uint8_t>(op::eq(a, b)); }
template <Element T> Tensor<uint8_t> ne(const Tensor<T>& a, const Tensor<T>& b) { return Tensor<uint8_t>(op::ne(a, b)); }
template <Element T> Tensor<uint8_t> lt(const Tensor<T>& a, const Tensor<T>& b) { return Tensor<uint8_t>(op::lt(a, b)); }
template <Element T> Tensor<uint8_t> le(const Tensor<T>& a, const Tensor<T>& b) { return Tensor<uint8_t>(op::le(a, b)); }
template <Element T> Tensor<uint8_t> gt(const Tensor<T>& a, const Tensor<T>& b) { return Tensor<uint8_t>(op::gt(a, b)); }
template <Element T> Tensor<uint8_t> ge(const Tensor<T>& a, const Tensor<T>& b) { return Tensor<uint8_t>(op::ge(a, b)); }
template <Element T> Tensor<uint8_t> operator==(const Tensor<T>& a, const Tensor<T>& b) { return eq(a, b); }
template <Element T> Tensor<uint8_t> operator!=(const Tensor<T>& a, const Tensor<T>& b) { return ne(a, b); }
template <Element T> Tensor<uint8_t> operator<(const Tensor<T>& a, const Tensor<T>& b) { return lt(a, b); }
template <Element T> Tensor<uint8_t> operator<=(const Tensor<T>& a, const Tensor<T>& b) { return le(a, b); }
template <Element T> Tensor<uint8_t> operator>(const Tensor<T>& a, const Tensor<T>& b) { return gt(a, b); }
template <Element T> Tensor<uint8_t> operator>=(const Tensor<T>& a, const Tensor<T>& b) { return ge(a, b); }
template <Element T> Tensor<T> where(const Tensor<uint8_t>& c, const Tensor<T>& a, const Tensor<T>& b) {
  return Tensor<T>(op::where(c, a, b));
}
}  // namespace ember
