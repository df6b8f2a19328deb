#pragma once
// All of ember::nn but the GPT model and its sampler (<ember/nn/gpt.hpp>, <ember/nn/sampling.hpp>):
// a program that uses them includes them, and the others do not compile them.
#include "ember/nn/activation.hpp"
#include "ember/nn/attention.hpp"
#include "ember/nn/conv.hpp"
#include "ember/nn/dropout.hpp"
#include "ember/nn/embedding.hpp"
#include "ember/nn/init.hpp"
#include "ember/nn/linear.hpp"
#include "ember/nn/loss.hpp"
#include "ember/nn/module.hpp"
#include "ember/nn/norm.hpp"
#include "ember/nn/pool.hpp"
#include "ember/nn/recompute.hpp"
#include "ember/nn/sequential.hpp"
#include "ember/nn/transformer.hpp"

// The layers above, for the compiled library (EMBER_COMPILED_LIB, core/macros.hpp): each one's
// untyped forward (ModuleBase<Layer>::forward_any, which instantiates its forward<T> for the four
// floating-point types) is compiled once, in src/nn.cpp, instead of in every file.
#define EMBER_NN_LAYERS(X) X(AdaptiveAvgPool2d) X(AvgPool2d) X(BatchNorm1d) X(BatchNorm2d) \
  X(Conv2d) X(Dropout) X(Embedding) X(Flatten) X(GELU) X(Identity) X(LayerNorm) X(Linear) \
  X(LogSoftmax) X(MaxPool2d) X(MultiheadAttention) X(ReLU) X(RMSNorm) X(SiLU) X(Sigmoid) \
  X(Softmax) X(Tanh) X(TransformerBlock) X(TransformerMLP)
#if defined(EMBER_COMPILED_LIB)
namespace ember::nn {
#define EMBER_NN_EXTERN_LAYER(L) extern template class ModuleBase<L>;
EMBER_NN_LAYERS(EMBER_NN_EXTERN_LAYER)
#undef EMBER_NN_EXTERN_LAYER
}  // namespace ember::nn
#endif
