#pragma once
// Parameter initialisation, as torch.nn.init: each function fills a tensor in place (not
// recorded) from the default generator or a given one. Inside an init::SkipInitGuard they do
// nothing (and draw nothing), for a module whose every parameter is loaded right after it is made.
#include <cmath>
#include <string>

#include "ember/ops/ops.hpp"

namespace ember::nn::init {

namespace detail {
inline bool& skip_init_flag() {
  thread_local bool skip = false;
  return skip;
}
}  // namespace detail

// While alive (on this thread; nests), uniform_, normal_, constant_ and everything built on them
// (zeros_, ones_, xavier_*, kaiming_*, the layers' default initialisation) leave tensors as they
// are and draw no random numbers: a module made inside holds uninitialised values until loaded,
// as transformers' no_init_weights. nn::GPT::from_huggingface uses it (GPT-2 124M: the draws
// were 8 of its 9 seconds).
class SkipInitGuard : ::ember::detail::ScopedFlag {
 public:
  SkipInitGuard() : ScopedFlag(detail::skip_init_flag(), true) {}
};

inline void fill_from(AnyTensor& t, const AnyTensor& values) {
  NoGradGuard no_grad;
  t.copy_(values.to(t.dtype()).to(t.device()));
}

inline void uniform_(AnyTensor& t, double lo = 0.0, double hi = 1.0, Generator& gen = default_generator()) {
  if (detail::skip_init_flag()) return;
  fill_from(t, Tensor<double>::rand(t.shape(), Device::cpu(), lo, hi, gen));
}
inline void normal_(AnyTensor& t, double mean = 0.0, double std = 1.0, Generator& gen = default_generator()) {
  if (detail::skip_init_flag()) return;
  fill_from(t, Tensor<double>::randn(t.shape(), Device::cpu(), mean, std, gen));
}
inline void constant_(AnyTensor& t, double v) {
  if (detail::skip_init_flag()) return;
  fill_from(t, AnyTensor::full(t.shape(), v, t.dtype(), t.device()));
}
inline void zeros_(AnyTensor& t) { constant_(t, 0.0); }
inline void ones_(AnyTensor& t) { constant_(t, 1.0); }

// fan_in = size(1) * receptive field, fan_out = size(0) * receptive field (torch's definition).
inline void calculate_fans(const AnyTensor& t, double& fan_in, double& fan_out) {
  EMBER_CHECK(t.dim() >= 2, ShapeError, "init: fan in and fan out need at least 2 dimensions, got ", t.desc());
  double receptive = 1;
  for (int i = 2; i < t.dim(); ++i) receptive *= static_cast<double>(t.shape()[i]);
  fan_in = static_cast<double>(t.shape()[1]) * receptive;
  fan_out = static_cast<double>(t.shape()[0]) * receptive;
}

// torch.nn.init.calculate_gain for "linear", "conv", "sigmoid", "tanh", "relu", "leaky_relu", "selu".
inline double calculate_gain(const std::string& nonlinearity, double param = 0.01) {
  if (nonlinearity == "linear" || nonlinearity.rfind("conv", 0) == 0 || nonlinearity == "sigmoid") return 1.0;
  if (nonlinearity == "tanh") return 5.0 / 3.0;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") return std::sqrt(2.0 / (1.0 + param * param));
  if (nonlinearity == "selu") return 0.75;
  throw ValueError("calculate_gain: unsupported nonlinearity " + nonlinearity);
}

inline void xavier_uniform_(AnyTensor& t, double gain = 1.0, Generator& gen = default_generator()) {
  double fi, fo;
  calculate_fans(t, fi, fo);
  double a = gain * std::sqrt(6.0 / (fi + fo));
  uniform_(t, -a, a, gen);
}
inline void xavier_normal_(AnyTensor& t, double gain = 1.0, Generator& gen = default_generator()) {
  double fi, fo;
  calculate_fans(t, fi, fo);
  normal_(t, 0.0, gain * std::sqrt(2.0 / (fi + fo)), gen);
}
// mode "fan_in" (default) or "fan_out"; a is the negative slope of leaky_relu.
inline void kaiming_uniform_(AnyTensor& t, double a = 0.0, const std::string& mode = "fan_in",
                             const std::string& nonlinearity = "leaky_relu", Generator& gen = default_generator()) {
  double fi, fo;
  calculate_fans(t, fi, fo);
  double gain = calculate_gain(nonlinearity, a);
  double bound = gain * std::sqrt(3.0 / (mode == "fan_in" ? fi : fo));
  uniform_(t, -bound, bound, gen);
}
inline void kaiming_normal_(AnyTensor& t, double a = 0.0, const std::string& mode = "fan_in",
                            const std::string& nonlinearity = "leaky_relu", Generator& gen = default_generator()) {
  double fi, fo;
  calculate_fans(t, fi, fo);
  double gain = calculate_gain(nonlinearity, a);
  normal_(t, 0.0, gain / std::sqrt(mode == "fan_in" ? fi : fo), gen);
}

// PyTorch's default for Linear and Conv layers: kaiming_uniform_(w, a=sqrt(5)) and a bias
// uniform in +-1/sqrt(fan_in).
inline void default_layer_init(AnyTensor& weight, AnyTensor* bias, Generator& gen = default_generator()) {
  kaiming_uniform_(weight, std::sqrt(5.0), "fan_in", "leaky_relu", gen);
  if (bias && bias->defined()) {
    double fi, fo;
    calculate_fans(weight, fi, fo);
    double bound = fi > 0 ? 1.0 / std::sqrt(fi) : 0.0;
    uniform_(*bias, -bound, bound, gen);
  }
}

}  // namespace ember::nn::init
