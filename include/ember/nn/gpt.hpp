#pragma once
// nn::GPT: GPT-2's architecture (Radford et al. 2019; nanoGPT's layout and initialisation):
//
//   x = drop(wte(ids) + wpe(positions))          token and position embeddings
//   x = h.i(x) for each block                    nn::TransformerBlock: pre-LN, causal attention, GELU(tanh) MLP
//   logits = ln_f(x) @ wte.weight^T              the LM head is the token embedding itself
//
// The head is tied for real: it is no module and no parameter of its own, so wte.weight appears
// once in named_parameters() and state_dict(), gets the head's and the embedding's gradients
// summed, and an optimizer steps it once.
//
//   nn::GPT gpt({.vocab_size = 50257, .block_size = 1024, .n_layer = 12, .n_head = 12, .n_embd = 768});
//   Tensor<float> logits = gpt(ids);              // ids int64 [N, L] -> [N, L, vocab_size]
//   auto lh = gpt.forward<bfloat16>(ids);         // activations in bf16 (fp32 parameters)
//   nn::GPTCache cache;                           // incremental decoding: positions after the cache's
//   auto l0 = gpt.forward(prompt, cache);  auto l1 = gpt.forward(next_ids, cache);
//   Tensor<int64_t> out = gpt.generate(prompt, {.max_new_tokens = 50, .temperature = 0.8, .top_k = 40,
//                                               .seed = 1});
//   auto hf = nn::GPT::from_huggingface("gpt2_dir");   gpt.save_huggingface("out_dir");
//
// State-dict names: wte.weight, wpe.weight, h.<i>.<TransformerBlock's names>, ln_f.weight,
// ln_f.bias. Hugging Face GPT2LMHeadModel's names and layouts: detail/gpt_huggingface.hpp, and
// docs/gpt.md for the whole mapping.
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ember/nn/dropout.hpp"
#include "ember/nn/embedding.hpp"
#include "ember/nn/init.hpp"
#include "ember/nn/norm.hpp"
#include "ember/nn/sampling.hpp"
#include "ember/nn/sequential.hpp"
#include "ember/nn/transformer.hpp"

namespace ember::nn {

// GPT-2's hyperparameters (the defaults are GPT-2 124M's) and nanoGPT's dropout and bias.
struct GPTConfig {
  int64_t vocab_size = 50257;
  int64_t block_size = 1024;  // the longest sequence, the rows of wpe: GPT-2's n_positions
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  int64_t n_inner = 0;        // the MLP's width; 0: 4 * n_embd (GPT-2's n_inner = null)
  double dropout = 0.0;       // embeddings, attention weights and both residual branches
  bool bias = true;           // biases of the LayerNorms and Linears (GPT-2 has them)
  double layer_norm_eps = 1e-5;
  DType dtype = DType::Float32;  // of the parameters
  Device device = Device::cpu();
};

// The KV caches of every block for one batch of sequences (see nn::KVCache): what
// forward(ids, cache) reads and extends. Empty at first; length() positions after each call.
struct GPTCache {
  std::vector<KVCache> layers;  // one per block, made by the first forward
  int64_t length() const { return layers.empty() ? 0 : layers[0].length(); }
  bool empty() const { return length() == 0; }
  void clear() { layers.clear(); }
};

struct GenerateOptions {
  int64_t max_new_tokens = 20;
  double temperature = 1.0;  // 0: greedy (argmax)
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // 1: off
  // Draws come from Generator(seed) when set (the same seed repeats the same tokens), else from
  // the thread's default generator. Either way it is the default generator for the whole call
  // (GeneratorScope), so a model left in training mode draws its dropout masks from it too.
  std::optional<uint64_t> seed;
  // false: every step runs the whole sequence again (the reference the cache is tested against).
  bool use_cache = true;
};

// Options of GPT::from_huggingface.
struct HuggingFaceOptions {
  DType dtype = DType::Float32;  // of the parameters made (the file's F16/BF16/F32 is converted)
  Device device = Device::cpu();
  // GPTConfig has one dropout; a config.json whose attn_pdrop, resid_pdrop and embd_pdrop differ
  // needs this to say which rate to use (they only matter for training).
  std::optional<double> dropout;
};

class GPT : public ModuleBase<GPT> {
 public:
  explicit GPT(const GPTConfig& config = {}) : cfg_(config) {
    const char* name = "GPT";
    EMBER_CHECK(config.vocab_size > 0 && config.block_size > 0 && config.n_layer > 0 && config.n_head > 0 &&
                    config.n_embd > 0 && config.n_inner >= 0,
                ValueError, name, ": vocab_size, block_size, n_layer, n_head and n_embd must be positive and n_inner ",
                ">= 0, got vocab_size ", config.vocab_size, ", block_size ", config.block_size, ", n_layer ",
                config.n_layer, ", n_head ", config.n_head, ", n_embd ", config.n_embd, ", n_inner ", config.n_inner);
    EMBER_CHECK(config.n_embd % config.n_head == 0, ValueError, name, ": n_embd ", config.n_embd,
                " must be divisible by n_head ", config.n_head);
    functional::check_dropout_p(name, config.dropout);
    EMBER_CHECK(is_floating(config.dtype), DTypeError, name, ": parameters must be floating point, got ",
                dtype_name(config.dtype));
    const EmbeddingOptions eo{.dtype = config.dtype, .device = config.device};
    wte = register_module("wte", std::make_shared<Embedding>(config.vocab_size, config.n_embd, eo));
    wpe = register_module("wpe", std::make_shared<Embedding>(config.block_size, config.n_embd, eo));
    drop = register_module("drop", std::make_shared<Dropout>(config.dropout));
    h = register_module("h", std::make_shared<Sequential>());
    const TransformerBlockOptions bo{.hidden_dim = config.n_inner, .dropout = config.dropout, .bias = config.bias,
                                     .eps = config.layer_norm_eps, .is_causal = true, .dtype = config.dtype,
                                     .device = config.device};
    for (int64_t i = 0; i < config.n_layer; ++i)
      blocks_.push_back(h->emplace<TransformerBlock>(config.n_embd, config.n_head, bo));
    ln_f = register_module("ln_f", std::make_shared<LayerNorm>(
                                       config.n_embd, LayerNormOptions{.eps = config.layer_norm_eps,
                                                                       .bias = config.bias, .dtype = config.dtype,
                                                                       .device = config.device}));
    init_weights();
  }
  std::string type_name() const override { return "GPT"; }
  std::string extra_repr() const override {
    return ::ember::detail::str_cat("vocab_size=", cfg_.vocab_size, ", block_size=", cfg_.block_size,
                                    ", n_layer=", cfg_.n_layer, ", n_head=", cfg_.n_head, ", n_embd=", cfg_.n_embd,
                                    ", lm_head=wte.weight (tied)");
  }

  // GPT-2's initialisation, as nanoGPT's _init_weights: every Linear weight and both embeddings
  // N(0, 0.02), biases zero, LayerNorms ones and zeros, and the two projections into the residual
  // stream (attn.out_proj.weight, GPT-2's attn.c_proj, and mlp.c_proj.weight) N(0, 0.02 /
  // sqrt(2 n_layer)). The constructor calls it; draws from `gen`, in registration order.
  void init_weights(Generator& gen = default_generator()) {
    const double sd = 0.02, proj_sd = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg_.n_layer));
    init::normal_(wte->weight, 0.0, sd, gen);
    init::normal_(wpe->weight, 0.0, sd, gen);
    for (auto& b : blocks_) {
      init::ones_(b->ln_1->weight);
      init::ones_(b->ln_2->weight);
      init::normal_(b->attn->in_proj_weight, 0.0, sd, gen);
      init::normal_(b->attn->out_proj->weight, 0.0, proj_sd, gen);
      init::normal_(b->mlp->c_fc->weight, 0.0, sd, gen);
      init::normal_(b->mlp->c_proj->weight, 0.0, proj_sd, gen);
      if (cfg_.bias)
        for (AnyTensor* t : {&b->ln_1->bias, &b->ln_2->bias, &b->attn->in_proj_bias, &b->attn->out_proj->bias,
                             &b->mlp->c_fc->bias, &b->mlp->c_proj->bias})
          init::zeros_(*t);
    }
    init::ones_(ln_f->weight);
    if (cfg_.bias) init::zeros_(ln_f->bias);
  }

  // ids [N, L] (int64 or int32) -> logits [N, L, vocab_size] in the activation type T (float by
  // default; the parameters are cast with param_as<T>). L <= block_size.
  template <Element T = float, Element I>
    requires(std::is_integral_v<I> && !std::is_integral_v<T>)
  Tensor<T> forward(const Tensor<I>& ids) {
    return head(hidden<T>(ids, nullptr));
  }
  // The positions after the cache's: ids [N, L] are positions cache.length() ..
  // cache.length() + L - 1 (at most block_size in all); their keys and values join the cache.
  // Returns their logits [N, L, vocab_size], equal (to rounding) to the rows of one forward over
  // the whole sequence.
  template <Element T = float, Element I>
    requires(std::is_integral_v<I> && !std::is_integral_v<T>)
  Tensor<T> forward(const Tensor<I>& ids, GPTCache& cache) {
    return head(hidden<T>(ids, &cache));
  }
  template <Element T>
    requires(!std::is_integral_v<T>)
  Tensor<T> forward(const Tensor<T>& x) {
    throw DTypeError(::ember::detail::str_cat("GPT: ids must be int64 or int32 token ids [N, L], got ", x.desc()));
  }

  // The last hidden states, ln_f(x) [N, L, n_embd], in T (what the head multiplies by wte.weight).
  // With a cache, as forward(ids, cache).
  template <Element T = float, Element I>
    requires(std::is_integral_v<I> && !std::is_integral_v<T>)
  Tensor<T> hidden(const Tensor<I>& ids, GPTCache* cache = nullptr) {
    const char* name = "GPT";
    op::detail::check_defined(name, ids, "ids");
    EMBER_CHECK(ids.dtype() == DType::Int64 || ids.dtype() == DType::Int32, DTypeError, name,
                ": ids must be int64 or int32 token ids, got ", ids.desc());
    EMBER_CHECK(ids.dim() == 2 && ids.shape()[1] >= 1, ShapeError, name,
                ": ids must be [N, L] token ids with L >= 1, got ", ids.desc());
    EMBER_CHECK(ids.device() == wte->weight.device(), DeviceError, name, ": ids ", ids.desc(),
                " must be on the model's device ", wte->weight.device().str());
    const int64_t N = ids.shape()[0], L = ids.shape()[1];
    int64_t past = 0;
    if (cache) {
      EMBER_CHECK(cache->layers.empty() || static_cast<int64_t>(cache->layers.size()) == cfg_.n_layer, ValueError,
                  name, ": the cache has ", cache->layers.size(), " layers, this model ", cfg_.n_layer,
                  " (a GPTCache serves one model)");
      if (cache->layers.empty()) cache->layers.resize(static_cast<size_t>(cfg_.n_layer));
      past = cache->length();
      if (past > 0)
        EMBER_CHECK(cache->layers[0].key.shape()[0] == N, ShapeError, name, ": the cache holds ",
                    cache->layers[0].key.shape()[0], " sequences but ids ", ids.desc(), " has ", N,
                    " (a GPTCache serves one batch; clear() it for another)");
    }
    EMBER_CHECK(past + L <= cfg_.block_size, ShapeError, name, ": ", past > 0 ? "the cache's " : "",
                past > 0 ? std::to_string(past) + " positions + " : std::string(), "ids ", ids.desc(), " = ",
                past + L, " positions exceed block_size ", cfg_.block_size, " (the rows of wpe)");
    const Tensor<int64_t> pos = Tensor<int64_t>::arange(static_cast<double>(past), static_cast<double>(past + L), 1.0,
                                                        ids.device());
    AnyTensor e;
    {
      detail::ModuleScope s_wte(*wte);
      e = wte->lookup(ids);  // [N, L, E] in the parameters' dtype
    }
    {
      detail::ModuleScope s_wpe(*wpe);
      e = op::add(e, wpe->lookup(pos));  // + [L, E], broadcast over the batch, before any cast (HF's order)
    }
    Tensor<T> x = (*drop)(param_as<T>(e));
    {
      detail::ModuleScope s_h(*h);
      for (size_t i = 0; i < blocks_.size(); ++i) {
        TransformerBlock& b = *blocks_[i];
        if (!cache) {
          x = b(x);
        } else {
          autograd::detail::AnomalyModuleFrame anomaly_frame(b);
          detail::ModuleScope s_block(b);
          x = b.forward(x, cache->layers[i]);
        }
      }
    }
    return (*ln_f)(x);
  }
  // The tied LM head: hidden [..., n_embd] -> logits [..., vocab_size] = hidden @ wte.weight^T.
  template <Element T>
  Tensor<T> head(const Tensor<T>& hidden_states) const {
    EMBER_CHECK(hidden_states.dim() >= 1 && hidden_states.shape()[hidden_states.dim() - 1] == cfg_.n_embd, ShapeError,
                "GPT.head: hidden states ", hidden_states.desc(), " must end in n_embd ", cfg_.n_embd);
    return linear(hidden_states, param_as<T>(wte->weight), Tensor<T>());
  }

  // Continues every prompt of `prompt` [N, L] (int64 or int32) by max_new_tokens tokens, inside an
  // InferenceModeGuard; returns [N, L + max_new_tokens] int64 (the prompt first). Each step feeds
  // only the new token through the blocks, with the keys and values of the earlier ones from a
  // GPTCache (use_cache = false: the whole sequence each step), and takes the head of the last
  // position only. The sequence fed must fit the position table: L + max_new_tokens - 1 <=
  // block_size (the last token is chosen, never fed). Sampling: nn/sampling.hpp. No end-of-text
  // stop: every sequence gets max_new_tokens tokens. T is the activation type of the forwards.
  template <Element T = float, Element I>
    requires(std::is_integral_v<I> && !std::is_integral_v<T>)
  Tensor<int64_t> generate(const Tensor<I>& prompt, const GenerateOptions& o = {}) {
    const char* name = "GPT::generate";
    const SamplingOptions so{.temperature = o.temperature, .top_k = o.top_k, .top_p = o.top_p};
    check_sampling_options(name, so);
    EMBER_CHECK(o.max_new_tokens >= 0, ValueError, name, ": max_new_tokens must be >= 0, got ", o.max_new_tokens);
    op::detail::check_defined(name, prompt, "prompt");
    EMBER_CHECK(prompt.dim() == 2 && prompt.shape()[0] >= 1 && prompt.shape()[1] >= 1, ShapeError, name,
                ": the prompt must be [N, L] token ids with N, L >= 1, got ", prompt.desc());
    const int64_t N = prompt.shape()[0], L = prompt.shape()[1];
    EMBER_CHECK(L + o.max_new_tokens - 1 <= cfg_.block_size, ShapeError, name, ": the prompt ", prompt.desc(),
                " and max_new_tokens ", o.max_new_tokens, " feed ", L + o.max_new_tokens - 1,
                " positions, more than block_size ", cfg_.block_size, " (the rows of wpe)");
    InferenceModeGuard inference;
    std::optional<Generator> own;
    if (o.seed) own.emplace(*o.seed);
    Generator& gen = own ? *own : default_generator();
    GeneratorScope use(gen);
    Tensor<int64_t> tokens(AnyTensor(prompt).to(DType::Int64));
    Tensor<int64_t> feed = tokens;
    GPTCache cache;
    for (int64_t step = 0; step < o.max_new_tokens; ++step) {
      const Tensor<T> hs = o.use_cache ? hidden<T>(feed, &cache) : hidden<T>(tokens, nullptr);
      const int64_t last = hs.shape()[1] - 1;
      const Tensor<T> h_last = index_select(hs, 1, Tensor<int64_t>::full({1}, static_cast<double>(last), hs.device()));
      const Tensor<T> logits = head(h_last).reshape({N, cfg_.vocab_size});
      feed = sample_next_token(logits, so, gen, name).reshape({N, 1});
      tokens = concat(std::vector<Tensor<int64_t>>{tokens, feed}, 1);
    }
    return tokens;
  }

  // ---- Hugging Face transformers' GPT2LMHeadModel (defined in detail/gpt_huggingface.hpp) ----
  // A model from a folder that save_pretrained wrote (config.json and model.safetensors, or the
  // shards of model.safetensors.index.json), or from one .safetensors file with config.json beside it;
  // in eval mode, as transformers' from_pretrained returns it.
  static std::shared_ptr<GPT> from_huggingface(const std::filesystem::path& dir_or_file,
                                               const HuggingFaceOptions& options = {});
  // The weights of such a folder or file into this model (its config.json must describe this model).
  void load_huggingface(const std::filesystem::path& dir_or_file);
  // model.safetensors (HF names, Conv1D layouts, no lm_head.weight: transformers ties it) and
  // config.json into `dir` (made if missing), each written atomically.
  void save_huggingface(const std::filesystem::path& dir) const;
  // The parameters under HF's names, Conv1D weights transposed to [in, out] (new tensors).
  io::TensorList huggingface_state_dict() const;
  // Loads HF-named tensors (with or without the "transformer." prefix); `source` names them in errors.
  void load_huggingface_state_dict(const io::TensorList& tensors, const std::string& source = "<tensors>");
  // config.json's GPT2Config fields for this model, and a GPTConfig from such a file's JSON.
  nlohmann::ordered_json huggingface_config() const;
  static GPTConfig config_from_huggingface(const nlohmann::json& config, const std::string& source = "config.json",
                                           const HuggingFaceOptions& options = {});

  const GPTConfig& config() const { return cfg_; }
  // The blocks of h, typed (h->layers() holds the same modules as Module pointers).
  const std::vector<std::shared_ptr<TransformerBlock>>& blocks() const { return blocks_; }
  // The LM head's weight [vocab_size, n_embd]: wte.weight itself.
  const AnyTensor& lm_head_weight() const { return wte->weight; }

  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<Sequential> h;  // h.0 .. h.<n_layer - 1>: TransformerBlock
  std::shared_ptr<LayerNorm> ln_f;

 protected:
  AnyTensor forward_other(const AnyTensor& ids) override {
    if (ids.dtype() == DType::Int64) return forward(Tensor<int64_t>(ids));
    if (ids.dtype() == DType::Int32) return forward(Tensor<int32_t>(ids));
    throw DTypeError(::ember::detail::str_cat("GPT: ids must be int64 or int32 token ids [N, L], got ", ids.desc()));
  }

 private:
  GPTConfig cfg_;
  std::vector<std::shared_ptr<TransformerBlock>> blocks_;
};

}  // namespace ember::nn

#include "ember/nn/detail/gpt_huggingface.hpp"
