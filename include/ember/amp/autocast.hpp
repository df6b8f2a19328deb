#pragma once
// The weight cast cache of mixed precision, modelled on torch.autocast's.
//
// In ember a module's forward is a template over the activation type: nn::Linear::forward<half>
// casts its fp32 master weight to half with nn::param_as<half>(weight) wherever it uses it. Without
// a cache a weight used several times in one step (a tied embedding, a layer applied to several
// inputs, every micro-batch of an accumulated step) is cast again at each use, and each cast is a
// new kernel and a new fp16 copy of the weight. While an amp::CastCacheGuard is alive on a thread,
// param_as caches those casts, as torch.autocast's cast cache does:
//
//   {
//     amp::CastCacheGuard cache;            // casts made from here on are kept
//     auto loss = loss_fn(model(x.to<half>()), y);
//     scaler.scale(loss).backward();
//   }                                        // the cache is emptied here
//   scaler.step(opt);                        // the weights change: casts made before are stale
//
// - Key: the parameter's TensorImpl and the target dtype (and the parameter's storage, so a
//   module moved by Module::to inside the scope is cast again). What is cached: the cast tensor
//   together with its autograd node, so every use of the cached cast sends its gradient through the
//   one node to the fp32 master weight's .grad.
// - What is cached (torch's rule, can_try_cache in ATen's autocast_mode.cpp): a floating-point
//   leaf that requires grad (a parameter) cast to another floating dtype, and (unlike torch) only
//   while grad mode is on: a cast made under NoGradGuard has no autograd node, and torch's cache
//   would hand it to a later forward with grad on, whose gradient would then never reach the
//   weight (Apex's cache guards against the same). torch caches only fp32 -> the autocast dtype;
//   here any floating dtype pair. Buffers (BatchNorm's running statistics, which change during the
//   forward), non-leaf tensors and casts under NoGradGuard are cast as usual, every time.
// - Lifetime: nested guards share one cache, emptied when the outermost guard ends (torch empties
//   its cache when the outermost autocast region exits). The cache is per thread.
// - The node of a cached cast saves no tensor, so unlike the other nodes it survives a backward
//   pass: a scope may hold the forward and backward passes of all the micro-batches of one
//   accumulated step, and the weights are then cast once per step rather than once per micro-batch.
// - End the scope before the optimizer step. The cache does not see a parameter change in place
//   (optimizer steps, load_state_dict, copy_): a cast made before the change would be reused after
//   it. amp::clear_cast_cache() empties the cache inside a scope.
// - Gradient precision: when a cached cast is used n times, autograd adds the n incoming gradients
//   in the activation type (fp16) and converts their sum to fp32 once, where n separate casts
//   would convert each to fp32 and add in fp32. torch's cache behaves the same; the difference is
//   fp16 rounding of the sum.
#include <cstdint>
#include <map>
#include <memory>
#include <utility>

#include "ember/core/tensor.hpp"

namespace ember::amp {

// Counters of the current thread's cache (cumulative: compare before and after).
struct CastCacheStats {
  int64_t casts = 0;    // casts made and stored in the cache
  int64_t hits = 0;     // uses served from the cache
  int64_t entries = 0;  // casts held now
};

namespace detail {

// The backward of a cached cast: the gradient converted back to the parameter's dtype. It saves
// no tensor, so release() (the base's no-op) leaves it usable by the next backward pass.
class CachedCastBackward final : public autograd::Node {
 public:
  explicit CachedCastBackward(DType from) : Node("CachedCastBackward"), from_(from) {}
  std::vector<AnyTensor> apply(std::vector<AnyTensor>&& grad_outputs) override {
    const AnyTensor& g = grad_outputs.at(0);
    return {g.defined() ? g.to(from_) : AnyTensor()};
  }

 private:
  DType from_;
};

struct CastCacheEntry {
  std::shared_ptr<TensorImpl> source;  // keeps the key's address from being reused while cached
  const Storage* storage = nullptr;    // the source's storage when the cast was made
  int64_t offset = 0;
  AnyTensor cast;
};

struct CastCacheState {
  int depth = 0;  // live guards on this thread
  std::map<std::pair<const TensorImpl*, DType>, CastCacheEntry> entries;
  int64_t casts = 0;
  int64_t hits = 0;
};

inline CastCacheState& cast_cache_state() {
  thread_local CastCacheState state;
  return state;
}

// torch's can_try_cache: a floating leaf that requires grad, cast to another floating dtype, with
// grad mode on.
inline bool cacheable(const AnyTensor& p, DType to) {
  return is_grad_enabled() && p.defined() && p.is_leaf() && p.requires_grad() && is_floating(p.dtype()) &&
         is_floating(to) && p.dtype() != to;
}

// A differentiable cast whose node survives backward passes (see CachedCastBackward).
inline AnyTensor reusable_cast(const AnyTensor& p, DType to) {
  AnyTensor out;
  {
    NoGradGuard no_grad;
    out = p.to(to);
  }
  auto node = std::make_shared<CachedCastBackward>(p.dtype());
  node->next.push_back(autograd::gradient_edge(p));
  node->inputs.push_back({p.dtype(), p.device(), p.shape()});
  node->outputs.push_back({to, out.device(), out.shape()});
  out.impl()->grad_fn = std::move(node);
  out.impl()->output_nr = 0;
  return out;
}
}  // namespace detail

// True while a CastCacheGuard is alive on this thread.
inline bool cast_cache_enabled() { return detail::cast_cache_state().depth > 0; }

inline CastCacheStats cast_cache_stats() {
  const auto& s = detail::cast_cache_state();
  return {s.casts, s.hits, static_cast<int64_t>(s.entries.size())};
}

// Empties this thread's cache (the guards stay alive; later casts fill it again).
inline void clear_cast_cache() { detail::cast_cache_state().entries.clear(); }

// p as dtype `to`: p itself when the dtypes agree; inside a CastCacheGuard a cacheable parameter's
// cached cast (made on first use); otherwise a plain differentiable cast. nn::param_as calls this.
inline AnyTensor cast_parameter(const AnyTensor& p, DType to) {
  if (p.dtype() == to) return p;
  auto& st = detail::cast_cache_state();
  if (st.depth == 0 || !detail::cacheable(p, to)) return p.to(to);
  const auto key = std::make_pair(static_cast<const TensorImpl*>(p.impl()), to);
  auto it = st.entries.find(key);
  const Storage* storage = p.impl()->storage.get();
  const int64_t offset = p.impl()->offset;
  if (it != st.entries.end()) {
    const detail::CastCacheEntry& e = it->second;
    if (e.storage == storage && e.offset == offset && e.cast.device() == p.device()) {
      ++st.hits;
      return e.cast;
    }
    st.entries.erase(it);  // the parameter was moved (Module::to) since: cast again
  }
  AnyTensor cast = detail::reusable_cast(p, to);
  st.entries.emplace(key, detail::CastCacheEntry{p.impl_ptr(), storage, offset, cast});
  ++st.casts;
  return cast;
}

// While alive, nn::param_as caches the casts of parameters (see the header comment). Nested
// guards share the cache; the outermost one empties it when it ends.
class CastCacheGuard {
 public:
  CastCacheGuard() { ++detail::cast_cache_state().depth; }
  ~CastCacheGuard() {
    auto& st = detail::cast_cache_state();
    if (--st.depth == 0) st.entries.clear();
  }
  CastCacheGuard(const CastCacheGuard&) = delete;
  CastCacheGuard& operator=(const CastCacheGuard&) = delete;
};

}  // namespace ember::amp
