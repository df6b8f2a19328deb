// The autograd tape: nodes, edges, and `record`, by which an op puts itself
// on the tape.
//
// Core's tensors and this tape are one layer: a handle carries its node (TensorImpl::grad_fn),
// and a node holds complete handles (the gradients it returns, the tensors its backward saved).
// core/tensor.hpp therefore defines the handles and then includes this file and
// autograd/engine.hpp. Included first, this file includes core/tensor.hpp, which includes it back
// once the handles are complete: that inner pass defines the tape, and the guard below the
// include (not #pragma once, which would skip the inner pass) leaves the outer one empty.
#include "ember/core/tensor.hpp"

#ifndef EMBER_AUTOGRAD_NODE_HPP
#define EMBER_AUTOGRAD_NODE_HPP

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ember/autograd/anomaly.hpp"
#include "ember/autograd/grad_mode.hpp"

namespace ember::autograd {

class Node;
namespace detail {
inline std::string check_forward_anomaly(const char* op, const std::vector<AnyTensor>& outputs);
}

// Where a gradient flows: input `input_nr` of `node` (the output slot of the producing node).
struct Edge {
  std::shared_ptr<Node> node;
  int input_nr = 0;
  bool valid() const { return node != nullptr; }
};

// What a node needs to make a zero gradient for an output that received none.
struct OutputMeta {
  DType dtype;
  Device device;
  Shape shape;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  explicit Node(std::string name) : name_(std::move(name)) {}
  virtual ~Node() = default;
  // Gradients of this node's outputs in, gradients of its inputs out (one per `next` edge; an
  // undefined tensor where an input needs none).
  virtual std::vector<AnyTensor> apply(std::vector<AnyTensor>&& grad_outputs) = 0;
  // Frees what the backward needed (saved tensors); called after use unless retain_graph.
  virtual void release() {}
  const std::string& name() const { return name_; }

  std::vector<Edge> next;
  std::vector<OutputMeta> outputs;
  std::vector<OutputMeta> inputs;  // to check that a backward returns well-formed gradients
  // Where forward made this node ("by op 'log' in module 'net.act' (ReLU)"), kept while anomaly
  // detection is on (autograd/anomaly.hpp) for backward's message; empty otherwise.
  std::string anomaly_context;

 private:
  std::string name_;
};

using BackwardFn = std::function<std::vector<AnyTensor>(const std::vector<AnyTensor>& grad_outputs)>;

// A node whose backward is a closure; the closure owns the saved tensors.
class FunctionNode : public Node {
 public:
  FunctionNode(std::string name, BackwardFn fn) : Node(std::move(name)), fn_(std::move(fn)) {}
  std::vector<AnyTensor> apply(std::vector<AnyTensor>&& grad_outputs) override {
    EMBER_CHECK(fn_ != nullptr, AutogradError, "backward through ", name(),
                " a second time: its saved tensors were freed by the first backward; pass "
                "retain_graph=true to the first backward() to keep them");
    return fn_(grad_outputs);
  }
  void release() override { fn_ = nullptr; }

 private:
  BackwardFn fn_;
};

// The sink of a leaf: adds incoming gradients into leaf.grad, then runs its ready hooks
// (defined with the engine, autograd/engine.hpp).
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : Node("AccumulateGrad"), leaf_(std::move(leaf)) {}
  std::vector<AnyTensor> apply(std::vector<AnyTensor>&& grad_outputs) override;
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// The edge a gradient for `t` takes: its producer's slot, the leaf's AccumulateGrad (made once
// per leaf), or none for a tensor that does not require grad.
inline Edge gradient_edge(const AnyTensor& t) {
  TensorImpl& impl = *t.impl();
  if (impl.grad_fn) return Edge{impl.grad_fn, impl.output_nr};
  if (!impl.requires_grad) return Edge{};
  std::shared_ptr<Node> acc = impl.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    acc->outputs.push_back({impl.dtype, impl.device, impl.shape});
    impl.grad_accumulator = acc;
  }
  return Edge{acc, 0};
}

// True when an op with these inputs must be recorded.
inline bool any_requires_grad(const std::vector<AnyTensor>& inputs) {
  if (!is_grad_enabled()) return false;
  for (const AnyTensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

// When record() puts a node on the tape. With grad mode off (NoGradGuard, InferenceModeGuard) it
// records nothing either way.
enum class RecordWhen {
  // An op: only when some input requires grad, since its backward reaches nothing else.
  InputRequiresGrad,
  // Whenever grad mode is on: for a node whose backward reaches leaves that are not among its
  // inputs (nn::recompute's, which backpropagates into the parameters its function uses). Inputs
  // that do not require grad get no edge, as with an op.
  GradEnabled,
};

// Records an op on the tape: `outputs` become non-leaf tensors whose gradient flows through `fn`
// to `inputs`. `fn` gets one gradient per output (zeros where an output received none) and
// returns one per input (undefined where an input needs none).
inline void record(const char* name, const std::vector<AnyTensor>& inputs, const std::vector<AnyTensor>& outputs,
                   BackwardFn fn, RecordWhen when = RecordWhen::InputRequiresGrad) {
  const bool recorded = when == RecordWhen::GradEnabled ? is_grad_enabled() : any_requires_grad(inputs);
  if (!recorded) return;
  auto node = std::make_shared<FunctionNode>(name, std::move(fn));
  for (const AnyTensor& in : inputs) {
    node->next.push_back(in.defined() ? gradient_edge(in) : Edge{});
    if (in.defined())
      node->inputs.push_back({in.dtype(), in.device(), in.shape()});
    else
      node->inputs.push_back({DType::Float32, Device::cpu(), Shape{}});
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    TensorImpl& o = *outputs[i].impl();
    o.grad_fn = node;
    o.output_nr = static_cast<int>(i);
    node->outputs.push_back({o.dtype, o.device, o.shape});
  }
  if (is_anomaly_enabled()) [[unlikely]] node->anomaly_context = detail::check_forward_anomaly(name, outputs);
}

}  // namespace ember::autograd

namespace ember {

inline std::string AnyTensor::grad_fn_name() const {
  return checked().grad_fn ? checked().grad_fn->name() : std::string("(leaf)");
}

}  // namespace ember

// The checks record() and the engine run while anomaly detection is on (they need Node).
#include "ember/autograd/detail/anomaly_impl.hpp"

#endif  // EMBER_AUTOGRAD_NODE_HPP
