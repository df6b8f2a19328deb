#pragma once
// Definitions of the AnyTensor methods that record on the autograd tape. Included by
// core/tensor.hpp once the tape is defined; include <ember/core/tensor.hpp> rather than this file.
#include <iomanip>

namespace ember {

namespace detail {
// Copies src's values into dst: same numel, same dtype, any two devices.
inline void copy_values(const AnyTensor& dst, const AnyTensor& src) {
  size_t bytes = src.nbytes();
  if (bytes == 0) return;
  Device sd = src.device(), dd = dst.device();
  if (sd == dd) {
    dst.backend().copy(dst.data_ptr(), src.data_ptr(), bytes);
  } else if (sd.is_cpu()) {
    dst.backend().copy_from_host(dst.data_ptr(), src.data_ptr(), bytes);
  } else if (dd.is_cpu()) {
    src.backend().copy_to_host(dst.data_ptr(), src.data_ptr(), bytes);
  } else {  // between two GPUs: through the host (peer copies are the data-parallel layer's business)
    std::vector<char> staging(bytes);
    src.backend().copy_to_host(staging.data(), src.data_ptr(), bytes);
    dst.backend().copy_from_host(dst.data_ptr(), staging.data(), bytes);
  }
}

// The methods below name themselves for an undefined tensor (the accessors' own error cannot say
// which call it was).
inline void check_defined_for(const AnyTensor& t, const char* method) {
  EMBER_CHECK(t.defined(), ValueError, method, ": called on an undefined tensor");
}

inline AnyTensor make_view(const AnyTensor& base, const Shape& shape, int64_t extra_offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->dtype = base.dtype();
  impl->device = base.device();
  impl->shape = shape;
  impl->storage = base.impl()->storage;
  impl->offset = base.impl()->offset + extra_offset;
  return AnyTensor(std::move(impl));
}
}  // namespace detail

inline AnyTensor AnyTensor::clone() const {
  detail::check_defined_for(*this, "clone");
  trace::OpCall op_call("clone", *this);
  AnyTensor out = AnyTensor::empty(shape(), dtype(), device());
  detail::copy_values(out, *this);
  autograd::record("CloneBackward", {*this}, {out},
                   [](const std::vector<AnyTensor>& g) { return std::vector<AnyTensor>{g[0]}; });
  return out;
}

inline AnyTensor AnyTensor::to(Device d) const {
  detail::check_defined_for(*this, "to(device)");
  if (d == device()) return *this;
  backend_for(d);  // fails with a clear DeviceError when d does not exist
  trace::OpCall op_call("to_device", *this);  // the input's device: the source of the copy
  AnyTensor out = AnyTensor::empty(shape(), dtype(), d);
  detail::copy_values(out, *this);
  Device from = device();
  autograd::record("ToDeviceBackward", {*this}, {out},
                   [from](const std::vector<AnyTensor>& g) { return std::vector<AnyTensor>{g[0].to(from)}; });
  return out;
}

inline AnyTensor AnyTensor::to(DType t) const {
  detail::check_defined_for(*this, "to(dtype)");
  if (t == dtype()) return *this;
  trace::OpCall op_call("to_dtype", *this);
  AnyTensor out = AnyTensor::empty(shape(), t, device());
  if (numel() > 0) backend().cast(dtype(), data_ptr(), t, out.data_ptr(), numel());
  if (is_floating(t) && is_floating(dtype())) {
    DType from = dtype();
    autograd::record("ToDTypeBackward", {*this}, {out},
                     [from](const std::vector<AnyTensor>& g) { return std::vector<AnyTensor>{g[0].to(from)}; });
  }
  return out;
}

inline AnyTensor AnyTensor::reshape(const Shape& s) const {
  detail::check_defined_for(*this, "reshape");
  EMBER_CHECK(s.checked_numel("reshape") == numel(), ShapeError, "reshape: cannot view ", desc(), " as shape ",
              s.str(), " (", s.numel(), " elements)");
  AnyTensor out = detail::make_view(*this, s, 0);
  Shape from = shape();
  autograd::record("ReshapeBackward", {*this}, {out},
                   [from](const std::vector<AnyTensor>& g) { return std::vector<AnyTensor>{g[0].reshape(from)}; });
  return out;
}

inline AnyTensor AnyTensor::reshape(std::initializer_list<int64_t> dims) const {
  detail::check_defined_for(*this, "reshape");
  int infer = -1;
  int64_t known = 1;
  std::vector<int64_t> d(dims);
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] == -1) {
      EMBER_CHECK(infer < 0, ShapeError, "reshape: more than one -1 in the new shape for ", desc());
      infer = static_cast<int>(i);
    } else {
      EMBER_CHECK(d[i] >= 0, ShapeError, "reshape: negative dimension ", d[i], " for ", desc());
      known = checked::mul(known, d[i], "reshape", "the product of the new shape's sizes");
    }
  }
  if (infer >= 0) {
    EMBER_CHECK(known > 0 && numel() % known == 0, ShapeError, "reshape: cannot infer -1 reshaping ", desc());
    d[static_cast<size_t>(infer)] = numel() / known;
  }
  return reshape(Shape(d));
}

inline AnyTensor AnyTensor::slice(int64_t begin, int64_t end) const {
  detail::check_defined_for(*this, "slice");
  EMBER_CHECK(dim() >= 1, ShapeError, "slice: needs at least one dimension, got ", desc());
  int64_t n = shape()[0];
  EMBER_CHECK(0 <= begin && begin <= end && end <= n, IndexError, "slice: range [", begin, ", ", end,
              ") out of bounds for dimension 0 of ", desc());
  Shape s = shape();
  s[0] = end - begin;
  int64_t row = n > 0 ? numel() / n : 0;
  AnyTensor out = detail::make_view(*this, s, begin * row);
  Shape full_shape = shape();
  DType dt = dtype();
  Device dev = device();
  autograd::record("SliceBackward", {*this}, {out},
                   [full_shape, dt, dev, begin, row](const std::vector<AnyTensor>& g) {
                     AnyTensor gx = AnyTensor::zeros(full_shape, dt, dev);
                     if (g[0].numel() > 0)
                       gx.backend().copy(static_cast<char*>(gx.data_ptr()) + begin * row * static_cast<int64_t>(dtype_size(dt)),
                                         g[0].data_ptr(), g[0].nbytes());
                     return std::vector<AnyTensor>{gx};
                   });
  return out;
}

inline AnyTensor AnyTensor::select(int64_t i) const {
  detail::check_defined_for(*this, "select");
  EMBER_CHECK(dim() >= 1, ShapeError, "select: needs at least one dimension, got ", desc());
  int64_t n = shape()[0];
  const int64_t given = i;
  if (i < 0) i += n;
  EMBER_CHECK(i >= 0 && i < n, IndexError, "select: index ", given, " out of range for dimension 0 of ", desc());
  std::vector<int64_t> rest(shape().begin() + 1, shape().end());
  return slice(i, i + 1).reshape(Shape(rest));
}

inline std::vector<double> AnyTensor::to_double_vector() const {
  AnyTensor host = detach().to(Device::cpu()).to(DType::Float64);
  std::vector<double> v(static_cast<size_t>(numel()));
  if (!v.empty()) std::memcpy(v.data(), host.data_ptr(), v.size() * sizeof(double));
  return v;
}

inline double AnyTensor::item_double() const {
  EMBER_CHECK(numel() == 1, ShapeError, "item(): needs a one-element tensor, got ", desc());
  return to_double_vector()[0];
}

inline void AnyTensor::copy_(const AnyTensor& src) {
  detail::check_defined_for(*this, "copy_ (destination)");
  detail::check_defined_for(src, "copy_ (source)");
  EMBER_CHECK(src.shape() == shape(), ShapeError, "copy_: source ", src.desc(), " does not match destination ",
              desc());
  trace::OpCall op_call("copy_", src);  // a cast of src, when dtypes differ, nests as to_dtype
  AnyTensor s = src.dtype() == dtype() ? src : src.detach().to(dtype());
  detail::copy_values(*this, s);
}

inline std::ostream& operator<<(std::ostream& os, const AnyTensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  std::vector<double> v = t.to_double_vector();
  const Shape& s = t.shape();
  const bool integral = !is_floating(t.dtype());
  const int64_t kEdge = 3;            // elements shown at each end of a long dimension
  const bool summarise = t.numel() > 1000;
  auto strides = s.strides();
  std::ostringstream out;
  out << std::setprecision(integral ? 0 : 4) << (integral ? std::fixed : std::defaultfloat);
  std::function<void(int, int64_t)> rec = [&](int d, int64_t base) {
    if (d == s.dim()) {
      out << v[static_cast<size_t>(base)];
      return;
    }
    out << "[";
    int64_t n = s[d];
    for (int64_t i = 0; i < n; ++i) {
      if (summarise && n > 2 * kEdge && i == kEdge) {
        out << "..., ";
        i = n - kEdge - 1;
        continue;
      }
      if (i) out << (d + 1 < s.dim() ? ",\n" + std::string(static_cast<size_t>(d + 8), ' ') : ", ");
      rec(d + 1, base + i * strides[static_cast<size_t>(d)]);
    }
    out << "]";
  };
  out << "tensor(";
  rec(0, 0);
  out << ", shape=" << s.str() << ", dtype=" << dtype_name(t.dtype()) << ", device=" << t.device().str();
  if (t.grad_fn()) out << ", grad_fn=" << t.grad_fn_name();
  out << ")";
  return os << out.str();
}

}  // namespace ember
