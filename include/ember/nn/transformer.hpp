#pragma once
// nn::TransformerBlock: the GPT-2 style pre-LayerNorm decoder block,
//   x = x + dropout(attn(ln_1(x), causal))
//   x = x + mlp(ln_2(x)),   mlp = c_fc: Linear(E, 4E) -> GELU(tanh) -> c_proj: Linear(4E, E) -> dropout
// Parameter names (the state dict, in this order):
//   ln_1.weight ln_1.bias
//   attn.in_proj_weight attn.in_proj_bias attn.out_proj.weight attn.out_proj.bias
//   ln_2.weight ln_2.bias
//   mlp.c_fc.weight mlp.c_fc.bias mlp.c_proj.weight mlp.c_proj.bias
// ln_* and mlp.* match nanoGPT / Hugging Face GPT-2; attn is nn::MultiheadAttention with
// PyTorch's names (GPT-2's attn.c_attn.weight is attn.in_proj_weight transposed, and
// attn.c_proj is attn.out_proj with its weight transposed -- GPT-2 stores Conv1D weights [in, out]).
// Dropout (default 0) applies to the attention weights and to both residual branches.
// forward(x, cache) is the same block for incremental decoding: the attention also sees the keys
// and values of the earlier positions that an nn::KVCache holds, and appends x's (attention.hpp).
#include <memory>

#include "ember/nn/activation.hpp"
#include "ember/nn/attention.hpp"
#include "ember/nn/dropout.hpp"
#include "ember/nn/linear.hpp"
#include "ember/nn/norm.hpp"

namespace ember::nn {

struct TransformerBlockOptions {
  int64_t hidden_dim = 0;  // width of the MLP; 0 means 4 * embed_dim
  double dropout = 0.0;
  bool bias = true;        // biases of the LayerNorms, attention and MLP
  double eps = 1e-5;       // LayerNorm eps
  bool is_causal = true;   // causal self-attention (GPT); false for an encoder-style block
  DType dtype = DType::Float32;
  Device device = Device::cpu();
};

// The block's feed-forward part: c_fc -> GELU(tanh) -> c_proj -> dropout, c_fc and its GELU as
// one op (Linear::forward_with: the same bits as the two on the CPU).
class TransformerMLP : public ModuleBase<TransformerMLP> {
 public:
  TransformerMLP(int64_t embed_dim, int64_t hidden_dim, double dropout = 0.0, bool bias = true,
                 DType dtype = DType::Float32, Device device = Device::cpu()) {
    LinearOptions lo{.bias = bias, .dtype = dtype, .device = device};
    c_fc = register_module("c_fc", std::make_shared<Linear>(embed_dim, hidden_dim, lo));
    c_proj = register_module("c_proj", std::make_shared<Linear>(hidden_dim, embed_dim, lo));
    drop = register_module("dropout", std::make_shared<Dropout>(dropout));
  }
  std::string type_name() const override { return "TransformerMLP"; }
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    return (*drop)((*c_proj)(c_fc->forward_with(x, LinearActivation::GeluTanh)));
  }
  std::shared_ptr<Linear> c_fc, c_proj;
  std::shared_ptr<Dropout> drop;
};

class TransformerBlock : public ModuleBase<TransformerBlock> {
 public:
  TransformerBlock(int64_t embed_dim, int64_t num_heads, TransformerBlockOptions opt = {}) : opt_(opt) {
    EMBER_CHECK(opt.hidden_dim >= 0, ValueError, "TransformerBlock: hidden_dim must be non-negative, got ",
                opt.hidden_dim);
    const int64_t hidden = opt.hidden_dim > 0 ? opt.hidden_dim : 4 * embed_dim;
    LayerNormOptions lno{.eps = opt.eps, .elementwise_affine = true, .bias = opt.bias, .dtype = opt.dtype,
                         .device = opt.device};
    ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(std::vector<int64_t>{embed_dim}, lno));
    attn = register_module("attn", std::make_shared<MultiheadAttention>(
                                       embed_dim, num_heads,
                                       MultiheadAttentionOptions{.bias = opt.bias, .batch_first = true,
                                                                 .dropout = opt.dropout, .dtype = opt.dtype,
                                                                 .device = opt.device}));
    ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(std::vector<int64_t>{embed_dim}, lno));
    mlp = register_module("mlp", std::make_shared<TransformerMLP>(embed_dim, hidden, opt.dropout, opt.bias, opt.dtype,
                                                                  opt.device));
    resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(opt.dropout));
  }
  std::string type_name() const override { return "TransformerBlock"; }

  // x: [N, L, E] (batch first).
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    return run(x, nullptr);
  }
  // x: [N, L, E], the positions that follow those held in `cache` (this block's own cache).
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x, KVCache& cache) {
    return run(x, &cache);
  }

  const TransformerBlockOptions& options() const { return opt_; }
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<MultiheadAttention> attn;
  std::shared_ptr<TransformerMLP> mlp;
  std::shared_ptr<Dropout> resid_dropout;

 private:
  template <Element T>
  Tensor<T> run(const Tensor<T>& x, KVCache* cache) {
    Tensor<T> h = (*ln_1)(x);
    AttentionMask mask;
    mask.is_causal = opt_.is_causal;
    Tensor<T> a;
    {
      detail::ModuleScope scope(*attn);  // a call past operator(): tell the profiler
      a = cache ? attn->forward(h, *cache, mask) : attn->forward(h, mask);
    }
    Tensor<T> y = x + (*resid_dropout)(a);
    return y + (*mlp)((*ln_2)(y));
  }

  TransformerBlockOptions opt_;
};

}  // namespace ember::nn
