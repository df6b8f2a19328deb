#pragma once
// The ONNX file format, written without a protobuf library: the few messages a model needs
// (ModelProto, GraphProto, NodeProto, AttributeProto, TensorProto, ValueInfoProto and their
// parts), as plain structs, encoded in protobuf's wire format by hand. The wire format is five
// rules (varints, zig-zag-free int64s, little-endian fixed32 floats, length-delimited bytes and
// sub-messages, field number << 3 | wire type as the key), and the messages are fixed by the
// ONNX spec (onnx/onnx.proto; field numbers below). A dependency on libprotobuf, its generated
// code and its version skew between producer and consumer would be larger than this file.
//
// Large weights go to an external data file (ONNX's external data: a TensorProto with
// data_location EXTERNAL and location/offset/length entries); protobuf itself stops at 2 GiB.
// Offsets are aligned to 4096 bytes, so that a runtime can map the file and hand out the
// tensors in place.
//
// Core only (the io layer); the module exporter is ember/deploy/onnx_export.hpp.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ember/core/dtype.hpp"
#include "ember/core/error.hpp"

namespace ember::io::onnx {

// TensorProto.DataType values (onnx.proto).
enum class ElemType : int32_t {
  Undefined = 0,
  Float = 1,
  Uint8 = 2,
  Int8 = 3,
  Int32 = 6,
  Int64 = 7,
  Bool = 9,
  Float16 = 10,
  Double = 11,
  BFloat16 = 16,
};

inline ElemType elem_type_of(DType d) {
  switch (d) {
    case DType::Float32: return ElemType::Float;
    case DType::Float64: return ElemType::Double;
    case DType::Float16: return ElemType::Float16;
    case DType::BFloat16: return ElemType::BFloat16;
    case DType::Int32: return ElemType::Int32;
    case DType::Int64: return ElemType::Int64;
    case DType::UInt8: return ElemType::Uint8;
  }
  return ElemType::Undefined;
}

inline size_t elem_size(ElemType t) {
  switch (t) {
    case ElemType::Float: case ElemType::Int32: return 4;
    case ElemType::Double: case ElemType::Int64: return 8;
    case ElemType::Float16: case ElemType::BFloat16: return 2;
    case ElemType::Uint8: case ElemType::Int8: case ElemType::Bool: return 1;
    case ElemType::Undefined: return 0;
  }
  return 0;
}

// One dimension of a value's shape: a size, or a name shared by every dimension of the same size
// (a symbolic "batch" or "sequence" dimension), or neither (a size the graph does not know).
struct Dim {
  int64_t value = -1;  // used when param is empty; -1: unknown
  std::string param;
  static Dim fixed(int64_t v) { return Dim{v, {}}; }
  static Dim symbol(std::string name) { return Dim{-1, std::move(name)}; }
  static Dim unknown() { return Dim{}; }
  bool is_static() const { return param.empty() && value >= 0; }
};

struct ValueInfo {
  std::string name;
  ElemType type = ElemType::Float;
  std::vector<Dim> shape;
};

// A tensor: an initializer (a weight) or the value of a Constant's attribute. `raw` holds the
// little-endian bytes (TensorProto.raw_data).
struct TensorData {
  std::string name;
  ElemType type = ElemType::Float;
  std::vector<int64_t> dims;
  std::string raw;
};

struct Attribute {
  enum class Kind : int32_t { Float = 1, Int = 2, String = 3, Tensor = 4, Floats = 6, Ints = 7 };
  std::string name;
  Kind kind = Kind::Int;
  float f = 0;
  int64_t i = 0;
  std::string s;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<TensorData> tensor;  // exactly one for Kind::Tensor

  static Attribute of_int(std::string n, int64_t v) { return make(std::move(n), Kind::Int, &Attribute::i, v); }
  static Attribute of_float(std::string n, float v) { return make(std::move(n), Kind::Float, &Attribute::f, v); }
  static Attribute of_string(std::string n, std::string v) {
    return make(std::move(n), Kind::String, &Attribute::s, std::move(v));
  }
  static Attribute of_ints(std::string n, std::vector<int64_t> v) {
    return make(std::move(n), Kind::Ints, &Attribute::ints, std::move(v));
  }
  static Attribute of_floats(std::string n, std::vector<float> v) {
    return make(std::move(n), Kind::Floats, &Attribute::floats, std::move(v));
  }
  static Attribute of_tensor(std::string n, TensorData t) {
    std::vector<TensorData> one;
    one.push_back(std::move(t));
    return make(std::move(n), Kind::Tensor, &Attribute::tensor, std::move(one));
  }

 private:
  // An attribute of this kind with its one value field set.
  template <class T>
  static Attribute make(std::string n, Kind kind, T Attribute::*field, std::type_identity_t<T> v) {
    Attribute a;
    a.name = std::move(n);
    a.kind = kind;
    a.*field = std::move(v);
    return a;
  }
};

struct Node {
  std::string op_type;
  std::string name;
  std::string domain;  // "" is the default ai.onnx domain
  std::vector<std::string> inputs, outputs;
  std::vector<Attribute> attributes;
};

struct Graph {
  std::string name;
  std::vector<Node> nodes;
  std::vector<TensorData> initializers;
  std::vector<ValueInfo> inputs, outputs;
};

struct Model {
  int64_t ir_version = 10;
  std::vector<std::pair<std::string, int64_t>> opsets;  // (domain, version); "" is ai.onnx
  std::string producer_name, producer_version, doc_string;
  int64_t model_version = 0;
  Graph graph;
  std::vector<std::pair<std::string, std::string>> metadata;  // ModelProto.metadata_props
};

// The IR version that goes with an ai.onnx opset (onnx/helper.py's VERSION_TABLE): the lowest
// IR version of the ONNX release that introduced the opset, so that older runtimes load it.
inline int64_t ir_version_for_opset(int64_t opset) {
  if (opset <= 18) return 8;
  if (opset <= 20) return 9;
  if (opset <= 22) return 10;
  if (opset == 23) return 11;
  if (opset == 24) return 12;
  return 13;
}

// ---------------------------------------------------------------- the wire format
namespace wire {

enum : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

inline void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
inline void key(std::string& out, uint32_t field, uint32_t type) { varint(out, (uint64_t{field} << 3) | type); }
// int64 fields are plain varints of the two's complement (negative values take ten bytes).
inline void int_field(std::string& out, uint32_t field, int64_t v) {
  key(out, field, kVarint);
  varint(out, static_cast<uint64_t>(v));
}
inline void bytes_field(std::string& out, uint32_t field, std::string_view b) {
  key(out, field, kBytes);
  varint(out, b.size());
  out.append(b.data(), b.size());
}
inline void float_field(std::string& out, uint32_t field, float f) {
  key(out, field, kFixed32);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  for (int k = 0; k < 4; ++k) out.push_back(static_cast<char>((u >> (8 * k)) & 0xff));
}
inline void packed_ints(std::string& out, uint32_t field, const std::vector<int64_t>& v) {
  std::string body;
  for (int64_t x : v) varint(body, static_cast<uint64_t>(x));
  bytes_field(out, field, body);
}
inline void packed_floats(std::string& out, uint32_t field, const std::vector<float>& v) {
  std::string body(v.size() * 4, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    for (int k = 0; k < 4; ++k) body[i * 4 + static_cast<size_t>(k)] = static_cast<char>((u >> (8 * k)) & 0xff);
  }
  bytes_field(out, field, body);
}

}  // namespace wire

// ---------------------------------------------------------------- encoding the messages
// Where a tensor's bytes live when they do not sit in the model file (TensorProto.external_data).
struct ExternalPlace {
  std::string location;  // the data file's name, relative to the model file's folder
  uint64_t offset = 0, length = 0;
};

namespace detail {

inline std::string encode_string_entry(std::string_view k, std::string_view v) {
  std::string m;
  wire::bytes_field(m, 1, k);
  wire::bytes_field(m, 2, v);
  return m;
}

// TensorProto: dims 1, data_type 2, name 8, raw_data 9, external_data 13, data_location 14.
// The fields before the data.
inline std::string encode_tensor_head(const TensorData& t) {
  std::string m;
  for (int64_t d : t.dims) wire::int_field(m, 1, d);
  wire::int_field(m, 2, static_cast<int32_t>(t.type));
  if (!t.name.empty()) wire::bytes_field(m, 8, t.name);
  return m;
}
inline std::string encode_tensor(const TensorData& t, const ExternalPlace* place) {
  std::string m = encode_tensor_head(t);
  if (place) {
    wire::bytes_field(m, 13, encode_string_entry("location", place->location));
    wire::bytes_field(m, 13, encode_string_entry("offset", std::to_string(place->offset)));
    wire::bytes_field(m, 13, encode_string_entry("length", std::to_string(place->length)));
    wire::int_field(m, 14, 1);  // EXTERNAL
  } else {
    wire::bytes_field(m, 9, t.raw);
  }
  return m;
}

// TypeProto { tensor_type = 1: Tensor { elem_type = 1; shape = 2: TensorShapeProto { dim = 1:
// Dimension { dim_value = 1 | dim_param = 2 } } } }.
inline std::string encode_value_info(const ValueInfo& v) {
  std::string shape;
  for (const Dim& d : v.shape) {
    std::string dim;  // neither field: a dimension of unknown size
    if (!d.param.empty()) wire::bytes_field(dim, 2, d.param);
    else if (d.value >= 0) wire::int_field(dim, 1, d.value);
    wire::bytes_field(shape, 1, dim);
  }
  std::string tensor_type;
  wire::int_field(tensor_type, 1, static_cast<int32_t>(v.type));
  wire::bytes_field(tensor_type, 2, shape);
  std::string type;
  wire::bytes_field(type, 1, tensor_type);
  std::string m;
  wire::bytes_field(m, 1, v.name);
  wire::bytes_field(m, 2, type);
  return m;
}

// AttributeProto: name 1, f 2, i 3, s 4, t 5, floats 7, ints 8, type 20.
inline std::string encode_attribute(const Attribute& a) {
  std::string m;
  wire::bytes_field(m, 1, a.name);
  switch (a.kind) {
    case Attribute::Kind::Float: wire::float_field(m, 2, a.f); break;
    case Attribute::Kind::Int: wire::int_field(m, 3, a.i); break;
    case Attribute::Kind::String: wire::bytes_field(m, 4, a.s); break;
    case Attribute::Kind::Tensor:
      EMBER_CHECK(a.tensor.size() == 1, ValueError, "onnx: attribute '", a.name, "' must hold one tensor");
      wire::bytes_field(m, 5, encode_tensor(a.tensor[0], nullptr));
      break;
    case Attribute::Kind::Floats: wire::packed_floats(m, 7, a.floats); break;
    case Attribute::Kind::Ints: wire::packed_ints(m, 8, a.ints); break;
  }
  wire::int_field(m, 20, static_cast<int32_t>(a.kind));
  return m;
}

// NodeProto: input 1, output 2, name 3, op_type 4, attribute 5, domain 7.
inline std::string encode_node(const Node& n) {
  std::string m;
  for (const auto& s : n.inputs) wire::bytes_field(m, 1, s);
  for (const auto& s : n.outputs) wire::bytes_field(m, 2, s);
  if (!n.name.empty()) wire::bytes_field(m, 3, n.name);
  wire::bytes_field(m, 4, n.op_type);
  for (const auto& a : n.attributes) wire::bytes_field(m, 5, encode_attribute(a));
  if (!n.domain.empty()) wire::bytes_field(m, 7, n.domain);
  return m;
}

}  // namespace detail

// A model file as pieces, in order: encoded fields and, where a weight sits inline, a reference
// to its bytes, so that a 500 MB model is written without copying its weights again (the
// lengths of the enclosing messages are known from the pieces' sizes). write_to() streams them.
class EncodedModel {
 public:
  uint64_t size() const { return size_; }
  template <class Sink>  // sink(const char* data, size_t bytes)
  void write_to(Sink&& sink) const {
    for (const Piece& p : pieces_) {
      const std::string& s = p.ref ? *p.ref : p.owned;
      sink(s.data(), s.size());
    }
  }
  std::string bytes() const {
    std::string out;
    out.reserve(size_);
    write_to([&](const char* d, size_t n) { out.append(d, n); });
    return out;
  }

  void add(std::string s) {
    size_ += s.size();
    pieces_.push_back(Piece{std::move(s), nullptr});
  }
  void add_ref(const std::string& s) {
    size_ += s.size();
    pieces_.push_back(Piece{{}, &s});
  }
  void append(EncodedModel&& other) {
    size_ += other.size_;
    for (Piece& p : other.pieces_) pieces_.push_back(std::move(p));
    other.pieces_.clear();
    other.size_ = 0;
  }

 private:
  struct Piece {
    std::string owned;
    const std::string* ref;  // not owned: the model's tensor bytes
  };
  std::vector<Piece> pieces_;
  uint64_t size_ = 0;
};

// The model file. places[i], when given and non-null, says that initializer i is stored outside
// (its raw bytes are then not written here). The result refers to `model`'s tensor bytes: keep
// the model alive while writing.
inline EncodedModel encode_model_pieces(const Model& model, const std::vector<const ExternalPlace*>& places = {}) {
  const Graph& g = model.graph;
  // GraphProto: node 1, name 2, initializer 5, input 11, output 12. Inline initializers are
  // TensorProto without raw_data, then key 9, the length and the referenced bytes.
  EncodedModel graph;
  std::string head;
  for (const Node& n : g.nodes) wire::bytes_field(head, 1, detail::encode_node(n));
  wire::bytes_field(head, 2, g.name);
  for (size_t i = 0; i < g.initializers.size(); ++i) {
    const TensorData& t = g.initializers[i];
    const ExternalPlace* p = i < places.size() ? places[i] : nullptr;
    if (p) {
      wire::bytes_field(head, 5, detail::encode_tensor(t, p));
      continue;
    }
    std::string prefix = detail::encode_tensor_head(t);
    wire::key(prefix, 9, wire::kBytes);
    wire::varint(prefix, t.raw.size());
    wire::key(head, 5, wire::kBytes);
    wire::varint(head, prefix.size() + t.raw.size());
    head += prefix;
    graph.add(std::move(head));
    head.clear();
    graph.add_ref(t.raw);
  }
  for (const ValueInfo& v : g.inputs) wire::bytes_field(head, 11, detail::encode_value_info(v));
  for (const ValueInfo& v : g.outputs) wire::bytes_field(head, 12, detail::encode_value_info(v));
  graph.add(std::move(head));
  // ModelProto: ir_version 1, producer_name 2, producer_version 3, model_version 5,
  // doc_string 6, graph 7, opset_import 8 (OperatorSetIdProto: domain 1, version 2),
  // metadata_props 14.
  EncodedModel out;
  std::string m;
  wire::int_field(m, 1, model.ir_version);
  if (!model.producer_name.empty()) wire::bytes_field(m, 2, model.producer_name);
  if (!model.producer_version.empty()) wire::bytes_field(m, 3, model.producer_version);
  if (model.model_version) wire::int_field(m, 5, model.model_version);
  if (!model.doc_string.empty()) wire::bytes_field(m, 6, model.doc_string);
  wire::key(m, 7, wire::kBytes);
  wire::varint(m, graph.size());
  out.add(std::move(m));
  out.append(std::move(graph));
  std::string tail;
  for (const auto& [domain, version] : model.opsets) {
    std::string op;
    if (!domain.empty()) wire::bytes_field(op, 1, domain);
    wire::int_field(op, 2, version);
    wire::bytes_field(tail, 8, op);
  }
  for (const auto& [k, v] : model.metadata) wire::bytes_field(tail, 14, detail::encode_string_entry(k, v));
  out.add(std::move(tail));
  return out;
}

// The whole model file as one string (small models, tests).
inline std::string encode_model(const Model& model, const std::vector<const ExternalPlace*>& places = {}) {
  return encode_model_pieces(model, places).bytes();
}

}  // namespace ember::io::onnx
