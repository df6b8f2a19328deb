#pragma once
// The digits CNN shared by digits_cnn and ddp_train, and its test accuracy:
// Conv(1->32, 3x3) ReLU MaxPool -> Conv(32->64, 3x3) ReLU MaxPool -> Linear(256 -> 10).
#include <memory>

#include <ember/ember.hpp>

namespace examples {

inline std::shared_ptr<ember::nn::Sequential> make_digits_cnn() {
  using namespace ember;
  auto m = std::make_shared<nn::Sequential>();
  m->emplace<nn::Conv2d>(1, 32, 3, nn::Conv2dOptions{.padding = {1, 1}});
  m->emplace<nn::ReLU>();
  m->emplace<nn::MaxPool2d>(2);  // 8x8 -> 4x4
  m->emplace<nn::Conv2d>(32, 64, 3, nn::Conv2dOptions{.padding = {1, 1}});
  m->emplace<nn::ReLU>();
  m->emplace<nn::MaxPool2d>(2);  // 4x4 -> 2x2
  m->emplace<nn::Flatten>();
  m->emplace<nn::Linear>(64 * 2 * 2, 10);
  return m;
}

// Fraction of samples whose arg-max logit is the label (eval mode, no graph).
inline double accuracy(ember::nn::Sequential& model, const ember::Tensor<float>& x, const ember::Tensor<int64_t>& y) {
  using namespace ember;
  NoGradGuard no_grad;
  model.eval();
  auto pred = argmax(model(x), {1});
  model.train();
  return static_cast<double>(sum(eq(pred, y).to<int64_t>()).item()) / static_cast<double>(y.numel());
}

}  // namespace examples
