#pragma once
// Activations as modules (no parameters): ReLU, GELU (exact or tanh), SiLU, Tanh, Sigmoid,
// Softmax, LogSoftmax, and Flatten and Identity, which also have no state.
#include "ember/nn/module.hpp"

namespace ember::nn {

class ReLU : public ModuleBase<ReLU> {
 public:
  std::string type_name() const override { return "ReLU"; }
  template <Element T> Tensor<T> forward(const Tensor<T>& x) { return relu(x); }
};

class GELU : public ModuleBase<GELU> {
 public:
  // approximate: "none" (exact, erf) or "tanh", as torch.nn.GELU.
  explicit GELU(const std::string& approximate = "none") : tanh_(approximate == "tanh") {
    EMBER_CHECK(approximate == "none" || approximate == "tanh", ValueError,
                "GELU: approximate must be 'none' or 'tanh', got '", approximate, "'");
  }
  std::string type_name() const override { return "GELU"; }
  template <Element T> Tensor<T> forward(const Tensor<T>& x) { return gelu(x, tanh_); }
  std::string approximate() const { return tanh_ ? "tanh" : "none"; }

 private:
  bool tanh_;
};

class SiLU : public ModuleBase<SiLU> {
 public:
  std::string type_name() const override { return "SiLU"; }
  template <Element T> Tensor<T> forward(const Tensor<T>& x) { return silu(x); }
};

class Tanh : public ModuleBase<Tanh> {
 public:
  std::string type_name() const override { return "Tanh"; }
  template <Element T> Tensor<T> forward(const Tensor<T>& x) { return tanh(x); }
};

class Sigmoid : public ModuleBase<Sigmoid> {
 public:
  std::string type_name() const override { return "Sigmoid"; }
  template <Element T> Tensor<T> forward(const Tensor<T>& x) { return sigmoid(x); }
};

class Softmax : public ModuleBase<Softmax> {
 public:
  explicit Softmax(int dim = -1) : dim_(dim) {}
  std::string type_name() const override { return "Softmax"; }
  template <Element T> Tensor<T> forward(const Tensor<T>& x) { return softmax(x, dim_); }
  int dim() const { return dim_; }

 private:
  int dim_;
};

class LogSoftmax : public ModuleBase<LogSoftmax> {
 public:
  explicit LogSoftmax(int dim = -1) : dim_(dim) {}
  std::string type_name() const override { return "LogSoftmax"; }
  template <Element T> Tensor<T> forward(const Tensor<T>& x) { return log_softmax(x, dim_); }
  int dim() const { return dim_; }

 private:
  int dim_;
};

// Flattens dimensions [start_dim, end_dim] (default: all but the batch dimension).
class Flatten : public ModuleBase<Flatten> {
 public:
  explicit Flatten(int start_dim = 1, int end_dim = -1) : start_(start_dim), end_(end_dim) {}
  std::string type_name() const override { return "Flatten"; }
  template <Element T> Tensor<T> forward(const Tensor<T>& x) { return flatten(x, start_, end_); }
  int start_dim() const { return start_; }
  int end_dim() const { return end_; }

 private:
  int start_, end_;
};

class Identity : public ModuleBase<Identity> {
 public:
  std::string type_name() const override { return "Identity"; }
  template <Element T> Tensor<T> forward(const Tensor<T>& x) { return x; }
};

}  // namespace ember::nn
