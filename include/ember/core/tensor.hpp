#pragma once
// Tensor handles. `AnyTensor` is a cheap shared handle to an untyped
// TensorImpl (dtype, device, shape, storage, autograd state); copying a handle shares storage,
// `clone()` copies data. `Tensor<T>` is the same handle with its element type checked once, at
// construction, so typed code needs no runtime dtype checks.
//
// Core's tensors and the autograd tape are one layer in fact: a handle carries its node
// (TensorImpl::grad_fn) and its methods record on the tape (clone, to, reshape, slice) or run
// backward, while the tape's nodes and the engine hold and return complete handles. So this
// header defines the handles, then includes the tape (autograd/node.hpp) and the engine
// (autograd/engine.hpp), then defines the handle methods that use them. Including any of the
// three gives all three. Nothing here includes a layer above (ops, nn, ...).
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "ember/autograd/grad_mode.hpp"
#include "ember/core/random.hpp"
#include "ember/core/tensor_impl.hpp"
#include "ember/core/trace.hpp"  // the op hook of clone, to and copy_

namespace ember {

template <Element T>
class Tensor;

class AnyTensor {
 public:
  AnyTensor() = default;
  explicit AnyTensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // An uninitialised tensor of the given shape, dtype and device. `op` names the caller in the
  // error when the element count overflows (ShapeError) or the byte count cannot be allocated
  // anywhere (OutOfMemory).
  static AnyTensor empty(const Shape& shape, DType dtype, Device device = Device::cpu(), const char* op = "empty") {
    const size_t bytes = checked::nbytes(shape.checked_numel(op), dtype_size(dtype), op);
    auto impl = std::make_shared<TensorImpl>();
    impl->dtype = dtype;
    impl->device = device;
    impl->shape = shape;
    impl->storage = std::make_shared<Storage>(device, bytes);
    return AnyTensor(std::move(impl));
  }
  // An uninitialised tensor whose memory comes from `allocate(bytes)` instead of the device's
  // allocator (pinned host memory, a buffer allocated in a copy stream's order) and goes back
  // through `release(p, bytes)` when its storage dies. Nothing is allocated for 0 bytes.
  static AnyTensor empty_from(const Shape& shape, DType dtype, Device device,
                              const std::function<void*(size_t)>& allocate,
                              const std::function<void(void*, size_t)>& release, const char* op = "empty") {
    const size_t bytes = checked::nbytes(shape.checked_numel(op), dtype_size(dtype), op);
    auto impl = std::make_shared<TensorImpl>();
    impl->dtype = dtype;
    impl->device = device;
    impl->shape = shape;
    void* p = bytes > 0 ? allocate(bytes) : nullptr;
    try {
      impl->storage = std::make_shared<Storage>(device, p, bytes, release);
    } catch (...) {  // the storage could not be made: nothing else owns p
      if (p != nullptr) release(p, bytes);
      throw;
    }
    return AnyTensor(std::move(impl));
  }
  static AnyTensor full(const Shape& shape, double value, DType dtype, Device device = Device::cpu(),
                        const char* op = "full") {
    AnyTensor t = empty(shape, dtype, device, op);
    if (t.numel() > 0) backend_for(device).fill(dtype, t.data_ptr(), t.numel(), value);
    return t;
  }
  static AnyTensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu()) {
    return full(shape, 0.0, dtype, device, "zeros");
  }

  bool defined() const { return impl_ != nullptr; }
  explicit operator bool() const { return defined(); }
  DType dtype() const { return checked().dtype; }
  Device device() const { return checked().device; }
  const Shape& shape() const { return checked().shape; }
  int dim() const { return shape().dim(); }
  int64_t size(int d) const { return shape()[normalize_dim(d, dim(), "size")]; }
  int64_t numel() const { return checked().numel(); }
  size_t nbytes() const { return checked().nbytes(); }
  void* data_ptr() const { return checked().data(); }
  Backend& backend() const { return backend_for(device()); }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const AnyTensor& o) const { return impl_ == o.impl_; }
  // A short description for error messages: "float32[2, 3] on cuda:0".
  std::string desc() const {
    if (!defined()) return "undefined tensor";
    return std::string(dtype_name(dtype())) + shape().str() + " on " + device().str();
  }

  // ---- autograd state ----
  bool requires_grad() const { return checked().requires_grad || checked().grad_fn != nullptr; }
  bool is_leaf() const { return checked().grad_fn == nullptr; }
  // Marks a leaf as a parameter-like tensor whose gradient backward() accumulates.
  AnyTensor& set_requires_grad(bool on = true) {
    EMBER_CHECK(is_leaf(), AutogradError,
                "set_requires_grad: only leaf tensors can be marked; this one is the output of ",
                grad_fn_name());
    EMBER_CHECK(!on || is_floating(dtype()), DTypeError,
                "set_requires_grad: only floating-point tensors can require grad, got ", desc());
    checked().requires_grad = on;
    return *this;
  }
  AnyTensor grad() const { return AnyTensor(checked().grad); }
  void set_grad(const AnyTensor& g) { checked().grad = g.impl_; }
  // Drops the accumulated gradient (the next backward allocates a fresh one).
  void zero_grad() { checked().grad.reset(); }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return checked().grad_fn; }
  std::string grad_fn_name() const;
  // Registers a callback run right after backward has accumulated this leaf's gradient.
  void register_grad_ready_hook(std::function<void(const AnyTensor&)> hook) {
    EMBER_CHECK(is_leaf() && requires_grad(), AutogradError,
                "register_grad_ready_hook: the tensor must be a leaf that requires grad (", desc(), ")");
    checked().grad_ready_hooks.push_back(std::move(hook));
  }
  // Where the next backward puts this leaf's gradient while it has none (see
  // TensorImpl::grad_destination); an empty function restores fresh tensors.
  void set_grad_destination(std::function<AnyTensor()> destination) {
    EMBER_CHECK(is_leaf() && requires_grad(), AutogradError,
                "set_grad_destination: the tensor must be a leaf that requires grad (", desc(), ")");
    checked().grad_destination = std::move(destination);
  }
  // Backward from a scalar (gradient 1), or from any tensor with an explicit gradient.
  void backward(bool retain_graph = false) const;
  void backward(const AnyTensor& gradient, bool retain_graph = false) const;

  // ---- conversions and views ----
  // A new handle on the same storage, cut from the graph.
  AnyTensor detach() const {
    auto impl = std::make_shared<TensorImpl>();
    impl->dtype = dtype();
    impl->device = device();
    impl->shape = shape();
    impl->storage = checked().storage;
    impl->offset = checked().offset;
    return AnyTensor(std::move(impl));
  }
  AnyTensor clone() const;                 // differentiable copy
  AnyTensor to(Device d) const;            // differentiable; shares nothing
  AnyTensor to(DType t) const;             // differentiable cast (returns *this when t == dtype())
  AnyTensor reshape(const Shape& s) const; // a view; one dimension may be -1 via reshape({..})
  AnyTensor reshape(std::initializer_list<int64_t> dims) const;
  AnyTensor slice(int64_t begin, int64_t end) const;  // leading-dimension view [begin, end)
  AnyTensor select(int64_t i) const;                  // leading-dimension view, dimension dropped
  // Value of a one-element tensor, converted to double.
  double item_double() const;
  // All values converted to double, in row-major order (copies to the host).
  std::vector<double> to_double_vector() const;
  // Copies this tensor's values into `dst` (same shape and dtype; any devices); not recorded.
  void copy_(const AnyTensor& src);

 protected:
  TensorImpl& checked() const {
    EMBER_CHECK(impl_ != nullptr, ValueError, "operation on an undefined tensor");
    return *impl_;
  }
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const AnyTensor& t);

template <Element T>
class Tensor : public AnyTensor {
 public:
  using value_type = T;
  Tensor() = default;
  // Checks the dtype: converting an AnyTensor of another dtype is a DTypeError.
  explicit Tensor(AnyTensor t) : AnyTensor(std::move(t)) {
    EMBER_CHECK(!defined() || dtype() == dtype_of<T>, DTypeError, "Tensor<", dtype_name(dtype_of<T>),
                ">: cannot hold a ", desc());
  }

  // ---- factories ----
  static Tensor empty(const Shape& s, Device d = Device::cpu()) { return Tensor(AnyTensor::empty(s, dtype_of<T>, d)); }
  static Tensor zeros(const Shape& s, Device d = Device::cpu()) { return Tensor(AnyTensor::full(s, 0.0, dtype_of<T>, d, "zeros")); }
  static Tensor ones(const Shape& s, Device d = Device::cpu()) { return Tensor(AnyTensor::full(s, 1.0, dtype_of<T>, d, "ones")); }
  static Tensor full(const Shape& s, double value, Device d = Device::cpu()) {
    return Tensor(AnyTensor::full(s, value, dtype_of<T>, d));
  }
  template <class V>
    requires std::is_same_v<V, T> && (!std::is_same_v<V, double>)
  static Tensor full(const Shape& s, V value, Device d = Device::cpu()) {
    return full(s, static_cast<double>(static_cast<compute_t<T>>(value)), d);
  }
  // 0, step, 2*step, ... up to (not including) `end`, starting at `start`.
  static Tensor arange(double start, double end, double step = 1.0, Device d = Device::cpu()) {
    EMBER_CHECK(step != 0.0, ValueError, "arange: step must be non-zero");
    EMBER_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step), ValueError,
                "arange: unsupported range ", start, " -> ", end, " with step ", step, " (bounds must be finite)");
    double count = std::ceil((end - start) / step);
    // A count beyond int64 (arange(0, 1e30)) would convert to garbage: refuse it. 2^63 exactly is
    // representable as a double and already too large.
    EMBER_CHECK(!(count >= 9223372036854775808.0), ShapeError, "arange: ", start, " -> ", end, " with step ", step,
                " has ", count, " elements, more than int64 can count");
    int64_t n = count > 0 ? static_cast<int64_t>(count) : 0;
    Tensor t = Tensor(AnyTensor::empty({n}, dtype_of<T>, d, "arange"));
    if (n > 0) backend_for(d).arange(dtype_of<T>, t.data_ptr(), n, start, step);
    return t;
  }
  static Tensor arange(double end, Device d = Device::cpu()) { return arange(0.0, end, 1.0, d); }
  // Uniform in [lo, hi) and normal(mean, std), from the default generator (or an explicit one).
  static Tensor rand(const Shape& s, Device d = Device::cpu(), double lo = 0.0, double hi = 1.0,
                     Generator& gen = default_generator()) {
    static_assert(std::is_floating_point_v<compute_t<T>>, "rand: floating-point types only");
    EMBER_CHECK(lo <= hi, ValueError, "rand: the range [lo, hi) must have lo <= hi, got lo ", lo, " and hi ", hi,
                " (as torch.Tensor.uniform_)");
    Tensor t = Tensor(AnyTensor::empty(s, dtype_of<T>, d, "rand"));
    const GeneratorState at = gen.draw(t.numel());  // seed and offset in one piece (thread-safe)
    if (t.numel() > 0) backend_for(d).random_uniform(dtype_of<T>, t.data_ptr(), t.numel(), at.seed, at.offset, lo, hi);
    return t;
  }
  static Tensor randn(const Shape& s, Device d = Device::cpu(), double mean = 0.0, double stddev = 1.0,
                      Generator& gen = default_generator()) {
    static_assert(std::is_floating_point_v<compute_t<T>>, "randn: floating-point types only");
    EMBER_CHECK(stddev >= 0.0, ValueError, "randn: std must be non-negative, got std ", stddev, " (mean ", mean,
                "), as torch.normal");
    Tensor t = Tensor(AnyTensor::empty(s, dtype_of<T>, d, "randn"));
    const GeneratorState at = gen.draw(t.numel());  // seed and offset in one piece (thread-safe)
    if (t.numel() > 0) backend_for(d).random_normal(dtype_of<T>, t.data_ptr(), t.numel(), at.seed, at.offset, mean, stddev);
    return t;
  }
  // Copies values from host memory.
  static Tensor from_blob(const T* host, const Shape& s, Device d = Device::cpu()) {
    Tensor t = Tensor(AnyTensor::empty(s, dtype_of<T>, d, "from_blob"));
    if (t.numel() > 0) backend_for(d).copy_from_host(t.data_ptr(), host, t.nbytes());
    return t;
  }
  static Tensor from_vector(const std::vector<T>& v, const Shape& s, Device d = Device::cpu()) {
    EMBER_CHECK(static_cast<int64_t>(v.size()) == s.checked_numel("from_vector"), ShapeError, "from_vector: ", v.size(),
                " values do not fill shape ", s.str());
    return from_blob(v.data(), s, d);
  }
  static Tensor from_vector(const std::vector<T>& v, Device d = Device::cpu()) {
    return from_blob(v.data(), Shape{static_cast<int64_t>(v.size())}, d);
  }
  static Tensor scalar(T v, Device d = Device::cpu()) { return from_blob(&v, Shape{}, d); }

  // ---- typed access ----
  // Host pointer to the elements; CPU tensors only.
  T* data() const {
    EMBER_CHECK(device().is_cpu(), DeviceError, "data(): elements of ", desc(),
                " are not host memory; use to(Device::cpu()) or to_vector()");
    return static_cast<T*>(data_ptr());
  }
  T item() const {
    EMBER_CHECK(numel() == 1, ShapeError, "item(): needs a one-element tensor, got ", desc());
    T v;
    backend().copy_to_host(&v, data_ptr(), sizeof(T));
    return v;
  }
  std::vector<T> to_vector() const {
    std::vector<T> v(static_cast<size_t>(numel()));
    if (!v.empty()) backend().copy_to_host(v.data(), data_ptr(), nbytes());
    return v;
  }

  // ---- typed versions of the handle methods ----
  Tensor detach() const { return Tensor(AnyTensor::detach()); }
  Tensor clone() const { return Tensor(AnyTensor::clone()); }
  Tensor to(Device d) const { return Tensor(AnyTensor::to(d)); }
  template <Element U>
  Tensor<U> to() const { return Tensor<U>(AnyTensor::to(dtype_of<U>)); }
  AnyTensor to(DType t) const { return AnyTensor::to(t); }  // runtime dtype: untyped result
  Tensor reshape(const Shape& s) const { return Tensor(AnyTensor::reshape(s)); }
  Tensor reshape(std::initializer_list<int64_t> dims) const { return Tensor(AnyTensor::reshape(dims)); }
  Tensor slice(int64_t begin, int64_t end) const { return Tensor(AnyTensor::slice(begin, end)); }
  Tensor select(int64_t i) const { return Tensor(AnyTensor::select(i)); }
  Tensor grad() const { return Tensor(AnyTensor::grad()); }
  Tensor& set_requires_grad(bool on = true) {
    AnyTensor::set_requires_grad(on);
    return *this;
  }
};

using FloatTensor = Tensor<float>;
using DoubleTensor = Tensor<double>;
using HalfTensor = Tensor<half>;
using BFloat16Tensor = Tensor<bfloat16>;
using IntTensor = Tensor<int32_t>;
using LongTensor = Tensor<int64_t>;
using ByteTensor = Tensor<uint8_t>;

}  // namespace ember

// The rest of the layer, which needs the complete handles above (see the comment at the top).
#include "ember/autograd/node.hpp"
#include "ember/autograd/engine.hpp"
#include "ember/core/detail/tensor_methods_impl.hpp"
