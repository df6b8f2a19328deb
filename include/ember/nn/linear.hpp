#pragma once
// nn::Linear: y = x W^T + b with W [out_features, in_features], as torch.nn.Linear (same
// parameter names and default initialisation, so state dicts move both ways). The forward is
// op::linear: one GEMM with the bias added inside it. With LinearOptions::activation the layer is
// Linear followed by ReLU or GELU as one op (op::linear_act: the activation in the GEMM's epilogue
// on CUDA, and for ReLU one activation fewer kept for the backward); its parameters and state
// dict are still torch.nn.Linear's, the activation being a separate module there.
#include "ember/nn/init.hpp"
#include "ember/nn/module.hpp"

namespace ember::nn {

struct LinearOptions {
  bool bias = true;
  DType dtype = DType::Float32;
  Device device = Device::cpu();
  LinearActivation activation = LinearActivation::None;  // Relu, Gelu, GeluTanh: applied to the output
};

class Linear : public ModuleBase<Linear> {
 public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions opt = {})
      : in_features_(in_features), out_features_(out_features), activation_(opt.activation) {
    EMBER_CHECK(in_features > 0 && out_features > 0, ValueError, "Linear: features must be positive, got ",
                in_features, " -> ", out_features);
    weight = register_parameter("weight", AnyTensor::empty({out_features, in_features}, opt.dtype, opt.device, "Linear"));
    if (opt.bias) bias = register_parameter("bias", AnyTensor::empty({out_features}, opt.dtype, opt.device, "Linear"));
    init::default_layer_init(weight, opt.bias ? &bias : nullptr);
  }
  std::string type_name() const override { return "Linear"; }

  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    EMBER_CHECK(x.dim() >= 1 && x.shape()[x.dim() - 1] == in_features_, ShapeError, "Linear(", in_features_, ", ",
                out_features_, "): input ", x.desc(), " must end in ", in_features_, " features");
    return forward_with(x, activation_);
  }
  // The layer followed by `act` as one op, whatever the layer's own activation (a module that
  // applies an activation to this layer's output calls this: TransformerMLP). Inside the
  // profiler's and anomaly mode's frames of this module when called directly.
  template <Element T>
  Tensor<T> forward_with(const Tensor<T>& x, LinearActivation act) {
    autograd::detail::AnomalyModuleFrame anomaly_frame(*this);
    detail::ModuleScope scope(*this);
    EMBER_CHECK(x.dim() >= 1 && x.shape()[x.dim() - 1] == in_features_, ShapeError, "Linear(", in_features_, ", ",
                out_features_, "): input ", x.desc(), " must end in ", in_features_, " features");
    const Tensor<T> w = param_as<T>(weight), b = bias.defined() ? param_as<T>(bias) : Tensor<T>();
    return act == LinearActivation::None ? linear(x, w, b) : linear_act(x, w, b, act);
  }
  std::string extra_repr() const override {
    std::string s = Module::extra_repr();
    switch (activation_) {
      case LinearActivation::None: break;
      case LinearActivation::Relu: s += ", activation=relu"; break;
      case LinearActivation::Gelu: s += ", activation=gelu"; break;
      case LinearActivation::GeluTanh: s += ", activation=gelu_tanh"; break;
    }
    return s;
  }
  LinearActivation activation() const { return activation_; }

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  AnyTensor weight, bias;

 private:
  int64_t in_features_, out_features_;
  LinearActivation activation_;
};

}  // namespace ember::nn
