#pragma once
// Recomputation of activations: a segment of the forward keeps none of its activations, and the
// backward runs it again to get them (PyTorch's reentrant implementation, use_reentrant=True,
// is the model; docs/api.md gives PyTorch's name for the technique):
//
//   y = nn::recompute(fn, inputs...);            // fn(inputs...) -> a tensor (or a vector of them)
//   y = nn::recompute_sequential(seq, 4, x);     // an nn::Sequential in 4 segments
//
// The forward runs fn under NoGradGuard, so none of its activations are kept: the tape gets ONE
// node, "RecomputeBackward", whose inputs are the tensor arguments and which keeps only those
// arguments (and fn). Its backward
//   1. makes a copy of the default generator's (seed, offset) from before the forward the
//      backward thread's default generator (a GeneratorScope, core/random.hpp), so dropout inside
//      fn draws the same masks,
//   2. re-runs fn with grad mode on, on detached copies of the tensor arguments (each requiring
//      grad exactly when the original does),
//   3. ends that scope: the generator itself was never rewound, so recomputation neither changes
//      later random draws nor disturbs other threads drawing from a shared generator meanwhile,
//   4. runs autograd::backward through the recomputed graph with the incoming gradients: the
//      parameters fn uses (leaves) receive their gradients there, and the gradients of the
//      detached copies are returned as the gradients of the arguments.
// On the CPU the gradients are bitwise those of the same computation without recomputation.
// Recomputed segments nest (an nn::recompute inside fn runs plainly in the outer forward and
// records itself during the outer recomputation), and any floating activation type works
// (Tensor<half> inputs).
//
// Arguments: any mix of tensors (AnyTensor or Tensor<T>, possibly undefined) and other values
// (copied, and passed again as they are to the recomputation). fn is copied into the node and
// must stay callable until the backward (a lambda capturing a module by reference needs the
// module alive), and must compute the same thing when re-run: the same shapes, and the same
// values given the same generator state.
//
// Differences from PyTorch's reentrant implementation:
// - The node is recorded whenever grad mode is on, even when no tensor argument requires grad
//   (autograd::RecordWhen::GradEnabled), so the parameters inside fn still get gradients
//   (PyTorch's reentrant version warns and gives them none; its non-reentrant version behaves as
//   here). The price: the output then requires grad even when fn uses no parameter that does,
//   and a backward through it recomputes fn for nothing.
// - Only the default generator's state is replayed (PyTorch: the default CPU generator and the
//   CUDA generators of the devices the inputs are on; ember has one stream for every device).
//   A Dropout built with its own Generator does not replay. preserve_rng_state is always on.
// - Side effects in fn happen twice (a BatchNorm in training mode updates its running statistics
//   in the forward and again in the recomputation), as in PyTorch.
// - Under NoGradGuard, nn::recompute just calls fn.
#include <concepts>
#include <cstdint>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ember/nn/sequential.hpp"

namespace ember::nn {

namespace recompute_detail {

template <class A>
inline constexpr bool is_tensor_arg_v = std::is_base_of_v<AnyTensor, std::remove_cvref_t<A>>;

template <class R>
struct RecomputeResult {
  static constexpr bool single = std::is_base_of_v<AnyTensor, R>;
  static constexpr bool valid = single;
};
template <class X>
struct RecomputeResult<std::vector<X>> {
  static constexpr bool single = false;
  static constexpr bool valid = std::is_base_of_v<AnyTensor, X>;
};

// The outputs of fn as a list of untyped handles.
template <class R>
std::vector<AnyTensor> recompute_outputs(const R& r) {
  if constexpr (RecomputeResult<R>::single) {
    return {AnyTensor(r)};
  } else {
    return std::vector<AnyTensor>(r.begin(), r.end());
  }
}

// Rebuilds fn's result type from handles.
template <class R>
R recompute_result(const std::vector<AnyTensor>& outs) {
  if constexpr (RecomputeResult<R>::single) {
    return R(outs.at(0));
  } else {
    R r;
    r.reserve(outs.size());
    for (const AnyTensor& o : outs) r.push_back(typename R::value_type(o));
    return r;
  }
}

template <class A>
void collect_tensor_arg(std::vector<AnyTensor>& out, const A& a) {
  if constexpr (is_tensor_arg_v<A>) out.push_back(a);
}

// The argument the recomputation gets: a tensor cut from the graph (a leaf requiring grad when
// the original requires grad), anything else unchanged.
template <class A>
A recompute_arg(const A& a) {
  if constexpr (is_tensor_arg_v<A>) {
    if (!a.defined()) return a;
    A d = a.detach();
    if (a.requires_grad()) d.set_requires_grad(true);
    return d;
  } else {
    return a;
  }
}

}  // namespace recompute_detail

// Runs fn(args...) without keeping its activations; they are recomputed in the backward (see the
// header comment). Returns what fn returns: a tensor (AnyTensor or Tensor<T>) or a std::vector of
// tensors.
template <class Fn, class... Args>
  requires std::invocable<std::decay_t<Fn>&, const std::decay_t<Args>&...>
auto recompute(Fn&& fn, Args&&... args) {
  using F = std::decay_t<Fn>;
  using R = std::remove_cvref_t<std::invoke_result_t<F&, const std::decay_t<Args>&...>>;
  static_assert(recompute_detail::RecomputeResult<R>::valid,
                "nn::recompute: fn must return a tensor (AnyTensor or Tensor<T>) or a std::vector of tensors");

  if (!is_grad_enabled()) {
    F f(std::forward<Fn>(fn));  // called as the recording path calls it: a copy, const arguments
    return R(f(std::as_const(args)...));
  }

  // What the node keeps: fn, the arguments (tensors as handles: the segment's only saved
  // activations) and the generator state before the forward.
  struct Saved {
    F fn;
    std::tuple<std::decay_t<Args>...> args;
    GeneratorState rng;  // of the forward's thread, read in one piece
    std::vector<autograd::OutputMeta> outputs;
  };
  auto saved = std::make_shared<Saved>(Saved{F(std::forward<Fn>(fn)), std::tuple<std::decay_t<Args>...>(args...),
                                             default_generator().state(), {}});

  std::vector<AnyTensor> inputs;
  std::apply([&](const auto&... a) { (recompute_detail::collect_tensor_arg(inputs, a), ...); }, saved->args);

  std::vector<AnyTensor> outs;
  {
    NoGradGuard no_grad;
    R r = std::apply([&](const auto&... a) -> R { return saved->fn(a...); }, saved->args);
    outs = recompute_detail::recompute_outputs(r);
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    EMBER_CHECK(outs[i].defined(), ValueError, "recompute: output ", i, " of the recomputed function is undefined");
    // A fresh handle: fn may return one of its inputs or a parameter unchanged, whose autograd
    // state must not be touched.
    outs[i] = outs[i].detach();
    saved->outputs.push_back({outs[i].dtype(), outs[i].device(), outs[i].shape()});
  }

  auto backward_fn = [saved](const std::vector<AnyTensor>& grad_outputs) {
    auto args = std::apply([](const auto&... a) { return std::make_tuple(recompute_detail::recompute_arg(a)...); },
                           saved->args);
    std::vector<AnyTensor> leaves;
    std::apply([&](const auto&... a) { (recompute_detail::collect_tensor_arg(leaves, a), ...); }, args);

    std::vector<AnyTensor> outs;
    {
      // Replays from a copy of the forward's state, installed for this thread only: the thread's
      // own generator (shared by other threads when it is the process-wide one) is never rewound.
      Generator replay(saved->rng);
      GeneratorScope replay_scope(replay);
      GradModeGuard grad_on(true);
      // A backward run inside an InferenceModeGuard (of a graph recorded outside it) must still
      // record the recomputation, or the parameters inside would silently get no gradient.
      InferenceModeGuard recording(false);
      R r = std::apply([&](const auto&... a) -> R { return saved->fn(a...); }, args);
      outs = recompute_detail::recompute_outputs(r);
    }

    EMBER_CHECK(outs.size() == saved->outputs.size(), AutogradError, "recompute: the recomputation returned ",
                outs.size(), " output(s) but the forward returned ", saved->outputs.size(),
                " (the recomputed function must compute the same thing when re-run)");
    std::vector<AnyTensor> roots, grads;
    for (size_t i = 0; i < outs.size(); ++i) {
      const autograd::OutputMeta& m = saved->outputs[i];
      EMBER_CHECK(outs[i].defined() && outs[i].shape() == m.shape && outs[i].dtype() == m.dtype &&
                      outs[i].device() == m.device,
                  AutogradError, "recompute: the recomputation returned ", outs[i].desc(), " for output ", i,
                  " but the forward returned ", dtype_name(m.dtype), m.shape.str(), " on ", m.device.str(),
                  " (the recomputed function must compute the same thing when re-run)");
      if (outs[i].requires_grad()) {
        roots.push_back(outs[i]);
        grads.push_back(grad_outputs.at(i));
      }
    }
    if (!roots.empty()) autograd::backward(roots, grads);

    std::vector<AnyTensor> grad_inputs;
    grad_inputs.reserve(leaves.size());
    for (const AnyTensor& l : leaves)
      grad_inputs.push_back(l.defined() && l.requires_grad() ? l.grad() : AnyTensor());
    return grad_inputs;
  };
  // Recorded even when no tensor argument requires grad: the backward reaches the parameters
  // inside fn, which are not among the node's inputs.
  autograd::record("RecomputeBackward", inputs, outs, std::move(backward_fn), autograd::RecordWhen::GradEnabled);
  return recompute_detail::recompute_result<R>(outs);
}

// As PyTorch's sequential variant: splits `layers` into `segments` chunks of
// layers.size() / segments layers; the first segments - 1 chunks are recomputed, the last one
// (the rest of the layers) runs normally, since its activations are needed at once by the
// backward. 1 <= segments <= layers.size(). The chunks hold the layers (shared_ptr) until the
// backward.
template <class TensorT>
  requires std::is_base_of_v<AnyTensor, TensorT>
TensorT recompute_sequential(const std::vector<std::shared_ptr<Module>>& layers, int segments, const TensorT& x) {
  const int64_t n = static_cast<int64_t>(layers.size());
  EMBER_CHECK(segments >= 1 && segments <= n, ValueError, "recompute_sequential: segments must be between 1 and ",
              "the number of layers (", n, "), got ", segments);
  const int64_t size = n / segments;
  AnyTensor h = x;
  int64_t end = 0;
  for (int64_t s = 0; s + 1 < segments; ++s) {
    const int64_t begin = s * size;
    end = begin + size;
    std::vector<std::shared_ptr<Module>> chunk(layers.begin() + begin, layers.begin() + end);
    h = recompute(
        [chunk](const AnyTensor& in) {
          AnyTensor t = in;
          for (const auto& l : chunk) t = l->forward_any(t);
          return t;
        },
        h);
  }
  for (int64_t i = end; i < n; ++i) h = layers[static_cast<size_t>(i)]->forward_any(h);
  return TensorT(h);
}

template <class TensorT>
  requires std::is_base_of_v<AnyTensor, TensorT>
TensorT recompute_sequential(const Sequential& seq, int segments, const TensorT& x) {
  return recompute_sequential(seq.layers(), segments, x);
}

}  // namespace ember::nn
