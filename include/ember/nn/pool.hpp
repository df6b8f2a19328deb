#pragma once
// Pooling modules: MaxPool2d, AvgPool2d, AdaptiveAvgPool2d (torch's semantics and defaults:
// stride defaults to the kernel size).
#include "ember/nn/module.hpp"
#include "ember/ops/pool.hpp"

namespace ember::nn {

class MaxPool2d : public ModuleBase<MaxPool2d> {
 public:
  explicit MaxPool2d(std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {0, 0},
                     std::array<int64_t, 2> padding = {0, 0}, bool ceil_mode = false) {
    o_.kernel = kernel;
    o_.stride = stride;
    o_.padding = padding;
    o_.ceil_mode = ceil_mode;
  }
  explicit MaxPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0)
      : MaxPool2d({kernel, kernel}, {stride, stride}, {padding, padding}) {}
  std::string type_name() const override { return "MaxPool2d"; }
  template <Element T> Tensor<T> forward(const Tensor<T>& x) { return max_pool2d(x, o_); }
  const op::Pool2dOptions& options() const { return o_; }

 private:
  op::Pool2dOptions o_;
};

class AvgPool2d : public ModuleBase<AvgPool2d> {
 public:
  explicit AvgPool2d(std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {0, 0},
                     std::array<int64_t, 2> padding = {0, 0}, bool ceil_mode = false, bool count_include_pad = true) {
    o_.kernel = kernel;
    o_.stride = stride;
    o_.padding = padding;
    o_.ceil_mode = ceil_mode;
    o_.count_include_pad = count_include_pad;
  }
  explicit AvgPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0)
      : AvgPool2d({kernel, kernel}, {stride, stride}, {padding, padding}) {}
  std::string type_name() const override { return "AvgPool2d"; }
  template <Element T> Tensor<T> forward(const Tensor<T>& x) { return avg_pool2d(x, o_); }
  const op::Pool2dOptions& options() const { return o_; }

 private:
  op::Pool2dOptions o_;
};

class AdaptiveAvgPool2d : public ModuleBase<AdaptiveAvgPool2d> {
 public:
  explicit AdaptiveAvgPool2d(std::array<int64_t, 2> output_size) : out_(output_size) {}
  explicit AdaptiveAvgPool2d(int64_t output_size) : out_{output_size, output_size} {}
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }
  template <Element T> Tensor<T> forward(const Tensor<T>& x) { return adaptive_avg_pool2d(x, out_); }
  std::array<int64_t, 2> output_size() const { return out_; }

 private:
  std::array<int64_t, 2> out_;
};

}  // namespace ember::nn
