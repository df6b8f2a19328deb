#pragma once
// INT8 as TensorRT's explicit quantization expects it: weights symmetric per output channel
// (scale = max |w_c| / 127), activations per tensor (scale from a calibration observer), zero
// points 0, integers -128..127.
//
//   quant::QuantLinear / QuantConv2d   wrap an nn::Linear / nn::Conv2d (its parameters, under their
//                                      own names: the state dict is the float layer's plus
//                                      input_amax). Modes: Float (the layer as it was), Calibrate
//                                      (the layer, its input observed), FakeQuant (input and weight
//                                      quantized and dequantized: what the INT8 engine computes,
//                                      trainable with the straight-through estimator: QAT).
//                                      The ONNX export writes them as QuantizeLinear /
//                                      DequantizeLinear pairs (deploy/onnx_layers.hpp).
//   quant::Int8Linear                  weight-only INT8 in ember itself: int8 weights (a quarter of
//                                      fp32's memory) and per-channel scales, dequantized to the
//                                      activation type for the GEMM.
#include <memory>
#include <string>

#include "ember/nn/conv.hpp"
#include "ember/nn/linear.hpp"
#include "ember/quant/observer.hpp"

namespace ember::quant {

enum class QuantMode { Float, Calibrate, FakeQuant };

// Per-output-channel scales of a weight (dimension 0): max |w_c| / 127, 1 for an all-zero channel.
inline std::vector<float> weight_scales(const AnyTensor& w) {
  const std::vector<double> v = w.detach().to_double_vector();
  const int64_t c = w.shape()[0], per = c > 0 ? w.numel() / c : 0;
  std::vector<float> s(static_cast<size_t>(c));
  for (int64_t o = 0; o < c; ++o) {
    double m = 0;
    for (int64_t k = 0; k < per; ++k) m = std::max(m, std::abs(v[static_cast<size_t>(o * per + k)]));
    s[static_cast<size_t>(o)] = m > 0 ? static_cast<float>(m / 127.0) : 1.0f;
  }
  return s;
}

// The integers of a weight quantized with per-channel `scales` (round half to even, saturated).
inline std::vector<int8_t> quantize_weight(const AnyTensor& w, const std::vector<float>& scales) {
  const std::vector<double> v = w.detach().to_double_vector();
  const int64_t c = w.shape()[0], per = c > 0 ? w.numel() / c : 0;
  std::vector<int8_t> q(v.size());
  for (int64_t o = 0; o < c; ++o)
    for (int64_t k = 0; k < per; ++k) {
      const size_t i = static_cast<size_t>(o * per + k);
      // In float, as the fake quantization and the ONNX runtimes divide.
      const float r = std::nearbyint(static_cast<float>(v[i]) / scales[static_cast<size_t>(o)]);
      q[i] = static_cast<int8_t>(std::clamp(r, -128.0f, 127.0f));
    }
  return q;
}

// w quantized per output channel and dequantized, differentiable (straight-through: the gradient
// of w passes where w is inside its channel's range, which it always is with max scales).
template <Element T>
Tensor<T> fake_quantize_per_channel(const Tensor<T>& w, const std::vector<float>& scales) {
  std::vector<int64_t> bshape(static_cast<size_t>(w.dim()), 1);
  bshape[0] = w.shape()[0];
  const Tensor<T> s = Tensor<float>::from_vector(scales, Shape(bshape)).to(w.device()).template to<T>();
  return fake_quantize(w / s, 1.0, 127.0) * s;
}

// How a layer is quantized: its activations' observer, and whether its output is quantized too.
// Inputs only is TensorRT's recommended placement (it fuses the next layer's input quantization
// into this layer); quantize_outputs adds a pair after the layer (and its fused activation), the
// placement onnxruntime's CPU kernels need to run a convolution or a Gemm in integers.
struct QuantOptions {
  ObserverOptions observer = {};
  bool quantize_outputs = false;
};

namespace detail {

// What QuantLinear and QuantConv2d share: the mode, the input's (and output's) observer and amax.
template <class Derived, class Layer>
class QuantLayerBase : public nn::ModuleBase<Derived> {
 public:
  QuantLayerBase(std::shared_ptr<Layer> layer, QuantOptions o)
      : layer_(std::move(layer)), opt_(o), observer_(o.observer), output_observer_(o.observer) {
    EMBER_CHECK(layer_ != nullptr, ValueError, "quant: the wrapped layer is null");
    // The float layer's parameters under their own names, so that the state dict stays the
    // layer's (plus input_amax, output_amax): a trained float checkpoint loads non-strictly, a
    // calibrated one strictly.
    this->register_parameter("weight", layer_->weight);
    if (layer_->bias.defined()) this->register_parameter("bias", layer_->bias);
    input_amax = this->register_buffer("input_amax", AnyTensor::zeros(Shape{}, DType::Float32));
    if (o.quantize_outputs) output_amax = this->register_buffer("output_amax", AnyTensor::zeros(Shape{}, DType::Float32));
  }
  bool quantizes_output() const { return opt_.quantize_outputs; }
  double output_scale() const { return scale_of(output_amax, "output"); }
  void set_mode(QuantMode m) { mode_ = m; }
  QuantMode mode() const { return mode_; }
  Layer& layer() const { return *layer_; }
  std::shared_ptr<Layer> layer_ptr() const { return layer_; }
  const Observer& observer() const { return observer_; }
  // Takes the observer's amax as the input's range (after calibration batches).
  void finish_calibration() {
    NoGradGuard no_grad;
    input_amax.copy_(AnyTensor::full(Shape{}, observer_.amax(), DType::Float32, input_amax.device()));
    if (opt_.quantize_outputs)
      output_amax.copy_(AnyTensor::full(Shape{}, output_observer_.amax(), DType::Float32, output_amax.device()));
  }
  // The input's step: input_amax / 127 (set by finish_calibration or loaded with the state dict).
  double input_scale() const { return scale_of(input_amax, "input"); }
  std::vector<float> weight_scales() const { return quant::weight_scales(layer_->weight); }
  std::string extra_repr() const override {
    const char* mode = mode_ == QuantMode::Float ? "float" : mode_ == QuantMode::Calibrate ? "calibrate" : "fake_quant";
    return nn::Module::extra_repr() + ", mode=" + mode + ", observer=" + observer_name(observer_.options().kind) +
           (opt_.quantize_outputs ? ", outputs quantized" : "");
  }

  // Float: the layer as it was. Otherwise Derived's quantized_forward (the layer's computation
  // with weight_as and bias_as) on the input as the mode makes it, then the output as the mode
  // makes it.
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    if (mode_ == QuantMode::Float) return (*layer_)(x);
    return finish_output(static_cast<Derived&>(*this).quantized_forward(prepare_input(x)));
  }

  AnyTensor input_amax, output_amax;  // output_amax: with quantize_outputs only

 protected:
  double scale_of(const AnyTensor& amax, const char* what) const {
    const double a = amax.defined() ? amax.item_double() : 0.0;
    EMBER_CHECK(a > 0, ValueError, this->type_name(), ": the ", what, "'s range is not calibrated (its amax is ", a,
                "); run calibration batches in Calibrate mode, then finish_calibration()");
    return a / 127.0;
  }
  // The layer's output as the next layer will see it in the current mode.
  template <Element T>
  Tensor<T> finish_output(const Tensor<T>& y) {
    if (!opt_.quantize_outputs) return y;
    if (mode_ == QuantMode::Calibrate) output_observer_.observe(y);
    if (mode_ != QuantMode::FakeQuant) return y;
    return fake_quantize(y, output_scale(), 127.0);
  }
  // The input as the layer will see it in the current mode.
  template <Element T>
  Tensor<T> prepare_input(const Tensor<T>& x) {
    if (mode_ == QuantMode::Calibrate) observer_.observe(x);
    if (mode_ != QuantMode::FakeQuant) return x;
    return fake_quantize(x, input_scale(), 127.0);
  }
  template <Element T>
  Tensor<T> weight_as() const {
    const Tensor<T> w = nn::param_as<T>(layer_->weight);
    return mode_ == QuantMode::FakeQuant ? fake_quantize_per_channel(w, weight_scales()) : w;
  }
  template <Element T>
  Tensor<T> bias_as() const {
    return layer_->bias.defined() ? nn::param_as<T>(layer_->bias) : Tensor<T>();
  }

  std::shared_ptr<Layer> layer_;
  QuantOptions opt_;
  Observer observer_, output_observer_;
  QuantMode mode_ = QuantMode::Float;
};

}  // namespace detail

class QuantLinear : public detail::QuantLayerBase<QuantLinear, nn::Linear> {
 public:
  explicit QuantLinear(std::shared_ptr<nn::Linear> layer, QuantOptions o = {}) : QuantLayerBase(std::move(layer), o) {}
  std::string type_name() const override { return "QuantLinear"; }

 private:
  friend QuantLayerBase;
  template <Element T>
  Tensor<T> quantized_forward(const Tensor<T>& xq) {
    const Tensor<T> b = bias_as<T>();
    const LinearActivation act = layer_->activation();
    const Tensor<T> w = weight_as<T>();
    return act == LinearActivation::None ? linear(xq, w, b) : linear_act(xq, w, b, act);
  }
};

class QuantConv2d : public detail::QuantLayerBase<QuantConv2d, nn::Conv2d> {
 public:
  explicit QuantConv2d(std::shared_ptr<nn::Conv2d> layer, QuantOptions o = {}) : QuantLayerBase(std::move(layer), o) {}
  std::string type_name() const override { return "QuantConv2d"; }

 private:
  friend QuantLayerBase;
  template <Element T>
  Tensor<T> quantized_forward(const Tensor<T>& xq) {
    const nn::Conv2dOptions& o = layer_->options();
    const AnyTensor b = bias_as<T>();
    return Tensor<T>(op::conv2d(xq, weight_as<T>(), b, op::Conv2dOptions{o.stride, o.padding, o.dilation, o.groups}));
  }
};

// Weight-only INT8 Linear: y = x (q s)^T + b, q the int8 weights [out, in] (held as their bytes in
// a uint8 tensor, two's complement: ember has no int8 dtype) and s the per-channel scales.
// Inference only (no parameters); the activation's type is kept.
class Int8Linear : public nn::ModuleBase<Int8Linear> {
 public:
  explicit Int8Linear(const nn::Linear& l) : activation_(l.activation()) {
    const std::vector<float> s = quant::weight_scales(l.weight);
    const std::vector<int8_t> q = quantize_weight(l.weight, s);
    std::vector<uint8_t> bytes(q.size());
    std::memcpy(bytes.data(), q.data(), q.size());
    weight_int8 = register_buffer("weight_int8", Tensor<uint8_t>::from_vector(bytes, l.weight.shape()).to(l.weight.device()));
    weight_scale = register_buffer("weight_scale", Tensor<float>::from_vector(s, {l.weight.shape()[0]}).to(l.weight.device()));
    if (l.bias.defined()) bias = register_buffer("bias", l.bias.detach().to(DType::Float32).clone());
  }
  std::string type_name() const override { return "Int8Linear"; }
  // The weights as the activation type: the bytes as signed integers times the channel's scale.
  template <Element T>
  Tensor<T> dequantized_weight() const {
    const Tensor<float> u = Tensor<uint8_t>(weight_int8).template to<float>();
    const Tensor<float> high = Tensor<float>(op::compare(CompareOp::Ge, u, 128.0).to(DType::Float32));
    const Tensor<float> q = u - high * 256.0f;
    return (q * Tensor<float>(weight_scale).reshape({weight_scale.numel(), 1})).template to<T>();
  }
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    const Tensor<T> w = dequantized_weight<T>();
    const Tensor<T> b = bias.defined() ? Tensor<float>(bias).template to<T>() : Tensor<T>();
    return activation_ == LinearActivation::None ? linear(x, w, b) : linear_act(x, w, b, activation_);
  }
  LinearActivation activation() const { return activation_; }

  AnyTensor weight_int8, weight_scale, bias;

 private:
  LinearActivation activation_;
};

}  // namespace ember::quant
