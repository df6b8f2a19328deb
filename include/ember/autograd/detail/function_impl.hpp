#pragma once
// The autograd tape (DESIGN.md decision 4): nodes, edges and how ops record themselves.
// Included by core/tensor.hpp after the tensor handles are complete; include <ember/core/tensor.hpp>
// or <ember/autograd/node.hpp> rather than this file.
#include <functional>
#include <memory>

#include "ember/autograd/anomaly.hpp"
#include <string>
#include <utility>
#include <vector>

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

// The sink of a leaf: adds incoming gradients into leaf.grad, then runs its ready hooks.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : Node("AccumulateGrad"), leaf_(std::move(leaf)) {}
  std::vector<AnyTensor> apply(std::vector<AnyTensor>&& grad_outputs) override;
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

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

// Records an op on the tape when grad mode is on and any input requires grad: `outputs` become
// non-leaf tensors whose gradient flows through `fn` to `inputs`. `fn` gets one gradient per
// output (zeros where an output received none) and returns one per input.
inline void record(const char* name, const std::vector<AnyTensor>& inputs, const std::vector<AnyTensor>& outputs,
                   BackwardFn fn) {
  if (!any_requires_grad(inputs)) return;
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

#include "ember/autograd/detail/anomaly_impl.hpp"
