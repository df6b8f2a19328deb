#pragma once
// Pooling modules: MaxPool2d, AvgPool2d, AdaptiveAvgPool2d (torch's semantics and defaults:
// stride defaults to the kernel size).
#include "ember/nn/module.hpp"
#include "ember/ops/pool.hpp"

namespace ember::nn {

namespace detail {
// MaxPool2d and AvgPool2d: a module holding its op::Pool2dOptions.
template <class Derived>
class Pool2dBase : public ModuleBase<Derived> {
 public:
  explicit Pool2dBase(const op::Pool2dOptions& o) : o_(o) {}
  const op::Pool2dOptions& options() const { return o_; }

 protected:
  op::Pool2dOptions o_;
};
}  // namespace detail

class MaxPool2d : public detail::Pool2dBase<MaxPool2d> {
 public:
  explicit MaxPool2d(std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {0, 0},
                     std::array<int64_t, 2> padding = {0, 0}, bool ceil_mode = false)
      : Pool2dBase({.kernel = kernel, .stride = stride, .padding = padding, .ceil_mode = ceil_mode}) {}
  explicit MaxPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0)
      : MaxPool2d({kernel, kernel}, {stride, stride}, {padding, padding}) {}
  std::string type_name() const override { return "MaxPool2d"; }
  template <Element T> Tensor<T> forward(const Tensor<T>& x) { return max_pool2d(x, o_); }
};

class AvgPool2d : public detail::Pool2dBase<AvgPool2d> {
 public:
  explicit AvgPool2d(std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {0, 0},
                     std::array<int64_t, 2> padding = {0, 0}, bool ceil_mode = false, bool count_include_pad = true)
      : Pool2dBase({.kernel = kernel,
                    .stride = stride,
                    .padding = padding,
                    .ceil_mode = ceil_mode,
                    .count_include_pad = count_include_pad}) {}
  explicit AvgPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0)
      : AvgPool2d({kernel, kernel}, {stride, stride}, {padding, padding}) {}
  std::string type_name() const override { return "AvgPool2d"; }
  template <Element T> Tensor<T> forward(const Tensor<T>& x) { return avg_pool2d(x, o_); }
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
