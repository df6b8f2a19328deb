#pragma once
// io::triton::read_onnx_signature: the graph inputs and outputs of an ONNX file (names, element
// types, shapes with their symbolic dimensions) and the external data files its weights name,
// read from the file without a protobuf library. A Triton model configuration is written from
// these (deploy/triton_config.hpp); the weights themselves are skipped, not read.
//
// The messages read (onnx/onnx.proto): ModelProto.graph 7; GraphProto.initializer 5, input 11,
// output 12; TensorProto.name 8, external_data 13 (StringStringEntryProto key 1, value 2);
// ValueInfoProto name 1, type 2; TypeProto.tensor_type 1; TypeProto.Tensor elem_type 1, shape 2;
// TensorShapeProto.dim 1; Dimension dim_value 1, dim_param 2. Graph inputs that are also
// initializers (models written before IR version 4 list their weights as inputs) are not inputs.
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ember/io/mapped_file.hpp"
#include "ember/io/onnx_proto.hpp"

namespace ember::io::triton {

struct OnnxSignature {
  std::vector<onnx::ValueInfo> inputs, outputs;
  std::vector<std::string> data_files;  // external data locations, relative to the model's folder
};

namespace detail {

// One protobuf message's fields, in order: the field number, the wire type and the value (a
// varint, or the bytes of a length-delimited field).
class WireReader {
 public:
  WireReader(std::string_view bytes, const std::string& path) : p_(bytes), path_(path) {}

  struct Field {
    uint32_t number = 0, type = 0;
    uint64_t varint = 0;
    std::string_view bytes;
  };
  // The next field, or false at the end of the message.
  bool next(Field& f) {
    if (p_.empty()) return false;
    const uint64_t key = varint();
    f.number = static_cast<uint32_t>(key >> 3);
    f.type = static_cast<uint32_t>(key & 7);
    switch (f.type) {
      case onnx::wire::kVarint: f.varint = varint(); break;
      case onnx::wire::kFixed64: f.bytes = take(8); break;
      case onnx::wire::kFixed32: f.bytes = take(4); break;
      case onnx::wire::kBytes: f.bytes = take(varint()); break;
      default: fail("wire type " + std::to_string(f.type) + " of field " + std::to_string(f.number));
    }
    return true;
  }

 private:
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_.empty()) fail("a varint that runs past the end of its message");
      const auto c = static_cast<uint8_t>(p_[0]);
      p_.remove_prefix(1);
      v |= uint64_t{c & 0x7fu} << shift;
      if (!(c & 0x80)) return v;
    }
    fail("a varint longer than ten bytes");
  }
  std::string_view take(uint64_t n) {
    if (n > p_.size()) fail("a field of " + std::to_string(n) + " bytes where " + std::to_string(p_.size()) + " are left");
    std::string_view s = p_.substr(0, static_cast<size_t>(n));
    p_.remove_prefix(static_cast<size_t>(n));
    return s;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError("ONNX file '" + path_ + "' is not a valid model: " + what);
  }

  std::string_view p_;
  const std::string& path_;
};

inline onnx::ValueInfo read_value_info(std::string_view bytes, const std::string& path) {
  onnx::ValueInfo v;
  v.type = onnx::ElemType::Undefined;
  bool tensor = false, shaped = false;
  WireReader r(bytes, path);
  WireReader::Field f;
  while (r.next(f)) {
    if (f.number == 1 && f.type == onnx::wire::kBytes) v.name = std::string(f.bytes);
    if (f.number != 2 || f.type != onnx::wire::kBytes) continue;
    WireReader type(f.bytes, path);
    WireReader::Field t;
    while (type.next(t)) {
      if (t.number != 1 || t.type != onnx::wire::kBytes) continue;  // not tensor_type
      tensor = true;
      WireReader tensor_type(t.bytes, path);
      WireReader::Field e;
      while (tensor_type.next(e)) {
        if (e.number == 1 && e.type == onnx::wire::kVarint) v.type = static_cast<onnx::ElemType>(e.varint);
        if (e.number != 2 || e.type != onnx::wire::kBytes) continue;
        shaped = true;
        WireReader shape(e.bytes, path);
        WireReader::Field d;
        while (shape.next(d)) {
          if (d.number != 1 || d.type != onnx::wire::kBytes) continue;
          onnx::Dim dim = onnx::Dim::unknown();
          WireReader dr(d.bytes, path);
          WireReader::Field x;
          while (dr.next(x)) {
            if (x.number == 1 && x.type == onnx::wire::kVarint) dim = onnx::Dim::fixed(static_cast<int64_t>(x.varint));
            if (x.number == 2 && x.type == onnx::wire::kBytes) dim = onnx::Dim::symbol(std::string(x.bytes));
          }
          v.shape.push_back(dim);
        }
      }
    }
  }
  EMBER_CHECK(tensor, FormatError, "ONNX file '", path, "': graph value '", v.name,
              "' is not a tensor (a sequence, map or optional); a Triton configuration describes tensors");
  EMBER_CHECK(shaped, FormatError, "ONNX file '", path, "': graph value '", v.name,
              "' has no shape (not even its rank); a Triton configuration needs its dimensions");
  return v;
}

// TensorProto: its name, and the "location" of its external data, if any.
inline std::pair<std::string, std::string> read_initializer(std::string_view bytes, const std::string& path) {
  std::string name, location;
  WireReader r(bytes, path);
  WireReader::Field f;
  while (r.next(f)) {
    if (f.number == 8 && f.type == onnx::wire::kBytes) name = std::string(f.bytes);
    if (f.number != 13 || f.type != onnx::wire::kBytes) continue;
    std::string_view key, value;
    WireReader entry(f.bytes, path);
    WireReader::Field e;
    while (entry.next(e)) {
      if (e.number == 1 && e.type == onnx::wire::kBytes) key = e.bytes;
      if (e.number == 2 && e.type == onnx::wire::kBytes) value = e.bytes;
    }
    if (key == "location") location = std::string(value);
  }
  return {name, location};
}

}  // namespace detail

// The signature of the ONNX model held in `bytes`; `p` names it in messages. Whatever the bytes,
// it returns or throws FormatError (tests/fuzz/fuzz_onnx_signature.cpp).
inline OnnxSignature read_onnx_signature_bytes(std::string_view bytes, const std::string& p) {
  OnnxSignature sig;
  std::vector<onnx::ValueInfo> inputs;
  std::set<std::string> initializers, files;
  bool graph = false;
  detail::WireReader model(bytes, p);
  detail::WireReader::Field f;
  while (model.next(f)) {
    if (f.number != 7 || f.type != onnx::wire::kBytes) continue;
    graph = true;
    detail::WireReader g(f.bytes, p);
    detail::WireReader::Field e;
    while (g.next(e)) {
      if (e.type != onnx::wire::kBytes) continue;
      if (e.number == 5) {
        auto [name, location] = detail::read_initializer(e.bytes, p);
        initializers.insert(name);
        if (!location.empty() && files.insert(location).second) sig.data_files.push_back(location);
      }
      if (e.number == 11) inputs.push_back(detail::read_value_info(e.bytes, p));
      if (e.number == 12) sig.outputs.push_back(detail::read_value_info(e.bytes, p));
    }
  }
  EMBER_CHECK(graph, FormatError, "ONNX file '", p, "' has no graph (", bytes.size(), " bytes): not an ONNX model");
  for (auto& v : inputs)
    if (!initializers.count(v.name)) sig.inputs.push_back(std::move(v));
  EMBER_CHECK(!sig.inputs.empty() && !sig.outputs.empty(), FormatError, "ONNX file '", p, "' has ",
              sig.inputs.size(), " graph inputs and ", sig.outputs.size(), " outputs; a served model needs both");
  return sig;
}

// The file is mapped, not read: a model of a few GB costs its graph's few KB of parsing.
inline OnnxSignature read_onnx_signature(const std::filesystem::path& path) {
  const io::detail::MappedFile file(path.string(), "ONNX");
  return read_onnx_signature_bytes(
      std::string_view(reinterpret_cast<const char*>(file.data()), static_cast<size_t>(file.size())), file.path());
}

}  // namespace ember::io::triton
