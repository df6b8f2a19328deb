#pragma once
// Normalisation layers with PyTorch's parameter and buffer names, defaults and formulas, built on
// ember's ops (the fused op::layer_norm, op::rms_norm and op::batch_norm_train where they take the
// tensors, a composition of differentiable ops elsewhere):
//   nn::LayerNorm    weight (ones), bias (zeros) over the trailing normalized_shape
//   nn::BatchNorm1d  [N, C] or [N, C, L]
//   nn::BatchNorm2d  [N, C, H, W]
//     parameters weight (ones), bias (zeros); buffers running_mean (zeros), running_var (ones),
//     num_batches_tracked (int64) -- so state dicts move to and from PyTorch unchanged.
// Statistics are computed in fp32 for float16/bfloat16 inputs; the output has the input's type.
// Variances are biased (divide by n) when normalising; BatchNorm's running_var is updated with the
// unbiased batch variance (n / (n - 1)), as PyTorch does.
#include <optional>
#include <string>
#include <vector>

#include "ember/nn/init.hpp"
#include "ember/ops/norm.hpp"
#include "ember/nn/module.hpp"
#include "ember/ops/batch_norm.hpp"

namespace ember::nn {

namespace detail {
// "[2, -1]": a normalized_shape as written, for messages (Shape would refuse a negative size while
// the message is being built, and the error would name Shape instead of the layer).
inline std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// The checks of layer_norm and rms_norm (x defined, normalized_shape of at least one dimension,
// x ending in it); returns the number of elements each normalisation covers.
inline int64_t normalized_size(const char* op, const AnyTensor& x, const std::vector<int64_t>& normalized_shape) {
  op::detail::check_defined(op, x);
  const int k = static_cast<int>(normalized_shape.size());
  EMBER_CHECK(k >= 1, ValueError, op, ": normalized_shape must have at least one dimension");
  bool ok = x.dim() >= k;
  for (int i = 0; ok && i < k; ++i) ok = x.shape()[x.dim() - k + i] == normalized_shape[static_cast<size_t>(i)];
  EMBER_CHECK(ok, ShapeError, op, ": input ", x.desc(), " does not end in normalized_shape ",
              dims_str(normalized_shape));
  int64_t cols = 1;
  for (int64_t d : normalized_shape) cols *= d;
  return cols;
}

// The checks of LayerNorm's and RMSNorm's normalized_shape: at least one dimension, all positive.
inline void check_normalized_shape(const char* module, const std::vector<int64_t>& shape) {
  EMBER_CHECK(!shape.empty(), ValueError, module, ": normalized_shape must have at least one dimension");
  for (int64_t d : shape)
    EMBER_CHECK(d > 0, ValueError, module, ": normalized_shape ", dims_str(shape), " must be positive");
}

// What LayerNorm and RMSNorm share: the trailing normalized_shape they normalise over (checked),
// eps, and the learnable weight, ones over normalized_shape (undefined when not learnable).
template <class Derived>
class TrailingNorm : public ModuleBase<Derived> {
 public:
  const std::vector<int64_t>& normalized_shape() const { return shape_; }
  double eps() const { return eps_; }
  AnyTensor weight;

 protected:
  TrailingNorm(const char* module, std::vector<int64_t> normalized_shape, double eps, bool affine, DType dtype,
               Device device)
      : shape_(std::move(normalized_shape)), eps_(eps) {
    check_normalized_shape(module, shape_);
    if (affine) weight = this->register_parameter("weight", AnyTensor::full(Shape(shape_), 1.0, dtype, device));
  }

  std::vector<int64_t> shape_;
  double eps_;
};
}  // namespace detail

namespace functional {
// (x - mean) / sqrt(var + eps) over the trailing normalized_shape dimensions, then * weight + bias
// (each optional, of shape normalized_shape). Computed in compute_t<T>, returned as T.
template <Element T>
  requires std::is_floating_point_v<compute_t<T>>
Tensor<T> layer_norm(const Tensor<T>& x, const std::vector<int64_t>& normalized_shape, const AnyTensor& weight = {},
                     const AnyTensor& bias = {}, double eps = 1e-5) {
  using C = compute_t<T>;
  const int64_t cols = detail::normalized_size("layer_norm", x, normalized_shape);
  // The fused kernel (ops/norm.hpp) when the parameters have the input's dtype; otherwise (fp16
  // activations with fp32 parameters) the composite below, in the compute type.
  if ((!weight.defined() || weight.dtype() == x.dtype()) && (!bias.defined() || bias.dtype() == x.dtype()))
    return Tensor<T>(op::layer_norm(x, cols, weight, bias, eps));
  std::vector<int> dims;
  for (int i = x.dim() - static_cast<int>(normalized_shape.size()); i < x.dim(); ++i) dims.push_back(i);
  Tensor<C> xc = x.template to<C>();
  Tensor<C> mu = mean(xc, dims, true);
  Tensor<C> d = xc - mu;
  Tensor<C> var = mean(square(d), dims, true);
  Tensor<C> y = d * reciprocal(sqrt(var + eps));
  if (weight.defined()) y = y * param_as<C>(weight);
  if (bias.defined()) y = y + param_as<C>(bias);
  return y.template to<T>();
}

// x / sqrt(mean(x^2) + eps) over the trailing normalized_shape dimensions, then * weight (optional,
// of shape normalized_shape); torch.nn.functional.rms_norm. eps < 0 means the dtype's epsilon, as
// PyTorch's eps=None. Fused (ops/norm.hpp); the weight is used as the input's type.
template <Element T>
  requires std::is_floating_point_v<compute_t<T>>
Tensor<T> rms_norm(const Tensor<T>& x, const std::vector<int64_t>& normalized_shape, const AnyTensor& weight = {},
                   double eps = -1.0) {
    const int64_t cols = detail::normalized_size("rms_norm", x, normalized_shape);
    if (eps < 0)  // torch.finfo(dtype).eps
      eps = dtype_of<T> == DType::Float64   ? 2.220446049250313e-16
            : dtype_of<T> == DType::Float32 ? 1.1920928955078125e-07
            : dtype_of<T> == DType::Float16 ? 0.0009765625
                                            : 0.0078125;
    AnyTensor w = weight.defined() ? AnyTensor(param_as<T>(weight)) : AnyTensor();
    return Tensor<T>(op::rms_norm(x, cols, w, eps));
}
}  // namespace functional

struct LayerNormOptions {
  double eps = 1e-5;
  bool elementwise_affine = true;  // learnable weight (and bias, see below)
  bool bias = true;                // learnable bias (only with elementwise_affine)
  DType dtype = DType::Float32;
  Device device = Device::cpu();
};

class LayerNorm : public detail::TrailingNorm<LayerNorm> {
 public:
  explicit LayerNorm(std::vector<int64_t> normalized_shape, LayerNormOptions opt = {})
      : TrailingNorm("LayerNorm", std::move(normalized_shape), opt.eps, opt.elementwise_affine, opt.dtype,
                     opt.device) {
    if (opt.elementwise_affine && opt.bias)
      bias = register_parameter("bias", AnyTensor::zeros(Shape(shape_), opt.dtype, opt.device));
  }
  explicit LayerNorm(int64_t normalized_dim, LayerNormOptions opt = {})
      : LayerNorm(std::vector<int64_t>{normalized_dim}, opt) {}
  std::string type_name() const override { return "LayerNorm"; }

  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    return functional::layer_norm(x, shape_, weight, bias, eps_);
  }

  AnyTensor bias;  // undefined when not learnable
};

// torch.nn.RMSNorm: weight (ones) over the trailing normalized_shape; eps < 0 (the default) means
// the input dtype's epsilon, as PyTorch's eps=None.
struct RMSNormOptions {
  double eps = -1.0;
  bool elementwise_affine = true;
  DType dtype = DType::Float32;
  Device device = Device::cpu();
};

class RMSNorm : public detail::TrailingNorm<RMSNorm> {
 public:
  explicit RMSNorm(std::vector<int64_t> normalized_shape, RMSNormOptions opt = {})
      : TrailingNorm("RMSNorm", std::move(normalized_shape), opt.eps, opt.elementwise_affine, opt.dtype, opt.device) {}
  explicit RMSNorm(int64_t normalized_dim, RMSNormOptions opt = {}) : RMSNorm(std::vector<int64_t>{normalized_dim}, opt) {}
  std::string type_name() const override { return "RMSNorm"; }

  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    return functional::rms_norm(x, shape_, weight, eps_);
  }
};

struct BatchNormOptions {
  double eps = 1e-5;
  // Weight of the new batch statistic in the running average; std::nullopt gives a cumulative
  // (equal-weight) average over the batches seen, as PyTorch's momentum=None.
  std::optional<double> momentum = 0.1;
  bool affine = true;               // learnable weight and bias
  bool track_running_stats = true;  // running_mean / running_var / num_batches_tracked buffers
  DType dtype = DType::Float32;
  Device device = Device::cpu();
};

// Shared implementation of BatchNorm1d/2d; Derived checks the input's rank.
template <class Derived>
class BatchNormBase : public ModuleBase<Derived> {
 public:
  BatchNormBase(const char* name, int64_t num_features, BatchNormOptions opt)
      : name_(name), num_features_(num_features), opt_(opt) {
    EMBER_CHECK(num_features > 0, ValueError, name, ": num_features must be positive, got ", num_features);
    EMBER_CHECK(opt.eps >= 0.0, ValueError, name, ": eps must be non-negative, got ", opt.eps);
    if (opt.momentum) EMBER_CHECK(*opt.momentum >= 0.0 && *opt.momentum <= 1.0, ValueError, name,
                                  ": momentum must be in [0, 1], got ", *opt.momentum);
    const Shape s{num_features};
    if (opt.affine) {
      weight = this->register_parameter("weight", AnyTensor::full(s, 1.0, opt.dtype, opt.device));
      bias = this->register_parameter("bias", AnyTensor::zeros(s, opt.dtype, opt.device));
    }
    if (opt.track_running_stats) {
      running_mean = this->register_buffer("running_mean", AnyTensor::zeros(s, opt.dtype, opt.device));
      running_var = this->register_buffer("running_var", AnyTensor::full(s, 1.0, opt.dtype, opt.device));
      num_batches_tracked =
          this->register_buffer("num_batches_tracked", AnyTensor::zeros(Shape{}, DType::Int64, opt.device));
    }
  }
  std::string type_name() const override { return name_; }

  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    static_assert(std::is_floating_point_v<compute_t<T>>, "BatchNorm: floating-point input only");
    using C = compute_t<T>;
    op::detail::check_defined(name_.c_str(), x);
    static_cast<Derived&>(*this).check_rank(x);
    // Checked here: otherwise the first op to meet a parameter (an add) would name itself only.
    for (const AnyTensor* t : {&weight, &running_mean})
      if (t->defined())
        EMBER_CHECK(t->device() == x.device(), DeviceError, name_, "(", num_features_, "): input ", x.desc(),
                    " is not on the device of the layer's parameters and buffers (on ", t->device().str(),
                    "); move one with .to(device)");
    EMBER_CHECK(x.shape()[1] == num_features_, ShapeError, name_, "(", num_features_, "): input ", x.desc(), " has ",
                x.shape()[1], " channels, expected ", num_features_);
    std::vector<int> dims{0};
    std::vector<int64_t> cs(static_cast<size_t>(x.dim()), 1);
    cs[1] = num_features_;
    for (int i = 2; i < x.dim(); ++i) dims.push_back(i);
    const Shape cshape(cs);  // [1, C, 1, ...]: per-channel values broadcast against x
    Tensor<C> xc = x.template to<C>();
    Tensor<C> y;
    const bool batch_stats = this->is_training() || !opt_.track_running_stats;
    // An empty batch: an empty output (still on the graph) and no change to the running
    // statistics, as PyTorch's batch_norm returns for an input with no elements.
    if (x.numel() == 0) return Tensor<T>(op::mul(x, 1.0));
    if (batch_stats) {
      const int64_t n = x.numel() / num_features_;
      EMBER_CHECK(!this->is_training() || n > 1, ValueError, name_,
                  ": expected more than 1 value per channel when training, got input ", x.desc());
      if (op::batch_norm_fused_applies(x, weight, bias)) {  // one fused op where the backend has it (CPU fp32/fp64)
        op::BatchNormOutput r = op::batch_norm_train(x, weight, bias, opt_.eps);
        if (this->is_training() && opt_.track_running_stats) update_running_stats(r.mean, r.var, n);
        return Tensor<T>(r.y);
      }
      Tensor<C> mu = mean(xc, dims, true);
      Tensor<C> d = xc - mu;
      Tensor<C> var = mean(square(d), dims, true);
      y = d * reciprocal(sqrt(var + opt_.eps));
      if (this->is_training() && opt_.track_running_stats) update_running_stats(mu, var, n);
    } else {
      Tensor<C> rm = param_as<C>(running_mean).reshape(cshape);
      Tensor<C> rv = param_as<C>(running_var).reshape(cshape);
      y = (xc - rm) * reciprocal(sqrt(rv + opt_.eps));
    }
    if (opt_.affine) y = y * param_as<C>(weight).reshape(cshape) + param_as<C>(bias).reshape(cshape);
    return y.template to<T>();
  }

  int64_t num_features() const { return num_features_; }
  const BatchNormOptions& options() const { return opt_; }
  AnyTensor weight, bias;                                   // undefined without affine
  AnyTensor running_mean, running_var, num_batches_tracked;  // undefined without track_running_stats

 private:
  // running = (1 - f) running + f batch, with the unbiased variance; not recorded by autograd.
  void update_running_stats(const AnyTensor& mu, const AnyTensor& var, int64_t n) {
    NoGradGuard no_grad;
    num_batches_tracked.copy_(op::add(num_batches_tracked, 1.0));
    const double f = opt_.momentum ? *opt_.momentum : 1.0 / num_batches_tracked.item_double();
    const Shape s{num_features_};
    AnyTensor m = mu.detach().reshape(s).to(running_mean.dtype());
    AnyTensor v = op::mul(var.detach().reshape(s), static_cast<double>(n) / static_cast<double>(n - 1))
                      .to(running_var.dtype());
    running_mean.copy_(op::add(op::mul(running_mean, 1.0 - f), op::mul(m, f)));
    running_var.copy_(op::add(op::mul(running_var, 1.0 - f), op::mul(v, f)));
  }

  std::string name_;
  int64_t num_features_;
  BatchNormOptions opt_;
};

class BatchNorm1d : public BatchNormBase<BatchNorm1d> {
 public:
  explicit BatchNorm1d(int64_t num_features, BatchNormOptions opt = {})
      : BatchNormBase("BatchNorm1d", num_features, opt) {}
  void check_rank(const AnyTensor& x) const {
    EMBER_CHECK(x.dim() == 2 || x.dim() == 3, ShapeError, "BatchNorm1d(", num_features(),
                "): expected a 2-D [N, C] or 3-D [N, C, L] input, got ", x.desc());
  }
};

class BatchNorm2d : public BatchNormBase<BatchNorm2d> {
 public:
  explicit BatchNorm2d(int64_t num_features, BatchNormOptions opt = {})
      : BatchNormBase("BatchNorm2d", num_features, opt) {}
  void check_rank(const AnyTensor& x) const {
    EMBER_CHECK(x.dim() == 4, ShapeError, "BatchNorm2d(", num_features(), "): expected a 4-D [N, C, H, W] input, got ",
                x.desc());
  }
};

}  // namespace ember::nn
