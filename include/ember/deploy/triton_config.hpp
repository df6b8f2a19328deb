#pragma once
// io::triton::model_config: a Triton Inference Server model configuration (config.pbtxt, the text
// form of Triton's ModelConfig message) for an ONNX model served by Triton's onnxruntime backend,
// from the graph's inputs and outputs and the serving options.
//
//   name: "classifier"
//   platform: "onnxruntime_onnx"
//   backend: "onnxruntime"
//   max_batch_size: 8
//   input [ { name: "input" data_type: TYPE_FP32 dims: [ 3, 32, 32 ] } ]
//   output [ { name: "output" data_type: TYPE_FP32 dims: [ 10 ] } ]
//   instance_group [ { count: 1 kind: KIND_CPU } ]
//   dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100 }
//
// - With max_batch_size > 0, Triton adds the batch dimension itself: dimension 0 of every input
//   and output must be symbolic in the graph (ember's export names it "batch") and is left out of
//   dims. A tensor that is only the batch ([batch]) gets dims [ 1 ] and reshape { shape: [ ] },
//   Triton's spelling of a per-example scalar. max_batch_size = 0: dims are the whole shape.
// - Other symbolic or unknown dimensions are -1 (a sequence length, an image size).
// - Element types map to Triton's: float TYPE_FP32, float16 TYPE_FP16, bfloat16 TYPE_BF16, double
//   TYPE_FP64, int8/16/32/64 TYPE_INT*, uint8/16/32/64 TYPE_UINT*, bool TYPE_BOOL, string
//   TYPE_STRING; others (complex, float8, int4) have no Triton type and are an error.
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "ember/io/onnx_proto.hpp"

namespace ember::io::triton {

enum class InstanceKind { Auto, Cpu, Gpu };  // KIND_AUTO: GPUs where there are any, else the CPU

struct ConfigOptions {
  std::string name;              // the model's name: its folder in the repository
  int64_t max_batch_size = 8;    // 0: Triton does not batch, and dims are the whole shapes
  InstanceKind instance_kind = InstanceKind::Auto;
  int64_t instance_count = 1;    // model instances (per GPU with Gpu / Auto on a GPU machine)
  bool dynamic_batching = true;  // Triton gathers requests into batches (needs max_batch_size > 0)
  std::vector<int64_t> preferred_batch_sizes;  // each 1..max_batch_size; empty: as large as possible
  int64_t max_queue_delay_us = 0;              // how long a request may wait for others
};

namespace detail {

// Triton's DataType name of an ONNX element type (TensorProto.DataType values).
inline std::string triton_type(onnx::ElemType t, const std::string& model, const std::string& tensor) {
  switch (static_cast<int32_t>(t)) {
    case 1: return "TYPE_FP32";
    case 2: return "TYPE_UINT8";
    case 3: return "TYPE_INT8";
    case 4: return "TYPE_UINT16";
    case 5: return "TYPE_INT16";
    case 6: return "TYPE_INT32";
    case 7: return "TYPE_INT64";
    case 8: return "TYPE_STRING";
    case 9: return "TYPE_BOOL";
    case 10: return "TYPE_FP16";
    case 11: return "TYPE_FP64";
    case 12: return "TYPE_UINT32";
    case 13: return "TYPE_UINT64";
    case 16: return "TYPE_BF16";
    default:
      throw DTypeError(::ember::detail::str_cat("Triton config '", model, "': tensor '", tensor,
                                                "' has ONNX element type ", static_cast<int32_t>(t),
                                                ", which has no Triton data type"));
  }
}

// A protobuf text-format string literal.
inline std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

inline std::string shape_text(const onnx::ValueInfo& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.shape.size(); ++i)
    s += (i ? ", " : "") + (!v.shape[i].param.empty() ? v.shape[i].param
                            : v.shape[i].value >= 0   ? std::to_string(v.shape[i].value)
                                                      : std::string("?"));
  return s + "]";
}

inline std::string int_list(const std::vector<int64_t>& v) {
  std::string s = "[ ";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (v.empty() ? "]" : " ]");
}

// One input or output entry.
inline std::string tensor_entry(const onnx::ValueInfo& v, const ConfigOptions& o, const char* role) {
  const bool batched = o.max_batch_size > 0;
  if (batched) {
    EMBER_CHECK(!v.shape.empty(), ShapeError, "Triton config '", o.name, "': ", role, " '", v.name,
                "' is a scalar, but max_batch_size ", o.max_batch_size,
                " needs a batch dimension first; use max_batch_size = 0");
    EMBER_CHECK(!v.shape[0].is_static(), ShapeError, "Triton config '", o.name, "': max_batch_size ",
                o.max_batch_size, " needs dimension 0 of ", role, " '", v.name, "' ", shape_text(v),
                " to be symbolic (the batch), but it is fixed at ", v.shape[0].value,
                "; export with a symbolic dimension 0 (onnx::ExportOptions::dynamic_axes) or use max_batch_size = 0");
  }
  std::vector<int64_t> dims;
  for (size_t i = batched ? 1 : 0; i < v.shape.size(); ++i) dims.push_back(v.shape[i].is_static() ? v.shape[i].value : -1);
  std::string s = "  {\n    name: " + quoted(v.name) + "\n    data_type: " + triton_type(v.type, o.name, v.name) +
                  "\n    dims: " + int_list(dims.empty() ? std::vector<int64_t>{1} : dims) + "\n";
  if (dims.empty()) s += "    reshape: { shape: [ ] }\n";
  return s + "  }";
}

inline void check_options(const ConfigOptions& o) {
  EMBER_CHECK(!o.name.empty() && o.name != "." && o.name != ".." && o.name[0] != '.', ValueError,
              "Triton config: model name '", o.name, "' is empty or starts with '.'; it names the model's folder");
  for (const char c : o.name)
    EMBER_CHECK((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
                    c == '.',
                ValueError, "Triton config: model name '", o.name, "' has the character '", c,
                "'; a model name (its folder and URL path) uses letters, digits, '_', '-' and '.'");
  EMBER_CHECK(o.max_batch_size >= 0, ValueError, "Triton config '", o.name, "': max_batch_size ", o.max_batch_size,
              " is negative (0: no batching)");
  EMBER_CHECK(o.instance_count >= 1, ValueError, "Triton config '", o.name, "': instance_count ", o.instance_count,
              " must be at least 1");
  EMBER_CHECK(!o.dynamic_batching || o.max_batch_size > 0, ValueError, "Triton config '", o.name,
              "': dynamic_batching needs max_batch_size > 0 (it is 0); set dynamic_batching = false");
  EMBER_CHECK(o.max_queue_delay_us >= 0, ValueError, "Triton config '", o.name, "': max_queue_delay_us ",
              o.max_queue_delay_us, " is negative");
  for (const int64_t b : o.preferred_batch_sizes)
    EMBER_CHECK(o.dynamic_batching && b >= 1 && b <= o.max_batch_size, ValueError, "Triton config '", o.name,
                "': preferred batch size ", b, " must be within 1..max_batch_size (", o.max_batch_size,
                ") with dynamic_batching on");
}

}  // namespace detail

// The config.pbtxt text for an ONNX model with these graph inputs and outputs.
inline std::string model_config(const std::vector<onnx::ValueInfo>& inputs, const std::vector<onnx::ValueInfo>& outputs,
                                const ConfigOptions& o) {
  detail::check_options(o);
  EMBER_CHECK(!inputs.empty() && !outputs.empty(), ValueError, "Triton config '", o.name, "': ", inputs.size(),
              " inputs and ", outputs.size(), " outputs; a served model needs both");
  std::string s = "name: " + detail::quoted(o.name) + "\nplatform: \"onnxruntime_onnx\"\nbackend: \"onnxruntime\"\n" +
                  "max_batch_size: " + std::to_string(o.max_batch_size) + "\n";
  for (const auto& [key, list, role] : {std::tuple{"input", &inputs, "input"}, std::tuple{"output", &outputs, "output"}}) {
    s += std::string(key) + " [\n";
    for (size_t i = 0; i < list->size(); ++i) s += detail::tensor_entry((*list)[i], o, role) + (i + 1 < list->size() ? ",\n" : "\n");
    s += "]\n";
  }
  const char* kind = o.instance_kind == InstanceKind::Cpu ? "KIND_CPU" : o.instance_kind == InstanceKind::Gpu ? "KIND_GPU" : "KIND_AUTO";
  s += "instance_group [\n  {\n    count: " + std::to_string(o.instance_count) + "\n    kind: " + kind + "\n  }\n]\n";
  if (o.dynamic_batching) {
    s += "dynamic_batching {\n";
    if (!o.preferred_batch_sizes.empty()) s += "  preferred_batch_size: " + detail::int_list(o.preferred_batch_sizes) + "\n";
    s += "  max_queue_delay_microseconds: " + std::to_string(o.max_queue_delay_us) + "\n}\n";
  }
  return s;
}

}  // namespace ember::io::triton
