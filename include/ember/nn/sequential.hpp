#pragma once
// nn::Sequential: heterogeneous modules applied in order, named "0", "1", ... as in PyTorch.
#include <memory>
#include <vector>

#include "ember/nn/module.hpp"

namespace ember::nn {

class Sequential : public Module {
 public:
  Sequential() = default;
  template <class... M>
  explicit Sequential(std::shared_ptr<M>... modules) {
    (push_back(std::move(modules)), ...);
  }
  std::string type_name() const override { return "Sequential"; }

  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    layers_.push_back(m);
    return register_module(std::to_string(layers_.size() - 1), std::move(m));
  }
  // Constructs a layer in place: seq.emplace<Linear>(64, 10).
  template <class M, class... Args>
  std::shared_ptr<M> emplace(Args&&... args) {
    return push_back(std::make_shared<M>(std::forward<Args>(args)...));
  }
  size_t size() const { return layers_.size(); }
  Module& operator[](size_t i) const { return *layers_.at(i); }
  const std::vector<std::shared_ptr<Module>>& layers() const { return layers_; }

  AnyTensor forward_any(const AnyTensor& x) override {
    detail::ModuleScope scope(*this);
    return with_forward_hook([&] {
      AnyTensor h = x;
      for (auto& l : layers_) h = l->forward_any(h);
      return h;
    });
  }
  // Typed entry: the output has the input's type (every layer keeps the activation type).
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    return Tensor<T>(forward_any(x));
  }
  template <Element T>
  Tensor<T> operator()(const Tensor<T>& x) {
    return forward(x);
  }

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

}  // namespace ember::nn
