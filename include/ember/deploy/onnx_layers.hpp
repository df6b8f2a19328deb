#pragma once
// The ONNX form of every module in nn/, and the walk over a module tree that picks it. Each layer
// is written with the ops of opset 17 (raised where a later opset has a single op for it: Gelu
// from 20, RMSNormalization from 23), in the graph's type; weights keep their state-dict names.
// A module the walk does not know is exported by a hook (ExportOptions::exporters, keyed by the
// module's type_name()), or refused with an error that names its path and type.
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ember/deploy/onnx_graph.hpp"
#include "ember/nn/fold.hpp"
#include "ember/nn/gpt.hpp"
#include "ember/nn/nn.hpp"
#include "ember/quant/modules.hpp"

namespace ember::io::onnx {

class Exporter;
// A custom module's ONNX form: nodes added through the exporter's builder, the output returned.
using ModuleExporter = std::function<Value(Exporter&, nn::Module&, const Value& input)>;

class Exporter {
 public:
  Exporter(GraphBuilder& b, const std::map<std::string, ModuleExporter>& hooks, bool fold_batch_norm)
      : b_(b), hooks_(hooks), fold_bn_(fold_batch_norm) {}
  GraphBuilder& builder() { return b_; }

  // The module's output for `x`, with its nodes named under `name` (its name in the parent).
  Value module(nn::Module& m, const Value& x, const std::string& name = "") {
    GraphBuilder::Scope scope(b_, name);
    if (auto it = hooks_.find(m.type_name()); it != hooks_.end()) return it->second(*this, m, x);
    if (auto* s = dynamic_cast<nn::Sequential*>(&m)) return sequential(*s, x);
    if (auto* l = dynamic_cast<nn::Linear*>(&m)) return linear(*l, x, l->activation());
    if (auto* q = dynamic_cast<quant::QuantLinear*>(&m)) return quant_linear(*q, x);
    if (auto* q = dynamic_cast<quant::QuantConv2d*>(&m)) return quant_conv2d(*q, x);
    if (auto* q = dynamic_cast<quant::Int8Linear*>(&m)) return int8_linear(*q, x);
    if (auto* c = dynamic_cast<nn::Conv2d*>(&m)) return conv2d(*c, x);
    if (auto* n = dynamic_cast<nn::BatchNorm2d*>(&m)) return batch_norm(*n, x);
    if (auto* n = dynamic_cast<nn::BatchNorm1d*>(&m)) return batch_norm(*n, x);
    if (auto* n = dynamic_cast<nn::LayerNorm*>(&m)) return layer_norm(*n, x);
    if (auto* n = dynamic_cast<nn::RMSNorm*>(&m)) return rms_norm(*n, x);
    if (auto* e = dynamic_cast<nn::Embedding*>(&m)) return embedding(*e, x);
    if (auto* p = dynamic_cast<nn::MaxPool2d*>(&m)) return pool("MaxPool", p->options(), x, false);
    if (auto* p = dynamic_cast<nn::AvgPool2d*>(&m)) return pool("AveragePool", p->options(), x, true);
    if (auto* p = dynamic_cast<nn::AdaptiveAvgPool2d*>(&m)) return adaptive_avg_pool(*p, x);
    if (auto* f = dynamic_cast<nn::Flatten*>(&m)) return flatten(*f, x);
    if (auto* a = dynamic_cast<nn::MultiheadAttention*>(&m)) return self_attention(*a, x, false);
    if (auto* t = dynamic_cast<nn::TransformerBlock*>(&m)) return transformer_block(*t, x);
    if (auto* g = dynamic_cast<nn::GPT*>(&m)) return gpt(*g, x);
    if (auto* t = dynamic_cast<nn::TransformerMLP*>(&m)) return transformer_mlp(*t, x);
    if (auto* g = dynamic_cast<nn::GELU*>(&m)) return same_shape(x, b_.gelu(x.name, g->approximate() == "tanh"));
    if (auto* s = dynamic_cast<nn::Softmax*>(&m)) return same_shape(x, b_.node("Softmax", {x.name}, {axis(s->dim())}));
    if (auto* s = dynamic_cast<nn::LogSoftmax*>(&m))
      return same_shape(x, b_.node("LogSoftmax", {x.name}, {axis(s->dim())}));
    if (dynamic_cast<nn::ReLU*>(&m)) return same_shape(x, b_.node("Relu", {x.name}));
    if (dynamic_cast<nn::Tanh*>(&m)) return same_shape(x, b_.node("Tanh", {x.name}));
    if (dynamic_cast<nn::Sigmoid*>(&m)) return same_shape(x, b_.node("Sigmoid", {x.name}));
    if (dynamic_cast<nn::SiLU*>(&m)) return same_shape(x, b_.node("Mul", {x.name, b_.node("Sigmoid", {x.name})}, {}, "silu"));
    if (dynamic_cast<nn::Identity*>(&m) || dynamic_cast<nn::Dropout*>(&m))  // dropout: the identity at inference
      return same_shape(x, b_.node("Identity", {x.name}));
    throw ValueError(::ember::detail::str_cat(
        "onnx export: no ONNX form for module '", b_.path().empty() ? std::string("(root)") : b_.path(), "' of type ",
        m.type_name(), " (input ", x.shape_str(), "); give one in ExportOptions::exporters[\"", m.type_name(), "\"]"));
  }

  // ---- the layers, also for hooks that build on them ----
  // weight_value: the weight's value in the graph when it is not the layer's own (dequantized).
  Value linear(nn::Linear& l, const Value& x, LinearActivation act, const std::string& weight_value = "") {
    return linear_like(l.weight.shape(), l.bias, x, act, weight_value.empty() ? b_.weight("weight", l.weight) : weight_value);
  }
  Value linear_like(const Shape& w, const AnyTensor& bias, const Value& x, LinearActivation act, const std::string& weight) {
    const int64_t out = w[0];
    check(x.rank() >= 1 && x.dim(-1) == w[1], "Linear", x, "must end in ", w[1]);
    std::string y;
    if (x.rank() == 2 && (b_.compute_type() == ElemType::Float || b_.compute_type() == ElemType::Double)) {
      // [N, in]: one Gemm, y = x W^T + b (what runtimes fuse best: onnxruntime turns Q/DQ inputs
      // of a Gemm into its integer QGemm).
      std::vector<std::string> in{x.name, weight};
      if (bias.defined()) in.push_back(b_.weight("bias", bias));
      y = b_.node("Gemm", in, {Attribute::of_int("transB", 1)});
    } else {
      // Any rank: MatMul with the weight transposed (a constant that runtimes fold), then the bias.
      y = b_.node("MatMul", {x.name, b_.transpose(weight, {1, 0})});
      if (bias.defined()) y = b_.node("Add", {y, b_.weight("bias", bias)});
    }
    switch (act) {
      case LinearActivation::None: break;
      case LinearActivation::Relu: y = b_.node("Relu", {y}); break;
      case LinearActivation::Gelu: y = b_.gelu(y, false); break;
      case LinearActivation::GeluTanh: y = b_.gelu(y, true); break;
    }
    Value v = same_shape(x, y);
    v.shape.back() = Dim::fixed(out);
    return v;
  }

  Value conv2d(nn::Conv2d& c, const Value& x, const AnyTensor* folded_weight = nullptr,
               const AnyTensor* folded_bias = nullptr, const std::string& weight_value = "") {
    const nn::Conv2dOptions& o = c.options();
    const Shape& w = c.weight.shape();
    check(x.rank() == 4 && x.dim(1) == w[1] * o.groups, "Conv2d", x, "must be [N, ", w[1] * o.groups, ", H, W]");
    std::vector<std::string> in{x.name, !weight_value.empty() ? weight_value
                                                             : b_.weight("weight", folded_weight ? *folded_weight : c.weight)};
    if (folded_bias) in.push_back(b_.weight("bias", *folded_bias));
    else if (c.bias.defined()) in.push_back(b_.weight("bias", c.bias));
    const std::string y = b_.node(
        "Conv", in,
        {Attribute::of_ints("kernel_shape", {w[2], w[3]}), Attribute::of_ints("strides", {o.stride[0], o.stride[1]}),
         Attribute::of_ints("pads", {o.padding[0], o.padding[1], o.padding[0], o.padding[1]}),
         Attribute::of_ints("dilations", {o.dilation[0], o.dilation[1]}), Attribute::of_int("group", o.groups)});
    Value v{y, x.type, {x.shape[0], Dim::fixed(w[0])}};
    for (int i = 0; i < 2; ++i) {
      const int64_t in_size = x.dim(2 + i);
      v.shape.push_back(in_size < 0 ? Dim::unknown()
                                    : Dim::fixed((in_size + 2 * o.padding[i] - o.dilation[i] * (w[2 + i] - 1) - 1) /
                                                     o.stride[i] +
                                                 1));
    }
    return v;
  }

  template <class BN>
  Value batch_norm(BN& n, const Value& x) {
    check(x.rank() >= 2 && x.dim(1) == n.num_features(), n.type_name().c_str(), x, "must have ", n.num_features(),
          " channels");
    EMBER_CHECK(n.running_mean.defined(), ValueError, "onnx export: ", n.type_name(), " '", b_.path(),
                "' keeps no running statistics (track_running_stats = false): its inference form needs them");
    const int64_t c = n.num_features();
    const std::string scale = n.weight.defined() ? b_.weight("weight", n.weight) : b_.constant_fill("scale", {c}, 1.0);
    const std::string bias = n.bias.defined() ? b_.weight("bias", n.bias) : b_.constant_fill("bias", {c}, 0.0);
    return same_shape(x, b_.node("BatchNormalization",
                                 {x.name, scale, bias, b_.weight("running_mean", n.running_mean),
                                  b_.weight("running_var", n.running_var)},
                                 {Attribute::of_float("epsilon", static_cast<float>(n.options().eps))}));
  }

  Value layer_norm(nn::LayerNorm& n, const Value& x) {
    const auto& ns = n.normalized_shape();
    const int k = static_cast<int>(ns.size());
    check(x.rank() >= k, "LayerNorm", x, "must end in the normalized shape");
    for (int i = 0; i < k; ++i) check(x.dim(x.rank() - k + i) == ns[static_cast<size_t>(i)], "LayerNorm", x,
                                      "must end in the normalized shape");
    std::vector<std::string> in{x.name, n.weight.defined() ? b_.weight("weight", n.weight) : b_.constant_fill("scale", ns, 1.0)};
    if (n.bias.defined()) in.push_back(b_.weight("bias", n.bias));
    return same_shape(x, b_.node("LayerNormalization", in,
                                 {Attribute::of_int("axis", -k), Attribute::of_float("epsilon", static_cast<float>(n.eps()))}));
  }

  Value rms_norm(nn::RMSNorm& n, const Value& x) {
    const auto& ns = n.normalized_shape();
    const int k = static_cast<int>(ns.size());
    check(x.rank() >= k, "RMSNorm", x, "must end in the normalized shape");
    // eps < 0: the graph type's epsilon, as the module takes its input type's.
    double eps = n.eps();
    if (eps < 0)
      eps = b_.compute_type() == ElemType::Double    ? 2.220446049250313e-16
            : b_.compute_type() == ElemType::Float   ? 1.1920928955078125e-07
            : b_.compute_type() == ElemType::Float16 ? 0.0009765625
                                                     : 0.0078125;
    const std::string w = n.weight.defined() ? b_.weight("weight", n.weight) : b_.constant_fill("scale", ns, 1.0);
    if (b_.opset() >= 23)
      return same_shape(x, b_.node("RMSNormalization", {x.name, w},
                                   {Attribute::of_int("axis", -k), Attribute::of_float("epsilon", static_cast<float>(eps))}));
    std::vector<int64_t> axes;
    for (int i = 0; i < k; ++i) axes.push_back(-k + i);
    const std::string ms = b_.reduce_mean(b_.node("Mul", {x.name, x.name}), axes);
    const std::string inv = b_.node("Reciprocal", {b_.node("Sqrt", {b_.node("Add", {ms, b_.constant_scalar("eps", eps)})})});
    return same_shape(x, b_.node("Mul", {b_.node("Mul", {x.name, inv}), w}, {}, "rms_norm"));
  }

  Value embedding(nn::Embedding& e, const Value& ids) {
    EMBER_CHECK(ids.type == ElemType::Int64 || ids.type == ElemType::Int32, DTypeError, "onnx export: Embedding '",
                b_.path(), "': ids must be int64 or int32, got ONNX type ", static_cast<int>(ids.type));
    Value v{b_.node("Gather", {b_.weight("weight", e.weight), ids.name}, {Attribute::of_int("axis", 0)}),
            b_.compute_type(), ids.shape};
    v.shape.push_back(Dim::fixed(e.weight.shape()[1]));
    return v;
  }

  Value pool(const char* op, const op::Pool2dOptions& o, const Value& x, bool average) {
    check(x.rank() == 4, op, x, "must be [N, C, H, W]");
    const std::array<int64_t, 2> stride{o.stride[0] ? o.stride[0] : o.kernel[0], o.stride[1] ? o.stride[1] : o.kernel[1]};
    std::vector<Attribute> attrs{Attribute::of_ints("kernel_shape", {o.kernel[0], o.kernel[1]}),
                                 Attribute::of_ints("strides", {stride[0], stride[1]}),
                                 Attribute::of_ints("pads", {o.padding[0], o.padding[1], o.padding[0], o.padding[1]}),
                                 Attribute::of_int("ceil_mode", o.ceil_mode ? 1 : 0)};
    if (average) attrs.push_back(Attribute::of_int("count_include_pad", o.count_include_pad ? 1 : 0));
    Value v{b_.node(op, {x.name}, attrs), x.type, {x.shape[0], x.shape[1]}};
    for (int i = 0; i < 2; ++i) {
      const int64_t in = x.dim(2 + i);
      if (in < 0) {
        v.shape.push_back(Dim::unknown());
        continue;
      }
      const int64_t span = in + 2 * o.padding[i] - o.kernel[i];
      int64_t out = (o.ceil_mode ? (span + stride[i] - 1) / stride[i] : span / stride[i]) + 1;
      // torch's rule: the last window must start inside the input or its left padding.
      if (o.ceil_mode && (out - 1) * stride[i] >= in + o.padding[i]) --out;
      v.shape.push_back(Dim::fixed(out));
    }
    return v;
  }

  Value adaptive_avg_pool(nn::AdaptiveAvgPool2d& p, const Value& x) {
    check(x.rank() == 4, "AdaptiveAvgPool2d", x, "must be [N, C, H, W]");
    const auto out = p.output_size();
    Value v{"", x.type, {x.shape[0], x.shape[1], Dim::fixed(out[0]), Dim::fixed(out[1])}};
    if (out[0] == 1 && out[1] == 1) {
      v.name = b_.node("GlobalAveragePool", {x.name});
      return v;
    }
    // Other sizes are one average pool when the input divides evenly; ONNX has no adaptive pool.
    const int64_t h = x.dim(2), w = x.dim(3);
    EMBER_CHECK(h > 0 && w > 0 && h % out[0] == 0 && w % out[1] == 0, ValueError, "onnx export: AdaptiveAvgPool2d '",
                b_.path(), "' to ", out[0], "x", out[1], " from input ", x.shape_str(),
                ": ONNX has no adaptive pooling; only a 1x1 output or a static input size that divides evenly exports");
    op::Pool2dOptions o;
    o.kernel = {h / out[0], w / out[1]};
    o.stride = o.kernel;
    Value r = pool("AveragePool", o, x, true);
    return r;
  }

  Value flatten(nn::Flatten& f, const Value& x) {
    const int r = x.rank();
    const int start = f.start_dim() < 0 ? f.start_dim() + r : f.start_dim();
    const int end = f.end_dim() < 0 ? f.end_dim() + r : f.end_dim();
    check(r >= 1 && start >= 0 && end < r && start <= end, "Flatten", x, "has fewer dimensions than the flattened range");
    int64_t merged = 1;
    for (int i = start; i <= end; ++i) merged = merged >= 0 && x.dim(i) >= 0 ? merged * x.dim(i) : -1;
    Value v{"", x.type, {}};
    for (int i = 0; i < start; ++i) v.shape.push_back(x.shape[static_cast<size_t>(i)]);
    v.shape.push_back(merged >= 0 ? Dim::fixed(merged) : Dim::unknown());
    for (int i = end + 1; i < r; ++i) v.shape.push_back(x.shape[static_cast<size_t>(i)]);
    // Reshape: 0 copies a leading dimension, -1 takes the merged one; the trailing dimensions must
    // then be static (their index moves).
    std::vector<int64_t> dims(static_cast<size_t>(start), 0);
    dims.push_back(-1);
    for (int i = end + 1; i < r; ++i) {
      EMBER_CHECK(x.dim(i) >= 0, ValueError, "onnx export: Flatten '", b_.path(), "' keeps the symbolic dimension ", i,
                  " of ", x.shape_str(), " after the flattened ones; make it static or flatten to the end");
      dims.push_back(x.dim(i));
    }
    v.name = b_.reshape(x.name, dims);
    return v;
  }

  // Self-attention over x [N, L, E] (batch first), causal or not: the projections, heads split
  // and merged by Reshape/Transpose, q scaled before q k^T (as the module does), the causal mask
  // built from the sequence length at run time (Trilu), softmax, attention times v.
  Value self_attention(nn::MultiheadAttention& a, const Value& x, bool causal) {
    const int64_t E = a.embed_dim(), H = a.num_heads(), D = a.head_dim();
    check(x.rank() == 3 && x.dim(2) == E, "MultiheadAttention", x, "must be [N, L, ", E, "]");
    EMBER_CHECK(a.options().batch_first, ValueError, "onnx export: MultiheadAttention '", b_.path(),
                "' is sequence-first (batch_first = false); export the batch-first form");
    std::string qkv = b_.node("MatMul", {x.name, b_.transpose(b_.weight("in_proj_weight", a.in_proj_weight), {1, 0})});
    if (a.in_proj_bias.defined()) qkv = b_.node("Add", {qkv, b_.weight("in_proj_bias", a.in_proj_bias)});
    const auto parts = b_.node_n("Split", {qkv, b_.constant_i64("split", {E, E, E})}, 3, {Attribute::of_int("axis", -1)}, "qkv");
    auto heads = [&](const std::string& t, std::vector<int64_t> perm) {
      return b_.transpose(b_.reshape(t, {0, 0, H, D}), std::move(perm));
    };
    const std::string q = b_.node("Mul", {heads(parts[0], {0, 2, 1, 3}), b_.constant_scalar("scale", 1.0 / std::sqrt(double(D)))});
    const std::string kt = heads(parts[1], {0, 2, 3, 1});  // [N, H, D, L]
    const std::string v = heads(parts[2], {0, 2, 1, 3});
    std::string scores = b_.node("MatMul", {q, kt}, {}, "scores");  // [N, H, L, L]
    if (causal) {
      const std::string len = b_.node("Shape", {x.name}, {Attribute::of_int("start", 1), Attribute::of_int("end", 2)});
      const std::string ones = b_.node("ConstantOfShape", {b_.node("Concat", {len, len}, {Attribute::of_int("axis", 0)})},
                                       {Attribute::of_tensor("value", int64_one())});
      // The lower triangle of a matrix of ones, as a boolean "may attend".
      const std::string lower = b_.node("Cast", {b_.node("Trilu", {ones}, {Attribute::of_int("upper", 0)})},
                                        {Attribute::of_int("to", int(ElemType::Bool))}, "causal_mask");
      scores = b_.node("Where", {lower, scores, b_.constant_scalar("neg_inf", -INFINITY)}, {}, "masked_scores");
    }
    const std::string attn = b_.node("Softmax", {scores}, {Attribute::of_int("axis", -1)}, "attn");
    const std::string ctx = b_.reshape(b_.transpose(b_.node("MatMul", {attn, v}), {0, 2, 1, 3}), {0, 0, E});
    GraphBuilder::Scope out_scope(b_, "out_proj");
    return linear(*a.out_proj, Value{ctx, x.type, x.shape}, LinearActivation::None);
  }

  Value transformer_mlp(nn::TransformerMLP& m, const Value& x) {
    Value h;
    {
      GraphBuilder::Scope s(b_, "c_fc");
      h = linear(*m.c_fc, x, LinearActivation::GeluTanh);
    }
    GraphBuilder::Scope s(b_, "c_proj");
    return linear(*m.c_proj, h, LinearActivation::None);
  }

  Value transformer_block(nn::TransformerBlock& t, const Value& x) {
    const Value h = module(*t.ln_1, x, "ln_1");
    Value a;
    {
      GraphBuilder::Scope s(b_, "attn");
      a = self_attention(*t.attn, h, t.options().is_causal);
    }
    const Value y = same_shape(x, b_.node("Add", {x.name, a.name}, {}, "residual_1"));
    const Value m = module(*t.mlp, module(*t.ln_2, y, "ln_2"), "mlp");
    return same_shape(x, b_.node("Add", {y.name, m.name}, {}, "residual_2"));
  }

  // ---- INT8 (quant/modules.hpp): QuantizeLinear/DequantizeLinear pairs as TensorRT's explicit
  // quantization reads them: the input per tensor, the weight per output channel (axis 0), zero
  // points 0 of type int8, scales positive, in the graph's type. In Float mode a quantized layer
  // is its float layer; in Calibrate mode it has no fixed range yet and is refused.
  std::string qdq(const std::string& x, double scale, const std::string& what = "input") {
    EMBER_CHECK(b_.compute_type() == ElemType::Float || b_.opset() >= 19, ValueError, "onnx export: '", b_.path(),
                "': INT8 Q/DQ in a graph of fp16 or bf16 needs opset 19 or later (scales of the graph's type)");
    const std::string s = b_.constant_scalar(what + "_scale", scale);
    const std::string zp = b_.raw_weight_const(what + "_zero_point", ElemType::Int8, {}, std::string(1, '\0'));
    return b_.node("DequantizeLinear", {b_.node("QuantizeLinear", {x, s, zp}, {}, what + "_quantize"), s, zp}, {},
                   what + "_dequantize");
  }
  std::string dequantized_weight(const AnyTensor& w, const std::vector<float>& scales) {
    const std::vector<int8_t> q = quant::quantize_weight(w, scales);
    std::vector<int64_t> dims(w.shape().begin(), w.shape().end());
    const std::string qw = b_.raw_weight("weight_quantized", ElemType::Int8, dims, std::string(q.begin(), q.end()));
    return dequantize_linear(qw, scales);
  }
  std::string dequantize_linear(const std::string& qw, const std::vector<float>& scales) {
    const std::string s = b_.constant_floats("weight_scale", scales);
    const std::string zp = b_.raw_weight_const("weight_zero_point", ElemType::Int8, {static_cast<int64_t>(scales.size())},
                                               std::string(scales.size(), '\0'));
    return b_.node("DequantizeLinear", {qw, s, zp}, {Attribute::of_int("axis", 0)}, "weight_dequantize");
  }
  template <class Q>
  void check_quantized(const Q& q) {
    EMBER_CHECK(q.mode() != quant::QuantMode::Calibrate, ValueError, "onnx export: ", q.type_name(), " '", b_.path(),
                "' is still calibrating; call quant::finish_calibration (or quant::calibrate) before exporting");
  }
  Value quant_linear(quant::QuantLinear& q, const Value& x) {
    check_quantized(q);
    if (q.mode() == quant::QuantMode::Float) return linear(q.layer(), x, q.layer().activation());
    const Value xq{qdq(x.name, q.input_scale()), x.type, x.shape};
    Value y = linear(q.layer(), xq, q.layer().activation(), dequantized_weight(q.layer().weight, q.weight_scales()));
    if (q.quantizes_output()) y.name = qdq(y.name, q.output_scale(), "output");
    return y;
  }
  Value quant_conv2d(quant::QuantConv2d& q, const Value& x) {
    check_quantized(q);
    if (q.mode() == quant::QuantMode::Float) return conv2d(q.layer(), x);
    const Value xq{qdq(x.name, q.input_scale()), x.type, x.shape};
    Value y = conv2d(q.layer(), xq, nullptr, nullptr, dequantized_weight(q.layer().weight, q.weight_scales()));
    if (q.quantizes_output()) y.name = qdq(y.name, q.output_scale(), "output");
    return y;
  }
  // Weight-only INT8: the int8 weight dequantized per channel, the activations in float.
  Value int8_linear(quant::Int8Linear& q, const Value& x) {
    const AnyTensor& u = q.weight_int8;
    std::string bytes(static_cast<const char*>(u.detach().to(Device::cpu()).data_ptr()), u.nbytes());
    const std::string qw = b_.raw_weight("weight_int8", ElemType::Int8, {u.shape()[0], u.shape()[1]}, std::move(bytes));
    const std::vector<double> sd = q.weight_scale.to_double_vector();
    return linear_like(u.shape(), q.bias, x, q.activation(), dequantize_linear(qw, std::vector<float>(sd.begin(), sd.end())));
  }

  // GPT: token plus position embeddings (positions 0..L-1 from the ids' length at run time), the
  // blocks, ln_f, and the head tied to the token embedding (one initializer for both uses).
  Value gpt(nn::GPT& g, const Value& ids) {
    check(ids.rank() == 2 && (ids.type == ElemType::Int64 || ids.type == ElemType::Int32), "GPT", ids,
          "must be token ids, int64 or int32 [N, L]");
    const int64_t E = g.config().n_embd, V = g.config().vocab_size;
    const Value tok = module(*g.wte, ids, "wte");
    const std::string len = b_.node("Squeeze", {b_.node("Shape", {ids.name}, {Attribute::of_int("start", 1), Attribute::of_int("end", 2)}),
                                                b_.constant_i64("axes", {0})});
    const std::string positions = b_.node("Range", {b_.constant_i64("zero", {0}, true), len, b_.constant_i64("one", {1}, true)},
                                          {}, "positions");
    const Value pos = module(*g.wpe, Value{positions, ElemType::Int64, {ids.shape[1]}}, "wpe");
    Value x{b_.node("Add", {tok.name, pos.name}, {}, "embeddings"), b_.compute_type(), {ids.shape[0], ids.shape[1], Dim::fixed(E)}};
    x = module(*g.h, x, "h");
    x = module(*g.ln_f, x, "ln_f");
    const std::string head = b_.transpose(b_.weight("weight", g.wte->weight), {1, 0});
    Value logits{b_.node("MatMul", {x.name, head}, {}, "lm_head"), x.type, x.shape};
    logits.shape.back() = Dim::fixed(V);
    return logits;
  }

  Value sequential(nn::Sequential& s, const Value& x) {
    Value h = x;
    const auto& layers = s.layers();
    const auto& names = s.named_children();
    for (size_t i = 0; i < layers.size(); ++i) {
      auto* conv = dynamic_cast<nn::Conv2d*>(layers[i].get());
      auto* bn = i + 1 < layers.size() ? dynamic_cast<nn::BatchNorm2d*>(layers[i + 1].get()) : nullptr;
      if (fold_bn_ && conv && bn && bn->running_mean.defined()) {
        GraphBuilder::Scope scope(b_, names[i].first);
        auto [w, b] = fold_batch_norm(*conv, *bn);
        h = conv2d(*conv, h, &w, &b);
        ++i;  // the batch norm is inside the convolution now
        continue;
      }
      h = module(*layers[i], h, names[i].first);
    }
    return h;
  }

  // The convolution that computes conv followed by bn (its running statistics): nn/fold.hpp.
  static std::pair<AnyTensor, AnyTensor> fold_batch_norm(nn::Conv2d& conv, nn::BatchNorm2d& bn) {
    return nn::fold_batch_norm_weights(conv, bn);
  }

  static Value same_shape(const Value& x, std::string name) { return Value{std::move(name), x.type, x.shape}; }

 private:
  static Attribute axis(int a) { return Attribute::of_int("axis", a); }
  static TensorData int64_one() {
    TensorData t;
    t.type = ElemType::Int64;
    t.dims = {1};
    const int64_t one = 1;
    t.raw.assign(reinterpret_cast<const char*>(&one), 8);
    return t;
  }
  template <class... Expect>
  void check(bool ok, const char* layer, const Value& x, const Expect&... expect) const {
    EMBER_CHECK(ok, ShapeError, "onnx export: ", layer, " '", b_.path(), "': input ", x.shape_str(), " ", expect...);
  }

  GraphBuilder& b_;
  const std::map<std::string, ModuleExporter>& hooks_;
  bool fold_bn_;
};

}  // namespace ember::io::onnx
