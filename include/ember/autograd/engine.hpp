// The backward engine: walks the tape from the roots in reverse
// topological order, sums the gradients arriving at each node, accumulates into the leaves'
// .grad (AccumulateGrad), and frees saved tensors unless retain_graph. Entry points:
// autograd::backward(roots, grads, retain_graph), AnyTensor::backward, autograd::queue_callback.
//
// Part of the one layer of core/tensor.hpp and autograd/node.hpp (see node.hpp): included first,
// this file includes core/tensor.hpp, which includes it back once the handles and the tape are
// complete; the guard below the includes leaves the outer pass empty.
#include "ember/core/tensor.hpp"
#include "ember/autograd/node.hpp"

#ifndef EMBER_AUTOGRAD_ENGINE_HPP
#define EMBER_AUTOGRAD_ENGINE_HPP

#include <functional>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ember/autograd/anomaly.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/core/trace.hpp"

namespace ember::autograd {

namespace detail {
inline StridedArgs same_shape_args(const Shape& s) {
  StridedArgs a;
  a.ndim = s.dim();
  auto st = s.strides();
  for (int i = 0; i < s.dim(); ++i) {
    a.shape[i] = s[i];
    a.stride_a[i] = a.stride_b[i] = st[static_cast<size_t>(i)];
  }
  return a;
}

// acc += g, elementwise, same shape, dtype and device.
inline void add_into(const AnyTensor& acc, const AnyTensor& g) {
  if (acc.numel() == 0) return;
  acc.backend().binary(BinaryOp::Add, acc.dtype(), acc.data_ptr(), g.data_ptr(), acc.data_ptr(),
                       same_shape_args(acc.shape()));
}

// True when t is the only handle on its memory: no other tensor, view, saved input or caller
// shares its storage, and it is not part of a graph. Such a gradient may be taken or added into
// in place instead of copied.
inline bool sole_owner(const AnyTensor& t) {
  const std::shared_ptr<TensorImpl>& impl = t.impl_ptr();
  return impl && impl.use_count() == 1 && impl->storage && impl->storage.use_count() == 1 && impl->offset == 0 &&
         impl->storage->bytes() == impl->nbytes() && !impl->requires_grad && !impl->grad_fn;
}

inline void check_gradient(const Node& node, size_t i, const AnyTensor& g) {
  const OutputMeta& m = node.inputs[i];
  EMBER_CHECK(g.shape() == m.shape && g.dtype() == m.dtype && g.device() == m.device, AutogradError,
              "backward of ", node.name(), " returned a gradient ", g.desc(), " for input ", i, " which is ",
              dtype_name(m.dtype), m.shape.str(), " on ", m.device.str());
}

// Callbacks queued during a backward pass run once, in order, when that pass has finished (the
// data-parallel wrapper waits for its last all-reduces there). Per thread; a nested pass (the one
// nn::recompute runs inside a node's backward) keeps its own list.
inline std::vector<std::function<void()>>*& current_backward_callbacks() {
  thread_local std::vector<std::function<void()>>* list = nullptr;
  return list;
}

// A node's backward as an op of the profile, named after the node ("mul_backward"), with the
// gradients it receives as inputs.
inline void apply_traced(trace::Listener& tl, Node& node, std::vector<AnyTensor>&& gouts,
                         std::vector<AnyTensor>& gins) {
  trace::OpInput in[trace::kMaxOpInputs];
  int n = 0;
  for (const AnyTensor& g : gouts)
    if (n < trace::kMaxOpInputs && g.defined()) in[n++] = trace::OpInput{g.dtype(), g.device(), g.shape()};
  tl.backward_op_begin(node.name(), in, n);
  struct End {
    trace::Listener& tl;
    ~End() { tl.op_end(nullptr); }
  } end{tl};
  gins = node.apply(std::move(gouts));
}
}  // namespace detail

// Queues fn to run at the end of the backward pass currently running on this thread. Called from
// a gradient-ready hook or a backward function; outside a backward pass it is an error.
inline void queue_callback(std::function<void()> fn) {
  auto* list = detail::current_backward_callbacks();
  EMBER_CHECK(list != nullptr, AutogradError, "queue_callback: no backward pass is running on this thread");
  list->push_back(std::move(fn));
}

inline std::vector<AnyTensor> AccumulateGrad::apply(std::vector<AnyTensor>&& grad_outputs) {
  AnyTensor g = std::move(grad_outputs.at(0));
  if (!g.defined()) return {};
  NoGradGuard no_grad;
  if (!leaf_->grad) {
    // Copy rather than alias when the incoming gradient may share storage with another tensor
    // (another leaf's gradient, the caller's); a gradient nothing else holds is taken as it is,
    // as PyTorch does, which saves a pass over it (the gradient of a large input).
    AnyTensor dst = leaf_->grad_destination ? leaf_->grad_destination() : AnyTensor();
    if (dst.defined()) {
      EMBER_CHECK(dst.shape() == g.shape() && dst.dtype() == g.dtype() && dst.device() == g.device(), AutogradError,
                  "the gradient destination ", dst.desc(), " of a leaf does not fit its gradient ", g.desc());
      dst.copy_(g);
      leaf_->grad = dst.impl_ptr();
    } else if (detail::sole_owner(g)) {
      leaf_->grad = g.detach().impl_ptr();
    } else {
      leaf_->grad = g.detach().clone().impl_ptr();
    }
  } else {
    AnyTensor acc(leaf_->grad);
    EMBER_CHECK(acc.shape() == g.shape() && acc.dtype() == g.dtype() && acc.device() == g.device(), AutogradError,
                "accumulating a gradient ", g.desc(), " into an existing .grad ", acc.desc());
    detail::add_into(acc, g);
  }
  AnyTensor leaf(leaf_);
  for (auto& hook : leaf_->grad_ready_hooks) hook(leaf);
  return {};
}

// Runs backward from `roots` with the given gradients (one per root, same shapes).
inline void backward(const std::vector<AnyTensor>& roots, const std::vector<AnyTensor>& grads,
                     bool retain_graph = false) {
  EMBER_CHECK(roots.size() == grads.size(), AutogradError, "backward: ", roots.size(), " roots but ",
              grads.size(), " gradients");
  trace::PhaseScope phase(trace::Phase::Backward);  // the profiler's backward phase
  NoGradGuard no_grad;  // backward functions run untaped
  std::vector<std::function<void()>> callbacks;
  auto* outer_callbacks = detail::current_backward_callbacks();
  detail::current_backward_callbacks() = &callbacks;
  struct RestoreCallbacks {
    std::vector<std::function<void()>>* outer;
    ~RestoreCallbacks() { detail::current_backward_callbacks() = outer; }
  } restore{outer_callbacks};
  // Gradient buffers per node and output slot.
  std::unordered_map<Node*, std::vector<AnyTensor>> buffers;
  std::unordered_map<Node*, int> dependencies;
  std::vector<std::shared_ptr<Node>> start;

  auto add_grad = [&](Node* node, int slot, const AnyTensor& g) {
    auto& buf = buffers[node];
    if (buf.empty()) buf.resize(node->outputs.size());
    AnyTensor& dst = buf[static_cast<size_t>(slot)];
    if (!dst.defined()) {
      dst = g;
    } else if (detail::sole_owner(dst) && dst.shape() == g.shape() && dst.dtype() == g.dtype()) {
      detail::add_into(dst, g);  // nothing else sees dst: add in place (residual connections)
    } else {
      AnyTensor sum = dst.clone();  // never add in place into a tensor another node may own
      detail::add_into(sum, g);
      dst = sum;
    }
  };

  for (size_t i = 0; i < roots.size(); ++i) {
    const AnyTensor& r = roots[i];
    EMBER_CHECK(r.requires_grad(), AutogradError, "backward: the tensor ", r.desc(),
                " does not require grad and has no grad_fn (no input of the computation requires grad, "
                "or it was computed under NoGradGuard)");
    const AnyTensor& g = grads[i];
    EMBER_CHECK(g.shape() == r.shape() && g.dtype() == r.dtype() && g.device() == r.device(), ShapeError,
                "backward: gradient ", g.desc(), " does not match the tensor ", r.desc());
    Edge e = gradient_edge(r);
    add_grad(e.node.get(), e.input_nr, g);
    start.push_back(e.node);
  }

  // Count, for each node reachable from the roots, how many edges point into it.
  {
    std::vector<Node*> stack;
    std::unordered_set<Node*> seen;
    for (auto& s : start)
      if (seen.insert(s.get()).second) stack.push_back(s.get());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (const Edge& e : n->next) {
        if (!e.valid()) continue;
        dependencies[e.node.get()] += 1;
        if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
      }
    }
  }

  std::vector<std::shared_ptr<Node>> ready;
  {
    std::unordered_set<Node*> queued;
    for (auto& s : start)
      if (dependencies[s.get()] == 0 && queued.insert(s.get()).second) ready.push_back(s);
  }
  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.back();
    ready.pop_back();
    std::vector<AnyTensor> gouts = std::move(buffers[node.get()]);
    buffers.erase(node.get());
    gouts.resize(node->outputs.size());
    for (size_t i = 0; i < gouts.size(); ++i) {
      if (!gouts[i].defined()) {
        const OutputMeta& m = node->outputs[i];
        gouts[i] = AnyTensor::zeros(m.shape, m.dtype, m.device);
      }
    }
    std::vector<AnyTensor> gins;
    if (trace::Listener* tl = trace::active_listener()) [[unlikely]] {
      detail::apply_traced(*tl, *node, std::move(gouts), gins);
    } else {
      gins = node->apply(std::move(gouts));
    }
    if (!retain_graph) node->release();
    if (is_anomaly_enabled()) [[unlikely]] detail::check_backward_anomaly(*node, gins);
    for (size_t i = 0; i < node->next.size(); ++i) {
      const Edge& e = node->next[i];
      if (!e.valid()) continue;
      if (i < gins.size() && gins[i].defined()) {
        detail::check_gradient(*node, i, gins[i]);
        add_grad(e.node.get(), e.input_nr, gins[i]);
      }
      if (--dependencies[e.node.get()] == 0) ready.push_back(e.node);
    }
  }
  // A callback may queue another (it runs too).
  for (size_t i = 0; i < callbacks.size(); ++i) callbacks[i]();
}

}  // namespace ember::autograd

namespace ember {

inline void AnyTensor::backward(bool retain_graph) const {
  EMBER_CHECK(numel() == 1, AutogradError, "backward: called without a gradient on the non-scalar ", desc(),
              "; pass the gradient explicitly, backward(gradient), or reduce to a scalar first");
  backward(AnyTensor::full(shape(), 1.0, dtype(), device()), retain_graph);
}

inline void AnyTensor::backward(const AnyTensor& gradient, bool retain_graph) const {
  autograd::backward({*this}, {gradient}, retain_graph);
}

}  // namespace ember

#endif  // EMBER_AUTOGRAD_ENGINE_HPP
