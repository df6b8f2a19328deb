#pragma once
// Batch-norm folding for inference: a Conv2d followed by a BatchNorm2d (its running statistics)
// computes what one Conv2d with scaled weights and a shifted bias computes,
//   w' = w g / sqrt(var + eps),   b' = (b - mean) g / sqrt(var + eps) + beta   (per output channel),
// one op fewer and, for INT8, the weight that is actually applied is the one quantized.
//
//   auto folded = nn::fold_batch_norm(*model);   // a new Sequential; the other layers are shared
#include <cmath>
#include <memory>
#include <utility>

#include "ember/nn/conv.hpp"
#include "ember/nn/norm.hpp"
#include "ember/nn/sequential.hpp"

namespace ember::nn {

// The folded weight and bias (the convolution's dtype and device), computed in double.
inline std::pair<AnyTensor, AnyTensor> fold_batch_norm_weights(const Conv2d& conv, const BatchNorm2d& bn) {
  NoGradGuard no_grad;
  const int64_t c = conv.weight.shape()[0];
  EMBER_CHECK(bn.num_features() == c, ShapeError, "fold_batch_norm: Conv2d has ", c, " output channels, ",
              bn.type_name(), " ", bn.num_features());
  EMBER_CHECK(bn.running_mean.defined(), ValueError, "fold_batch_norm: ", bn.type_name(),
              " keeps no running statistics (track_running_stats = false): nothing to fold");
  auto host = [](const AnyTensor& t) { return t.detach().to(Device::cpu()).to_double_vector(); };
  std::vector<double> w = host(conv.weight), mean = host(bn.running_mean), var = host(bn.running_var);
  std::vector<double> g = bn.weight.defined() ? host(bn.weight) : std::vector<double>(static_cast<size_t>(c), 1.0);
  std::vector<double> beta = bn.bias.defined() ? host(bn.bias) : std::vector<double>(static_cast<size_t>(c), 0.0);
  std::vector<double> b = conv.bias.defined() ? host(conv.bias) : std::vector<double>(static_cast<size_t>(c), 0.0);
  const size_t per = w.size() / static_cast<size_t>(c);
  for (size_t o = 0; o < static_cast<size_t>(c); ++o) {
    const double f = g[o] / std::sqrt(var[o] + bn.options().eps);
    for (size_t k = 0; k < per; ++k) w[o * per + k] *= f;
    b[o] = (b[o] - mean[o]) * f + beta[o];
  }
  const DType dt = conv.weight.dtype();
  const Device dev = conv.weight.device();
  return {AnyTensor(Tensor<double>::from_vector(w, conv.weight.shape())).to(dt).to(dev),
          AnyTensor(Tensor<double>::from_vector(b, {c})).to(dt).to(dev)};
}

// A new Sequential in which every Conv2d directly followed by a BatchNorm2d with running
// statistics is one Conv2d (with a bias) holding the folded weights; nested Sequentials too. The
// other layers are the same objects as in `model`.
inline std::shared_ptr<Sequential> fold_batch_norm(const Sequential& model) {
  auto out = std::make_shared<Sequential>();
  const auto& layers = model.layers();
  for (size_t i = 0; i < layers.size(); ++i) {
    auto conv = std::dynamic_pointer_cast<Conv2d>(layers[i]);
    auto bn = i + 1 < layers.size() ? std::dynamic_pointer_cast<BatchNorm2d>(layers[i + 1]) : nullptr;
    if (conv && bn && bn->running_mean.defined()) {
      auto [w, b] = fold_batch_norm_weights(*conv, *bn);
      Conv2dOptions o = conv->options();
      o.bias = true;
      o.dtype = conv->weight.dtype();
      o.device = conv->weight.device();
      auto folded = std::make_shared<Conv2d>(conv->weight.shape()[1] * o.groups, conv->weight.shape()[0],
                                             std::array<int64_t, 2>{conv->weight.shape()[2], conv->weight.shape()[3]}, o);
      NoGradGuard no_grad;
      folded->weight.copy_(w);
      folded->bias.copy_(b);
      out->push_back(folded);
      ++i;
      continue;
    }
    if (auto s = std::dynamic_pointer_cast<Sequential>(layers[i])) out->push_back(fold_batch_norm(*s));
    else out->push_back(layers[i]);
  }
  out->train(model.is_training());
  return out;
}

}  // namespace ember::nn
