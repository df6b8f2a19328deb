#pragma once
// nn::MultiheadAttention, as torch.nn.MultiheadAttention with kdim = vdim = embed_dim:
//   parameters  in_proj_weight [3E, E] (xavier_uniform), in_proj_bias [3E] (zeros),
//               out_proj.weight [E, E], out_proj.bias [E] (zeros) -- out_proj is an nn::Linear
//   (the state-dict names and order are PyTorch's, so weights move both ways).
// forward(query, key, value, {attn_mask, key_padding_mask, is_causal}) with batch_first inputs
// [N, L, E] (or [L, N, E] with batch_first = false; or unbatched [L, E]) returns [N, L, E].
// Scores are q k^T / sqrt(head_dim) (q is scaled first, as PyTorch does), masked additively and
// soft-maxed in fp32 for float16/bfloat16 activations (compute_t<T>); dropout on the attention
// weights in training when the dropout option is > 0. When query, key and value are the same
// tensor the three projections are one matmul.
// Incremental decoding: forward(x, cache, mask) is self-attention of x's positions over the keys
// and values a KVCache holds from earlier calls plus x's own, which it appends to the cache (see
// KVCache below). The calls without a cache are unchanged by it.
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <vector>
#include <utility>

#include "ember/nn/dropout.hpp"
#include "ember/nn/init.hpp"
#include "ember/nn/linear.hpp"
#include "ember/nn/module.hpp"

namespace ember::nn {

struct MultiheadAttentionOptions {
  bool bias = true;         // in_proj_bias and out_proj.bias
  bool batch_first = true;  // [N, L, E] (true) or [L, N, E] (false)
  double dropout = 0.0;     // on the attention weights, in training
  DType dtype = DType::Float32;
  Device device = Device::cpu();
};

// Masks for one forward call. Boolean masks are uint8 with nonzero = "may not attend" (PyTorch's
// True); float masks are added to the scores (use -inf to block).
struct AttentionMask {
  AnyTensor attn_mask;         // [L, S] or [N * num_heads, L, S]
  AnyTensor key_padding_mask;  // [N, S]
  // Position i may attend to positions j <= i only (the top-left aligned lower triangle, like
  // scaled_dot_product_attention's is_causal). Unlike PyTorch's MultiheadAttention, where
  // is_causal is only a hint about attn_mask, here it builds the mask itself.
  bool is_causal = false;
};

// The keys and values of one self-attention layer's earlier positions, for incremental decoding
// (Hugging Face's per-layer DynamicCache entry, nanoGPT-style models' past_key_values):
//   nn::KVCache cache;
//   auto y0 = attn.forward(prompt, cache, {.is_causal = true});  // [N, L0, E]; cache.length() == L0
//   auto y1 = attn.forward(next, cache, {.is_causal = true});    // [N, 1, E]: one new position
// Each call appends its positions' keys and values ([N, num_heads, L, head_dim], the activation
// type) with concat, as DynamicCache does: O(length) copying per call, the same order as the
// attention itself. Under grad mode the cached tensors keep their graph (a later backward reaches
// the earlier calls); generation runs inside an InferenceModeGuard, where nothing is recorded.
// One cache belongs to one layer and one batch of sequences: its batch, heads, head size, dtype
// and device are checked at every call.
struct KVCache {
  AnyTensor key, value;  // [N, H, S, D], undefined while empty
  int64_t length() const { return key.defined() && key.dim() == 4 ? key.shape()[2] : 0; }
  bool empty() const { return !key.defined(); }
  void clear() {
    key = AnyTensor();
    value = AnyTensor();
  }
};

namespace functional {
// Additive causal mask [L, S]: 0 where j <= i + offset, -inf elsewhere. With offset 0 it is the
// top-left aligned triangle (is_causal); with offset S - L, the bottom-right aligned one of L new
// queries at positions offset..offset+L-1 over S keys (a KV cache's). Built on the device with
// arange and a comparison (no host loop, no copy).
template <Element C>
Tensor<C> causal_mask(int64_t L, int64_t S, Device dev = Device::cpu(), int64_t offset = 0) {
  auto i = Tensor<C>::arange(static_cast<double>(offset), static_cast<double>(offset + L), 1.0, dev).reshape({L, 1});
  auto j = Tensor<C>::arange(0.0, static_cast<double>(S), 1.0, dev).reshape({1, S});
  return where(gt(j, i), Tensor<C>::full(Shape{}, -std::numeric_limits<double>::infinity(), dev),
               Tensor<C>::zeros(Shape{}, dev));
}

// A user mask as an additive float mask in C: uint8 (nonzero = blocked) becomes -inf / 0, a float
// mask is cast. Anything else is a DTypeError.
template <Element C>
Tensor<C> additive_mask(const char* op, const AnyTensor& m) {
  if (m.dtype() == DType::UInt8)
    return where(Tensor<uint8_t>(m), Tensor<C>::full(Shape{}, -std::numeric_limits<double>::infinity(), m.device()),
                 Tensor<C>::zeros(Shape{}, m.device()));
  EMBER_CHECK(is_floating(m.dtype()), DTypeError, op, ": a mask must be uint8 (nonzero = blocked) or floating point ",
              "(added to the scores), got ", m.desc());
  return Tensor<C>(m.to(dtype_of<C>));
}

// query, key and value defined and on one device.
inline void check_attention_inputs(const char* name, const AnyTensor& q, const AnyTensor& k, const AnyTensor& v) {
  op::detail::check_defined(name, q, "query");
  op::detail::check_defined(name, k, "key");
  op::detail::check_defined(name, v, "value");
  op::detail::check_same_device(name, q, k);
  op::detail::check_same_device(name, q, v);
}

// Options of scaled_dot_product_attention (torch.nn.functional.scaled_dot_product_attention's).
struct AttentionOptions {
  // Broadcastable to [..., L, S]: uint8 (nonzero = may not attend) or floating point (added).
  AnyTensor attn_mask;
  double dropout_p = 0.0;  // on the attention weights; applied whenever > 0, as PyTorch's functional
  bool is_causal = false;  // query i sees keys j <= i only (top-left aligned)
  std::optional<double> scale;  // default 1 / sqrt(D)
  // false: always the composite (matmul, softmax, matmul), the reference the fused kernel is
  // tested against. The fused kernel is taken otherwise when it applies (see below).
  bool allow_fused = true;
};

// Head sizes (D and Dv) up to which the CUDA kernel runs; larger heads take the composite on CUDA.
inline constexpr int64_t kFusedAttentionMaxHeadDim = 256;

// softmax(scale q k^T + mask) v over the last two dimensions: q [..., L, D], k [..., S, D],
// v [..., S, Dv] with the same leading dimensions; returns [..., L, Dv]. The fused kernel
// (op::fused_attention: one pass per direction, no [L, S] matrix per head) is used for float32
// and float64 without dropout when the mask needs no gradient (and, on CUDA, D, Dv <= 256); else
// the composite, whose scores and softmax are in compute_t<T> (fp32 for fp16/bf16). A row whose
// keys are all masked gives NaN on both paths (as PyTorch's math path).
template <Element T>
Tensor<T> scaled_dot_product_attention(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                       const AttentionOptions& o = {}, Generator& gen = default_generator()) {
  static_assert(std::is_floating_point_v<compute_t<T>>, "scaled_dot_product_attention: floating-point input only");
  using C = compute_t<T>;
  const char* name = "scaled_dot_product_attention";
  check_attention_inputs(name, q, k, v);
  check_dropout_p(name, o.dropout_p);
  const int rank = q.dim();
  EMBER_CHECK(rank >= 2 && k.dim() == rank && v.dim() == rank, ShapeError, name,
              ": query, key and value must have the same rank, at least 2 ([..., L, D]), got ", q.desc(), ", ",
              k.desc(), ", ", v.desc());
  auto lead_of = [](const AnyTensor& t) {
    std::vector<int64_t> s = t.shape().vec();
    s.resize(s.size() - 2);
    return s;
  };
  const std::vector<int64_t> lead = lead_of(q);
  const int64_t L = q.shape()[rank - 2], D = q.shape()[rank - 1];
  const int64_t S = k.shape()[rank - 2], Dv = v.shape()[rank - 1];
  EMBER_CHECK(lead_of(k) == lead && lead_of(v) == lead && k.shape()[rank - 1] == D && v.shape()[rank - 2] == S,
              ShapeError, name, ": query ", q.desc(), ", key ", k.desc(), " and value ", v.desc(),
              " must be [..., L, D], [..., S, D] and [..., S, Dv] with the same leading dimensions");
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(D, 1)));
  EMBER_CHECK(std::isfinite(scale), ValueError, name, ": scale must be finite, got ", scale);
  std::vector<int64_t> full = lead;
  full.push_back(L);
  full.push_back(S);
  if (o.attn_mask.defined()) {
    op::detail::check_same_device(name, q, o.attn_mask);
    const Shape b = op::detail::broadcast_shapes(name, o.attn_mask.shape(), Shape(full), " (attn_mask)", " (the scores)");
    EMBER_CHECK(b == Shape(full), ShapeError, name, ": attn_mask ", o.attn_mask.desc(),
                " does not broadcast to the scores' shape ", Shape(full).str());
  }
  const bool fused = o.allow_fused && (std::is_same_v<T, float> || std::is_same_v<T, double>) &&
                     o.dropout_p == 0.0 && (!o.attn_mask.defined() || !o.attn_mask.requires_grad()) &&
                     D >= 1 && Dv >= 1 && S >= 1 &&  // no key at all: the composite's zeros
                     (!q.device().is_cuda() || (D <= kFusedAttentionMaxHeadDim && Dv <= kFusedAttentionMaxHeadDim));
  if (fused) {
    int64_t bh = 1;
    for (int64_t d : lead) bh *= d;
    AnyTensor mask;
    int64_t group = 1;
    if (o.attn_mask.defined()) {
      // The mask is materialised over the leading dimensions it varies in; the trailing leading
      // dimensions it is broadcast over (heads, typically) become mask_group.
      Tensor<T> am = additive_mask<T>(name, o.attn_mask);
      const int r = static_cast<int>(lead.size()), mr = am.dim() - 2;
      auto mask_dim = [&](int t) -> int64_t {
        const int u = t - (r - mr);
        return u >= 0 ? am.shape()[u] : 1;
      };
      int p = r;
      while (p > 0 && mask_dim(p - 1) == 1) --p;
      std::vector<int64_t> target(lead.begin(), lead.begin() + p);
      int64_t outer = 1;
      for (int64_t d : target) outer *= d;
      for (int t = p; t < r; ++t) target.push_back(1);
      target.push_back(L);
      target.push_back(S);
      Tensor<T> m = expand(am, Shape(target));  // right-aligned, as every broadcast
      mask = p == 0 ? AnyTensor(m.reshape({L, S})) : AnyTensor(m.reshape({outer, L, S}));
      group = p == 0 ? 1 : bh / std::max<int64_t>(outer, 1);
    }
    AnyTensor out = op::fused_attention(q.reshape({bh, L, D}), k.reshape({bh, S, D}), v.reshape({bh, S, Dv}), mask,
                                        group, o.is_causal, scale);
    std::vector<int64_t> os = lead;
    os.push_back(L);
    os.push_back(Dv);
    return Tensor<T>(out.reshape(Shape(os)));
  }
  // The composite. q is scaled before the product (as nn::MultiheadAttention always did).
  Tensor<C> scores = matmul(q * scale, k, false, true).template to<C>();  // [..., L, S]
  if (o.is_causal) scores = scores + causal_mask<C>(L, S, scores.device());
  if (o.attn_mask.defined()) scores = scores + additive_mask<C>(name, o.attn_mask);
  Tensor<C> attn = softmax(scores, -1);
  if (o.dropout_p > 0.0) attn = dropout(attn, o.dropout_p, true, gen);
  return matmul(attn.template to<T>(), v);
}
}  // namespace functional

class MultiheadAttention : public ModuleBase<MultiheadAttention> {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, MultiheadAttentionOptions opt = {})
      : embed_dim_(embed_dim), num_heads_(num_heads), opt_(opt) {
    EMBER_CHECK(embed_dim > 0 && num_heads > 0, ValueError, "MultiheadAttention: embed_dim and num_heads must be ",
                "positive, got ", embed_dim, " and ", num_heads);
    EMBER_CHECK(embed_dim % num_heads == 0, ValueError, "MultiheadAttention: embed_dim ", embed_dim,
                " must be divisible by num_heads ", num_heads);
    functional::check_dropout_p("MultiheadAttention", opt.dropout);
    head_dim_ = embed_dim / num_heads;
    const int64_t E = embed_dim;
    in_proj_weight = register_parameter("in_proj_weight", AnyTensor::empty({3 * E, E}, opt.dtype, opt.device));
    init::xavier_uniform_(in_proj_weight);
    if (opt.bias) in_proj_bias = register_parameter("in_proj_bias", AnyTensor::zeros({3 * E}, opt.dtype, opt.device));
    out_proj = register_module(
        "out_proj", std::make_shared<Linear>(E, E, LinearOptions{.bias = opt.bias, .dtype = opt.dtype, .device = opt.device}));
    if (opt.bias) init::zeros_(out_proj->bias);
  }
  std::string type_name() const override { return "MultiheadAttention"; }

  // Self-attention without a mask (query = key = value = x).
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    return attend(x, x, x, AttentionMask{}, false, nullptr).first;
  }
  // Self-attention with masks: forward(x, {.is_causal = true}).
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x, const AttentionMask& mask) {
    return attend(x, x, x, mask, false, nullptr).first;
  }
  template <Element T>
  Tensor<T> forward(const Tensor<T>& query, const Tensor<T>& key, const Tensor<T>& value,
                    const AttentionMask& mask = {}) {
    return attend(query, key, value, mask, false, nullptr).first;
  }
  // Self-attention of x ([N, L, E], or as the layout options say) over the keys and values in
  // `cache` and x's own, which are appended to it. With mask.is_causal, x's position i is the
  // cache's position length() + i and sees the keys up to it (a bottom-right aligned mask; none
  // is needed for a single new position). attn_mask ([L, S] or [N * num_heads, L, S]) and
  // key_padding_mask ([N, S]) span all S = length() + L keys. Ends equal to the call on the whole
  // sequence at once, position by position (to rounding).
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x, KVCache& cache, const AttentionMask& mask = {}) {
    return attend(x, x, x, mask, false, &cache).first;
  }
  // The output and the attention weights averaged over heads, [N, L, S] in compute_t<T> (after
  // dropout, as PyTorch returns them).
  template <Element T>
  std::pair<Tensor<T>, Tensor<compute_t<T>>> forward_with_weights(const Tensor<T>& query, const Tensor<T>& key,
                                                                  const Tensor<T>& value,
                                                                  const AttentionMask& mask = {}) {
    return attend(query, key, value, mask, true, nullptr);
  }

  int64_t embed_dim() const { return embed_dim_; }
  int64_t num_heads() const { return num_heads_; }
  int64_t head_dim() const { return head_dim_; }
  const MultiheadAttentionOptions& options() const { return opt_; }

  AnyTensor in_proj_weight, in_proj_bias;
  std::shared_ptr<Linear> out_proj;

 private:
  template <Element T>
  std::pair<Tensor<T>, Tensor<compute_t<T>>> attend(const Tensor<T>& query, const Tensor<T>& key,
                                                    const Tensor<T>& value, const AttentionMask& mask,
                                                    bool need_weights, KVCache* cache) {
    static_assert(std::is_floating_point_v<compute_t<T>>, "MultiheadAttention: floating-point input only");
    using C = compute_t<T>;
    const char* name = "MultiheadAttention";
    functional::check_attention_inputs(name, query, key, value);
    const int rank = query.dim();
    EMBER_CHECK((rank == 3 || rank == 2) && key.dim() == rank && value.dim() == rank, ShapeError, name, "(",
                embed_dim_, ", ", num_heads_, "): query, key and value must all be 3-D (or all 2-D, unbatched), got ",
                query.desc(), ", ", key.desc(), ", ", value.desc());
    const int64_t E = embed_dim_, H = num_heads_, D = head_dim_;
    for (const AnyTensor* t : {&query, &key, &value})
      EMBER_CHECK(t->shape()[rank - 1] == E, ShapeError, name, "(", E, ", ", H, "): input ", t->desc(),
                  " must end in embed_dim ", E);
    const bool self_attn = query.same(key) && key.same(value);
    // To batch-first [N, L, E].
    auto to_nle = [&](const Tensor<T>& t) -> Tensor<T> {
      if (rank == 2) return unsqueeze(t, 0);
      return opt_.batch_first ? t : transpose(t, 0, 1);
    };
    Tensor<T> q_in = to_nle(query);
    Tensor<T> k_in = self_attn ? q_in : to_nle(key);
    Tensor<T> v_in = self_attn ? q_in : to_nle(value);
    const int64_t N = q_in.shape()[0], L = q_in.shape()[1];
    int64_t S = k_in.shape()[1];
    EMBER_CHECK(k_in.shape()[0] == N && v_in.shape()[0] == N, ShapeError, name, ": batch sizes differ: query ",
                query.desc(), ", key ", key.desc(), ", value ", value.desc());
    EMBER_CHECK(v_in.shape()[1] == S, ShapeError, name, ": key ", key.desc(), " and value ", value.desc(),
                " must have the same sequence length");

    // Input projections.
    Tensor<T> W = param_as<T>(in_proj_weight);
    Tensor<T> B = in_proj_bias.defined() ? param_as<T>(in_proj_bias) : Tensor<T>();
    Tensor<T> q, k, v;
    if (self_attn) {
      Tensor<T> qkv = linear(q_in, W, B);  // one GEMM, the bias inside it
      auto parts = split(qkv, {E, E, E}, -1);
      q = parts[0];
      k = parts[1];
      v = parts[2];
    } else {
      auto ws = split(W, {E, E, E}, 0);
      std::vector<Tensor<T>> bs = B.defined() ? split(B, {E, E, E}, 0) : std::vector<Tensor<T>>(3);
      q = linear(q_in, ws[0], bs[0]);
      k = linear(k_in, ws[1], bs[1]);
      v = linear(v_in, ws[2], bs[2]);
    }
    // Heads: [N, H, L, D].
    q = permute(q.reshape({N, L, H, D}), {0, 2, 1, 3});
    k = permute(k.reshape({N, S, H, D}), {0, 2, 1, 3});
    v = permute(v.reshape({N, S, H, D}), {0, 2, 1, 3});
    // With a cache: the earlier positions' keys and values go first, and x's are kept for the
    // next call. x's queries then sit at positions past..past+L-1 of the S keys.
    int64_t past = 0;
    if (cache) {
      if (!cache->empty()) {
        check_cache(*cache, query, N);
        past = cache->length();
        k = concat(std::vector<Tensor<T>>{Tensor<T>(cache->key), k}, 2);
        v = concat(std::vector<Tensor<T>>{Tensor<T>(cache->value), v}, 2);
        S = past + S;
      }
      cache->key = k;
      cache->value = v;
    }
    // The user's masks as one additive mask broadcastable to [N, H, L, S] (the causal one is a flag).
    Tensor<C> add;
    if (mask.attn_mask.defined()) {
      const AnyTensor& m = mask.attn_mask;
      op::detail::check_same_device(name, query, m);
      add = functional::additive_mask<C>(name, m);
      if (m.dim() == 2) {
        EMBER_CHECK(m.shape() == (Shape{L, S}), ShapeError, name, ": attn_mask ", m.desc(), " must be [L, S] = [", L,
                    ", ", S, "] or [N * num_heads, L, S]");
      } else {
        EMBER_CHECK(m.dim() == 3 && m.shape() == (Shape{N * H, L, S}), ShapeError, name, ": attn_mask ", m.desc(),
                    " must be [L, S] or [N * num_heads, L, S] = [", N * H, ", ", L, ", ", S, "]");
        add = add.reshape({N, H, L, S});
      }
    }
    if (mask.key_padding_mask.defined()) {
      const AnyTensor& m = mask.key_padding_mask;
      op::detail::check_same_device(name, query, m);
      EMBER_CHECK(m.shape() == (Shape{N, S}), ShapeError, name, ": key_padding_mask ", m.desc(), " must be [N, S] = [",
                  N, ", ", S, "]");
      Tensor<C> kp = functional::additive_mask<C>(name, m).reshape({N, 1, 1, S});
      add = add.defined() ? add + kp : kp;
    }
    // The causal mask as a flag (top-left aligned) unless queries follow cached positions: then
    // bottom-right aligned, as an additive mask (a single new query sees every key: no mask).
    bool causal = mask.is_causal;
    if (causal && past > 0) {
      causal = false;
      if (L > 1) {
        Tensor<C> cm = functional::causal_mask<C>(L, S, query.device(), past);
        add = add.defined() ? add + cm : cm;
      }
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    const bool dropout_now = is_training() && opt_.dropout > 0.0;
    Tensor<T> ctx;
    Tensor<C> attn;
    if (!need_weights && !dropout_now) {
      // The fused kernel where it applies (float32/float64), else the same composite as below.
      ctx = functional::scaled_dot_product_attention(q, k, v, {.attn_mask = add, .is_causal = causal,
                                                               .scale = scale});
    } else {
      Tensor<C> scores = matmul(q * scale, k, false, true).template to<C>();  // [N, H, L, S]
      if (causal) scores = scores + functional::causal_mask<C>(L, S, scores.device());
      if (add.defined()) scores = scores + add;
      attn = softmax(scores, -1);
      if (dropout_now) attn = functional::dropout(attn, opt_.dropout, true);
      ctx = matmul(attn.template to<T>(), v);  // [N, H, L, D]
    }
    ctx = permute(ctx, {0, 2, 1, 3}).reshape({N, L, E});              // [N, L, E]
    Tensor<T> out = (*out_proj)(ctx);
    Tensor<C> weights;
    if (need_weights) weights = mean(attn, {1});  // [N, L, S]
    if (rank == 2) {
      out = squeeze(out, 0);
      if (need_weights) weights = squeeze(weights, 0);
    } else if (!opt_.batch_first) {
      out = transpose(out, 0, 1);
    }
    return {out, weights};
  }

  // A non-empty cache must hold this layer's [N, H, S, D] keys and values of x's type and device.
  void check_cache(const KVCache& c, const AnyTensor& x, int64_t N) const {
    const char* name = "MultiheadAttention";
    EMBER_CHECK(c.value.defined() && c.key.dim() == 4 && c.value.shape() == c.key.shape(), ShapeError, name, "(",
                embed_dim_, ", ", num_heads_, "): the KV cache's key ", c.key.desc(), " and value ",
                c.value.desc(), " must both be [N, num_heads, S, head_dim]");
    const Shape& ks = c.key.shape();
    EMBER_CHECK(ks[0] == N && ks[1] == num_heads_ && ks[3] == head_dim_, ShapeError, name, "(", embed_dim_, ", ",
                num_heads_, "): the KV cache holds keys ", c.key.desc(), " but input ", x.desc(),
                " needs [", N, ", ", num_heads_, ", S, ", head_dim_, "] (batch ", N,
                "); a cache serves one layer and one batch of sequences");
    EMBER_CHECK(c.key.dtype() == x.dtype() && c.value.dtype() == x.dtype(), DTypeError, name, ": the KV cache holds ",
                c.key.desc(), " but the input is ", x.desc(), " (one activation type per cache)");
    EMBER_CHECK(c.key.device() == x.device() && c.value.device() == x.device(), DeviceError, name,
                ": the KV cache holds ", c.key.desc(), " but the input is ", x.desc());
  }

  int64_t embed_dim_, num_heads_, head_dim_ = 0;
  MultiheadAttentionOptions opt_;
};

}  // namespace ember::nn
