#pragma once
// Shape ops: permute / transpose (copies: tensors are contiguous), expand (broadcast_to),
// unsqueeze / squeeze / flatten (free views), concat / split / chunk.
#include <numeric>
#include <vector>

#include "ember/ops/detail/common.hpp"

namespace ember::op {

inline AnyTensor permute(const AnyTensor& x, const std::vector<int>& perm) {
  detail::OpScope op_scope("permute", x);
  detail::check_defined("permute", x);
  EMBER_CHECK(static_cast<int>(perm.size()) == x.dim(), ShapeError, "permute: ", perm.size(),
              " dimensions given for ", x.desc());
  std::vector<int> p(perm.size());
  std::vector<bool> seen(perm.size(), false);
  for (size_t i = 0; i < perm.size(); ++i) {
    p[i] = normalize_dim(perm[i], x.dim(), "permute");
    EMBER_CHECK(!seen[static_cast<size_t>(p[i])], ShapeError, "permute: dimension ", perm[i], " repeated for ",
                x.desc());
    seen[static_cast<size_t>(p[i])] = true;
  }
  const Shape& xs = x.shape();
  auto xst = xs.strides();
  StridedArgs st;
  st.ndim = x.dim();
  std::vector<int64_t> os(perm.size());
  for (int i = 0; i < x.dim(); ++i) {
    os[static_cast<size_t>(i)] = xs[p[static_cast<size_t>(i)]];
    st.shape[i] = os[static_cast<size_t>(i)];
    st.stride_a[i] = xst[static_cast<size_t>(p[static_cast<size_t>(i)])];
  }
  AnyTensor out = AnyTensor::empty(Shape(os), x.dtype(), x.device());
  if (out.numel() > 0) x.backend().strided_copy(x.dtype(), x.data_ptr(), out.data_ptr(), st);
  if (autograd::any_requires_grad({x})) {
    std::vector<int> inv(p.size());
    for (size_t i = 0; i < p.size(); ++i) inv[static_cast<size_t>(p[i])] = static_cast<int>(i);
    autograd::record("permute", {x}, {out},
                     [inv](const std::vector<AnyTensor>& g) { return std::vector<AnyTensor>{permute(g[0], inv)}; });
  }
  return out;
}

inline AnyTensor transpose(const AnyTensor& x, int d0 = -2, int d1 = -1) {
  detail::check_defined("transpose", x);
  EMBER_CHECK(x.dim() >= 2, ShapeError, "transpose: needs at least 2 dimensions, got ",
              x.desc());
  int a = normalize_dim(d0, x.dim(), "transpose"), b = normalize_dim(d1, x.dim(), "transpose");
  std::vector<int> perm(static_cast<size_t>(x.dim()));
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[static_cast<size_t>(a)], perm[static_cast<size_t>(b)]);
  return permute(x, perm);
}

// x broadcast (materialised) to `shape`; the gradient is summed back.
inline AnyTensor expand(const AnyTensor& x, const Shape& shape) {
  detail::OpScope op_scope("expand", x);
  detail::check_defined("expand", x);
  Shape b = detail::broadcast_shapes("expand", x.shape(), shape);
  EMBER_CHECK(b == shape, ShapeError, "expand: ", x.desc(), " cannot be expanded to ", shape.str());
  AnyTensor out = detail::expand_raw(x, shape);
  if (out.same(x)) return x;
  Shape xs = x.shape();
  autograd::record("expand", {x}, {out}, [xs](const std::vector<AnyTensor>& g) {
    return std::vector<AnyTensor>{detail::sum_to_raw(g[0], xs)};
  });
  return out;
}

inline AnyTensor unsqueeze(const AnyTensor& x, int d) {
  detail::check_defined("unsqueeze", x);
  int n = normalize_dim(d, x.dim() + 1, "unsqueeze");
  std::vector<int64_t> s = x.shape().vec();
  s.insert(s.begin() + n, 1);
  return x.reshape(Shape(s));
}

inline AnyTensor squeeze(const AnyTensor& x, int d) {
  detail::check_defined("squeeze", x);
  if (x.dim() == 0) {  // torch.squeeze of a 0-d tensor takes dimension 0 or -1 and returns it
    normalize_dim(d, 1, "squeeze");
    return x;
  }
  int n = normalize_dim(d, x.dim(), "squeeze");
  if (x.shape()[n] != 1) return x;
  std::vector<int64_t> s = x.shape().vec();
  s.erase(s.begin() + n);
  return x.reshape(Shape(s));
}

// Flattens dimensions [start, end] into one.
inline AnyTensor flatten(const AnyTensor& x, int start = 0, int end = -1) {
  detail::check_defined("flatten", x);
  if (x.dim() == 0) return x.reshape(Shape{1});
  int a = normalize_dim(start, x.dim(), "flatten"), b = normalize_dim(end, x.dim(), "flatten");
  EMBER_CHECK(a <= b, ShapeError, "flatten: start ", start, " after end ", end, " for ", x.desc());
  std::vector<int64_t> s;
  for (int i = 0; i < a; ++i) s.push_back(x.shape()[i]);
  int64_t m = 1;
  for (int i = a; i <= b; ++i) m *= x.shape()[i];
  s.push_back(m);
  for (int i = b + 1; i < x.dim(); ++i) s.push_back(x.shape()[i]);
  return x.reshape(Shape(s));
}

inline std::vector<AnyTensor> split(const AnyTensor& x, const std::vector<int64_t>& sizes, int dim = 0);

inline AnyTensor concat(const std::vector<AnyTensor>& xs, int dim = 0) {
  detail::OpScopeList op_scope("concat", xs);
  EMBER_CHECK(!xs.empty(), ValueError, "concat: no tensors given");
  for (const auto& t : xs) detail::check_defined("concat", t);
  const AnyTensor& first = xs[0];
  int d = normalize_dim(dim, first.dim(), "concat");
  int64_t total = 0;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < xs.size(); ++i) {
    const AnyTensor& t = xs[i];
    detail::check_same_device("concat", first, t);
    detail::check_same_dtype("concat", first, t);
    bool ok = t.dim() == first.dim();
    for (int k = 0; ok && k < t.dim(); ++k) ok = (k == d) || t.shape()[k] == first.shape()[k];
    EMBER_CHECK(ok, ShapeError, "concat: tensor ", i, " ", t.desc(), " does not match tensor 0 ", first.desc(),
                " outside dimension ", d);
    sizes.push_back(t.shape()[d]);
    total = checked::add(total, t.shape()[d], "concat", "the concatenated dimension");
  }
  Shape os = first.shape();
  os[d] = total;
  AnyTensor out = AnyTensor::empty(os, first.dtype(), first.device());
  int64_t outer, inner;
  detail::outer_inner(os, d, outer, inner);
  const size_t es = dtype_size(first.dtype());
  int64_t at = 0;
  for (const AnyTensor& t : xs) {
    const int64_t n = t.shape()[d];
    if (n > 0 && outer > 0 && inner > 0)
      out.backend().copy_2d(static_cast<char*>(out.data_ptr()) + static_cast<size_t>(at * inner) * es,
                            static_cast<size_t>(total * inner) * es, t.data_ptr(), static_cast<size_t>(n * inner) * es,
                            static_cast<size_t>(n * inner) * es, static_cast<size_t>(outer));
    at += n;
  }
  autograd::record("concat", xs, {out}, [sizes, d](const std::vector<AnyTensor>& g) {
    return split(g[0], sizes, d);
  });
  return out;
}

inline std::vector<AnyTensor> split(const AnyTensor& x, const std::vector<int64_t>& sizes, int dim) {
  detail::OpScope op_scope("split", x);
  detail::check_defined("split", x);
  int d = normalize_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    EMBER_CHECK(s >= 0, ShapeError, "split: negative size ", s, " for ", x.desc());
    // Checked: sizes {INT64_MAX, INT64_MAX, 5} would wrap to a total that matches the dimension.
    total = checked::add(total, s, "split", "the sum of the sizes");
  }
  EMBER_CHECK(total == x.shape()[d], ShapeError, "split: sizes add up to ", total, " but dimension ", d, " of ",
              x.desc(), " is ", x.shape()[d]);
  int64_t outer, inner;
  detail::outer_inner(x.shape(), d, outer, inner);
  const size_t es = dtype_size(x.dtype());
  std::vector<AnyTensor> outs;
  int64_t at = 0;
  for (int64_t n : sizes) {
    Shape s = x.shape();
    s[d] = n;
    AnyTensor o = AnyTensor::empty(s, x.dtype(), x.device());
    if (n > 0 && outer > 0 && inner > 0)
      x.backend().copy_2d(o.data_ptr(), static_cast<size_t>(n * inner) * es,
                          static_cast<const char*>(x.data_ptr()) + static_cast<size_t>(at * inner) * es,
                          static_cast<size_t>(total * inner) * es, static_cast<size_t>(n * inner) * es,
                          static_cast<size_t>(outer));
    outs.push_back(o);
    at += n;
  }
  autograd::record("split", {x}, outs, [d](const std::vector<AnyTensor>& g) {
    return std::vector<AnyTensor>{concat(g, d)};
  });
  return outs;
}

// `chunks` nearly equal pieces along dim (the last may be smaller), like torch.chunk.
inline std::vector<AnyTensor> chunk(const AnyTensor& x, int64_t chunks, int dim = 0) {
  detail::check_defined("chunk", x);
  EMBER_CHECK(chunks > 0, ValueError, "chunk: chunks must be positive, got ", chunks);
  int d = normalize_dim(dim, x.dim(), "chunk");
  // ceil(n / chunks) without n + chunks - 1 (which overflows for chunks near INT64_MAX and made
  // the loop below run forever).
  int64_t n = x.shape()[d], step = n / chunks + (n % chunks != 0 ? 1 : 0);
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < n; at += step) sizes.push_back(std::min(step, n - at));
  if (sizes.empty()) sizes.push_back(0);
  return split(x, sizes, d);
}

}  // namespace ember::op

namespace ember {

template <Element T> Tensor<T> permute(const Tensor<T>& x, const std::vector<int>& perm) { return Tensor<T>(op::permute(x, perm)); }
template <Element T> Tensor<T> transpose(const Tensor<T>& x, int d0 = -2, int d1 = -1) { return Tensor<T>(op::transpose(x, d0, d1)); }
template <Element T> Tensor<T> expand(const Tensor<T>& x, const Shape& s) { return Tensor<T>(op::expand(x, s)); }
template <Element T> Tensor<T> unsqueeze(const Tensor<T>& x, int d) { return Tensor<T>(op::unsqueeze(x, d)); }
template <Element T> Tensor<T> squeeze(const Tensor<T>& x, int d) { return Tensor<T>(op::squeeze(x, d)); }
template <Element T> Tensor<T> flatten(const Tensor<T>& x, int start = 0, int end = -1) { return Tensor<T>(op::flatten(x, start, end)); }

namespace detail {
template <Element T>
std::vector<Tensor<T>> typed_list(const std::vector<AnyTensor>& v) {
  std::vector<Tensor<T>> out;
  out.reserve(v.size());
  for (const auto& t : v) out.emplace_back(t);
  return out;
}
}  // namespace detail

template <Element T> Tensor<T> concat(const std::vector<Tensor<T>>& xs, int dim = 0) {
  return Tensor<T>(op::concat(std::vector<AnyTensor>(xs.begin(), xs.end()), dim));
}
template <Element T> std::vector<Tensor<T>> split(const Tensor<T>& x, const std::vector<int64_t>& sizes, int dim = 0) {
  return detail::typed_list<T>(op::split(x, sizes, dim));
}
template <Element T> std::vector<Tensor<T>> chunk(const Tensor<T>& x, int64_t chunks, int dim = 0) {
  return detail::typed_list<T>(op::chunk(x, chunks, dim));
}

}  // namespace ember
