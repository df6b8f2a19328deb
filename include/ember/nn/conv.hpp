#pragma once
// nn::Conv2d as torch.nn.Conv2d: weight [out, in/groups, kh, kw] and bias [out], kaiming-uniform
// default initialisation (a = sqrt(5)), stride, padding, dilation, groups.
#include "ember/nn/init.hpp"
#include "ember/nn/module.hpp"
#include "ember/ops/conv.hpp"

namespace ember::nn {

struct Conv2dOptions {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
  bool bias = true;
  DType dtype = DType::Float32;
  Device device = Device::cpu();
};

class Conv2d : public ModuleBase<Conv2d> {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, std::array<int64_t, 2> kernel_size, Conv2dOptions opt = {})
      : opt_(opt) {
    EMBER_CHECK(in_channels > 0 && out_channels > 0 && kernel_size[0] > 0 && kernel_size[1] > 0, ValueError,
                "Conv2d: channels and kernel size must be positive");
    EMBER_CHECK(opt.groups > 0 && in_channels % opt.groups == 0 && out_channels % opt.groups == 0, ValueError,
                "Conv2d: in_channels ", in_channels, " and out_channels ", out_channels, " must divide by groups ",
                opt.groups);
    weight = register_parameter(
        "weight", AnyTensor::empty({out_channels, in_channels / opt.groups, kernel_size[0], kernel_size[1]}, opt.dtype,
                                   opt.device, "Conv2d"));
    if (opt.bias) bias = register_parameter("bias", AnyTensor::empty({out_channels}, opt.dtype, opt.device, "Conv2d"));
    init::default_layer_init(weight, opt.bias ? &bias : nullptr);
  }
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Conv2dOptions opt = {})
      : Conv2d(in_channels, out_channels, {kernel_size, kernel_size}, opt) {}
  std::string type_name() const override { return "Conv2d"; }

  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    op::Conv2dOptions o{opt_.stride, opt_.padding, opt_.dilation, opt_.groups};
    AnyTensor b = bias.defined() ? AnyTensor(param_as<T>(bias)) : AnyTensor();
    return Tensor<T>(op::conv2d(x, param_as<T>(weight), b, o));
  }

  const Conv2dOptions& options() const { return opt_; }
  AnyTensor weight, bias;

 private:
  Conv2dOptions opt_;
};

}  // namespace ember::nn
