#pragma once
// nn::Linear: y = x W^T + b with W [out_features, in_features], as torch.nn.Linear (same
// parameter names and default initialisation, so state dicts move both ways). The forward is
// op::linear: one GEMM with the bias added inside it.
#include "ember/nn/init.hpp"
#include "ember/nn/module.hpp"

namespace ember::nn {

struct LinearOptions {
  bool bias = true;
  DType dtype = DType::Float32;
  Device device = Device::cpu();
};

class Linear : public ModuleBase<Linear> {
 public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions opt = {})
      : in_features_(in_features), out_features_(out_features) {
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
    return linear(x, param_as<T>(weight), bias.defined() ? param_as<T>(bias) : Tensor<T>());
  }

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  AnyTensor weight, bias;

 private:
  int64_t in_features_, out_features_;
};

}  // namespace ember::nn
