#pragma once
// nn::Embedding: a table of num_embeddings vectors of size embedding_dim, looked up by integer
// ids (int64 or int32), initialised N(0, 1) as torch.nn.Embedding. The output's type is the
// weight's type; forward_as<T> returns it cast to an activation type.
#include "ember/nn/init.hpp"
#include "ember/nn/module.hpp"

namespace ember::nn {

struct EmbeddingOptions {
  DType dtype = DType::Float32;
  Device device = Device::cpu();
};

class Embedding : public ModuleBase<Embedding> {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions opt = {}) {
    EMBER_CHECK(num_embeddings > 0 && embedding_dim > 0, ValueError, "Embedding: sizes must be positive, got ",
                num_embeddings, " x ", embedding_dim);
    weight = register_parameter("weight", AnyTensor::empty({num_embeddings, embedding_dim}, opt.dtype, opt.device, "Embedding"));
    init::normal_(weight);
  }
  std::string type_name() const override { return "Embedding"; }

  // ids [...] -> [..., embedding_dim] in the weight's dtype.
  AnyTensor lookup(const AnyTensor& ids) const { return op::embedding(weight, ids); }
  template <Element T, Element I>
  Tensor<T> forward_as(const Tensor<I>& ids) const {
    return param_as<T>(lookup(ids));
  }
  template <Element I>
    requires std::is_integral_v<I>
  AnyTensor forward(const Tensor<I>& ids) const {
    return lookup(ids);
  }
  template <Element T>
    requires(!std::is_integral_v<T>)
  Tensor<T> forward(const Tensor<T>& x) const {
    throw DTypeError(::ember::detail::str_cat("Embedding: ids must be int64 or int32, got ", x.desc()));
  }

  AnyTensor weight;

 protected:
  AnyTensor forward_other(const AnyTensor& ids) override { return lookup(ids); }
};

}  // namespace ember::nn
