#pragma once
// nn::Dropout(p = 0.5), as torch.nn.Dropout: in training, each element is zeroed with
// probability p and the survivors are scaled by 1 / (1 - p); in eval it is the identity.
// The mask comes from ember's Philox generator: element i is kept when
// the uniform number u_i of Tensor<float>::rand(x.shape(), x.device(), 0, 1, gen) satisfies
// u_i < 1 - p. So the same generator state gives the same mask on the CPU and on CUDA, and a
// recomputation that restores the generator's (seed, offset) replays it. Each call draws
// x.numel() numbers, advancing the generator (the default one unless one is given).
#include "ember/nn/module.hpp"

namespace ember::nn {

namespace functional {
inline void check_dropout_p(const char* op, double p) {
  EMBER_CHECK(p >= 0.0 && p <= 1.0, ValueError, op, ": dropout probability has to be between 0 and 1, but got ", p);
}

template <Element T>
  requires std::is_floating_point_v<compute_t<T>>
Tensor<T> dropout(const Tensor<T>& x, double p = 0.5, bool training = true, Generator& gen = default_generator()) {
  check_dropout_p("dropout", p);
  op::detail::check_defined("dropout", x);
  if (!training || p == 0.0) return x;
  if (p == 1.0) return x * 0.0;  // all zeros, and a zero gradient
  Tensor<float> u = Tensor<float>::rand(x.shape(), x.device(), 0.0, 1.0, gen);
  AnyTensor keep = op::compare(CompareOp::Lt, u, 1.0 - p).to(dtype_of<T>);  // 1 kept, 0 dropped
  // x * mask is exact; the scale is one rounding, in the compute type.
  return Tensor<T>(op::mul(op::mul(x, keep), 1.0 / (1.0 - p)));
}
}  // namespace functional

class Dropout : public ModuleBase<Dropout> {
 public:
  explicit Dropout(double p = 0.5) : p_(p) { functional::check_dropout_p("Dropout", p); }
  // Draws masks from `gen` (which must outlive the module) instead of the default generator.
  Dropout(double p, Generator& gen) : p_(p), gen_(&gen) { functional::check_dropout_p("Dropout", p); }
  std::string type_name() const override { return "Dropout"; }

  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    return functional::dropout(x, p_, is_training(), gen_ ? *gen_ : default_generator());
  }
  double p() const { return p_; }

 private:
  double p_;
  Generator* gen_ = nullptr;
};

}  // namespace ember::nn
