#pragma once
// Building an ONNX graph from C++: named values with shapes whose dimensions may be symbolic, nodes,
// weights as initializers, and the opset-dependent spellings of a few ops (ReduceMean's axes, Gelu
// below opset 20). The module exporters (deploy/onnx_layers.hpp) and custom-module hooks write
// through this; deploy/onnx_export.hpp turns the result into a file.
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ember/core/tensor.hpp"
#include "ember/io/onnx_proto.hpp"

namespace ember::io::onnx {

// A value flowing through the graph: its name, element type and shape (Dim::symbol for the
// dimensions that vary from call to call, such as the batch).
struct Value {
  std::string name;
  ElemType type = ElemType::Float;
  std::vector<Dim> shape;
  int rank() const { return static_cast<int>(shape.size()); }
  // The size of dimension i (negative i counts from the end); -1 when symbolic or unknown.
  int64_t dim(int i) const {
    const Dim& d = shape[static_cast<size_t>(i < 0 ? i + rank() : i)];
    return d.is_static() ? d.value : -1;
  }
  std::string shape_str() const {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i)
      s += (i ? ", " : "") + (!shape[i].param.empty() ? shape[i].param
                              : shape[i].value >= 0   ? std::to_string(shape[i].value)
                                                      : std::string("?"));
    return s + "]";
  }
};

class GraphBuilder {
 public:
  GraphBuilder(int64_t opset, ElemType compute) : opset_(opset), compute_(compute) {}

  int64_t opset() const { return opset_; }
  // The floating-point type of the graph's activations and weights.
  ElemType compute_type() const { return compute_; }
  Graph& graph() { return graph_; }

  // The module path that prefixes node and weight names ("layers.0.attn"), pushed by the exporter
  // as it walks the module tree.
  class Scope {
   public:
    Scope(GraphBuilder& b, const std::string& name) : b_(b), saved_(b.path_) {
      if (!name.empty()) b.path_ = b.path_.empty() ? name : b.path_ + "." + name;
    }
    ~Scope() { b_.path_ = saved_; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    GraphBuilder& b_;
    std::string saved_;
  };
  const std::string& path() const { return path_; }

  // A value name used nowhere else: "<path>/<hint>", numbered when taken.
  std::string fresh(const std::string& hint) {
    std::string base = path_.empty() ? hint : path_ + "/" + hint;
    int& n = counts_[base];
    ++n;
    return n == 1 ? base : base + "_" + std::to_string(n);
  }

  // A node with one output named after `hint`; returns the output's name.
  std::string node(const std::string& op, std::vector<std::string> inputs, std::vector<Attribute> attrs = {},
                   const std::string& hint = "") {
    return node_n(op, std::move(inputs), 1, std::move(attrs), hint)[0];
  }
  std::vector<std::string> node_n(const std::string& op, std::vector<std::string> inputs, int outputs,
                                  std::vector<Attribute> attrs = {}, const std::string& hint = "",
                                  const std::string& domain = "") {
    Node n;
    n.op_type = op;
    n.domain = domain;
    n.name = fresh(hint.empty() ? op : hint);
    n.inputs = std::move(inputs);
    for (int i = 0; i < outputs; ++i) n.outputs.push_back(outputs == 1 ? n.name : n.name + "_out" + std::to_string(i));
    n.attributes = std::move(attrs);
    graph_.nodes.push_back(n);
    return n.outputs;
  }

  // A weight as an initializer named after the module path ("layers.0.weight", the state dict's
  // name), its values cast to `as` (the graph's type by default; integers keep theirs).
  std::string weight(const std::string& local_name, const AnyTensor& t, ElemType as = ElemType::Undefined) {
    std::string name = path_.empty() ? local_name : path_ + "." + local_name;
    if (as == ElemType::Undefined) as = is_floating(t.dtype()) ? compute_ : elem_type_of(t.dtype());
    auto it = weight_names_.find(t.impl());
    if (it != weight_names_.end() && it->second.second == as) return it->second.first;  // a tied weight: once
    add_initializer(name, t, as);
    weight_names_[t.impl()] = {name, as};
    return name;
  }
  // An initializer of given bytes (quantized weights): named after the module path like a weight.
  std::string raw_weight(const std::string& local_name, ElemType type, std::vector<int64_t> dims, std::string bytes) {
    TensorData t;
    t.name = path_.empty() ? local_name : path_ + "." + local_name;
    t.type = type;
    t.dims = std::move(dims);
    t.raw = std::move(bytes);
    graph_.initializers.push_back(std::move(t));
    return graph_.initializers.back().name;
  }
  // A constant of given bytes with a fresh name (zero points).
  std::string raw_weight_const(const std::string& hint, ElemType type, std::vector<int64_t> dims, std::string bytes) {
    TensorData t;
    t.name = fresh(hint);
    t.type = type;
    t.dims = std::move(dims);
    t.raw = std::move(bytes);
    graph_.initializers.push_back(std::move(t));
    return graph_.initializers.back().name;
  }
  // A vector of floating-point constants in `as` (the graph's type by default).
  std::string constant_floats(const std::string& hint, const std::vector<float>& v, ElemType as = ElemType::Undefined) {
    if (as == ElemType::Undefined) as = compute_;
    TensorData t;
    t.name = fresh(hint);
    t.type = as;
    t.dims = {static_cast<int64_t>(v.size())};
    for (float f : v) t.raw += encode_float(f, as);
    graph_.initializers.push_back(t);
    return t.name;
  }
  // A constant tensor (shapes, axes, scalars) as an initializer.
  std::string constant_i64(const std::string& hint, const std::vector<int64_t>& v, bool scalar = false) {
    TensorData t;
    t.name = fresh(hint);
    t.type = ElemType::Int64;
    if (!scalar) t.dims = {static_cast<int64_t>(v.size())};
    t.raw.resize(v.size() * 8);
    std::memcpy(t.raw.data(), v.data(), t.raw.size());
    graph_.initializers.push_back(t);
    return t.name;
  }
  // A scalar of the graph's floating-point type (or `as`).
  std::string constant_scalar(const std::string& hint, double value, ElemType as = ElemType::Undefined) {
    if (as == ElemType::Undefined) as = compute_;
    TensorData t;
    t.name = fresh(hint);
    t.type = as;
    t.raw = encode_float(value, as);
    graph_.initializers.push_back(t);
    return t.name;
  }
  // A tensor of ones (LayerNormalization needs a scale even without an affine weight).
  std::string constant_fill(const std::string& hint, const std::vector<int64_t>& dims, double value) {
    TensorData t;
    t.name = fresh(hint);
    t.type = compute_;
    t.dims = dims;
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    const std::string one = encode_float(value, compute_);
    for (int64_t i = 0; i < n; ++i) t.raw += one;
    graph_.initializers.push_back(t);
    return t.name;
  }

  // ---- ops whose spelling depends on the opset ----
  // Mean over `axes`, kept as size-1 dimensions (axes an attribute before opset 18, an input since).
  std::string reduce_mean(const std::string& x, const std::vector<int64_t>& axes) {
    if (opset_ >= 18) return node("ReduceMean", {x, constant_i64("axes", axes)}, {Attribute::of_int("keepdims", 1)});
    return node("ReduceMean", {x}, {Attribute::of_ints("axes", axes), Attribute::of_int("keepdims", 1)});
  }
  // GELU, exact (erf) or with the tanh approximation: the Gelu op from opset 20, else its formula.
  std::string gelu(const std::string& x, bool tanh_approx) {
    if (opset_ >= 20)
      return node("Gelu", {x}, {Attribute::of_string("approximate", tanh_approx ? "tanh" : "none")}, "gelu");
    const std::string half = constant_scalar("half", 0.5), one = constant_scalar("one", 1.0);
    std::string inner;
    if (tanh_approx) {  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      const std::string x3 = node("Mul", {node("Mul", {x, x}), x});
      const std::string poly = node("Add", {x, node("Mul", {x3, constant_scalar("c", 0.044715)})});
      inner = node("Tanh", {node("Mul", {poly, constant_scalar("sqrt_2_over_pi", 0.7978845608028654 /* sqrt(2 / pi) */)})});
    } else {  // 0.5 x (1 + erf(x / sqrt(2)))
      inner = node("Erf", {node("Mul", {x, constant_scalar("inv_sqrt2", 1.0 / std::sqrt(2.0))})});
    }
    return node("Mul", {node("Mul", {x, half}), node("Add", {inner, one})}, {}, "gelu");
  }
  // x reshaped to `dims` (0: keep the input's dimension at that index; -1: what is left).
  std::string reshape(const std::string& x, const std::vector<int64_t>& dims) {
    return node("Reshape", {x, constant_i64("shape", dims)});
  }
  std::string transpose(const std::string& x, const std::vector<int64_t>& perm) {
    return node("Transpose", {x}, {Attribute::of_ints("perm", perm)});
  }

  // The bytes of one value of a floating-point type.
  static std::string encode_float(double v, ElemType t) {
    std::string out;
    auto put = [&](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
    switch (t) {
      case ElemType::Float: {
        const float f = static_cast<float>(v);
        put(&f, 4);
        break;
      }
      case ElemType::Double: put(&v, 8); break;
      case ElemType::Float16: {
        const half h(static_cast<float>(v));
        put(&h, 2);
        break;
      }
      case ElemType::BFloat16: {
        const bfloat16 h(static_cast<float>(v));
        put(&h, 2);
        break;
      }
      default: throw DTypeError("onnx: a floating-point constant of a non-floating type");
    }
    return out;
  }

 private:
  void add_initializer(const std::string& name, const AnyTensor& t, ElemType as) {
    AnyTensor host = t.detach();
    const DType want = as == ElemType::Float ? DType::Float32
                       : as == ElemType::Double ? DType::Float64
                       : as == ElemType::Float16 ? DType::Float16
                       : as == ElemType::BFloat16 ? DType::BFloat16
                                                  : host.dtype();
    if (host.dtype() != want) host = host.to(want);
    if (!host.device().is_cpu()) host = host.to(Device::cpu());
    TensorData out;
    out.name = name;
    out.type = elem_type_of(host.dtype());
    for (int64_t d : host.shape()) out.dims.push_back(d);
    out.raw.assign(static_cast<const char*>(host.data_ptr()), host.nbytes());
    graph_.initializers.push_back(std::move(out));
  }

  int64_t opset_;
  ElemType compute_;
  Graph graph_;
  std::string path_;
  std::map<std::string, int> counts_;
  std::map<const void*, std::pair<std::string, ElemType>> weight_names_;
};

}  // namespace ember::io::onnx
