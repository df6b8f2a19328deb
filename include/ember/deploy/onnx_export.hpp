#pragma once
// io::onnx::export_model: a module (any tree of nn's layers, and custom modules through hooks) to
// an ONNX file that onnxruntime, TensorRT and other runtimes load, from C++.
//
//   io::onnx::export_model(*model, {example_input}, "model.onnx");           // opset 21, batch symbolic
//   io::onnx::export_model(*model, {x}, "model.onnx", {.opset = 17, .fold_batch_norm = true});
//
// - Opsets 17 to 25 (default 21); the IR version is the one that came with the opset.
// - Shapes: the example input fixes the element type and the static sizes; dynamic_axes names
//   the symbolic dimensions (default: dimension 0 of the input, "batch", and for integer inputs of
//   rank 2 or more, token ids, dimension 1 too, "sequence").
// - Types: the graph computes in the example input's floating type (fp32, fp16, bf16 or fp64), or
//   in `dtype`; weights are cast to it.
// - Weights go to an external data file when they are many (external_data, above
//   external_data_above bytes in all; protobuf stops at 2 GiB), each at an offset aligned to 4096
//   bytes so that a runtime can map it. The data file is named after the model file and a hash of
//   its contents ("model.onnx.<16 hex>.data"), and is written before the model that names it: a
//   crash at any moment leaves the previous model and its data as they were.
// - The module is exported in its inference form (eval: dropout is the identity, batch norm uses
//   its running statistics); the example input runs through ember once to check the exported
//   shapes. Errors name the module path and type that could not be exported.
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "ember/deploy/onnx_layers.hpp"
#include "ember/io/atomic_file.hpp"
#include "ember/version.hpp"

namespace ember::io::onnx {

enum class ExternalData {
  Auto,    // external when the weights are more than external_data_above bytes in all
  Always,  // every weight of at least external_min_tensor_bytes goes out
  Never,   // all inline (an error above protobuf's 2 GiB)
};

struct ExportOptions {
  int64_t opset = 21;
  std::string input_name = "input", output_name = "output";
  // Symbolic dimensions of the input: dimension index -> name. Empty: the defaults above.
  std::map<int, std::string> dynamic_axes;
  std::optional<DType> dtype;   // the graph's floating type (default: the example's, else the weights')
  bool fold_batch_norm = false;  // Conv2d followed by BatchNorm2d in a Sequential become one Conv
  ExternalData external_data = ExternalData::Auto;
  int64_t external_data_above = int64_t{1} << 30;
  int64_t external_min_tensor_bytes = 1024;
  int64_t training_step = -1;    // written to the metadata when >= 0
  std::vector<std::pair<std::string, std::string>> metadata;  // more ModelProto.metadata_props
  std::string graph_name = "ember";
  std::string doc_string;
  std::map<std::string, ModuleExporter> exporters;  // ONNX forms of custom modules, by type_name()
};

struct ExportResult {
  std::filesystem::path model_path, data_path;  // data_path empty when every weight is inline
  uint64_t model_bytes = 0, data_bytes = 0;
  size_t nodes = 0, initializers = 0, external_initializers = 0;
  ValueInfo input, output;
};

namespace detail {

inline void check_opset(int64_t opset) {
  EMBER_CHECK(opset >= 17 && opset <= 25, ValueError, "onnx export: opset ", opset,
              " is not supported; ember writes opsets 17 to 25 (TensorRT 11 parses up to 25)");
}

inline ElemType float_type(DType d) {
  EMBER_CHECK(is_floating(d), DTypeError, "onnx export: the graph's type must be floating point, got ", dtype_name(d));
  return elem_type_of(d);
}

inline DType dtype_of_elem(ElemType t) {
  switch (t) {
    case ElemType::Float: return DType::Float32;
    case ElemType::Double: return DType::Float64;
    case ElemType::Float16: return DType::Float16;
    case ElemType::BFloat16: return DType::BFloat16;
    case ElemType::Int64: return DType::Int64;
    case ElemType::Int32: return DType::Int32;
    case ElemType::Uint8: return DType::UInt8;
    default: throw DTypeError("onnx export: no ember dtype for an ONNX element type");
  }
}

// A 64-bit hash of the bytes (FNV-1a over 8-byte words, then the tail): names the data file.
inline uint64_t hash_bytes(uint64_t h, const std::string& s) {
  const size_t words = s.size() / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, s.data() + i * 8, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  for (size_t i = words * 8; i < s.size(); ++i) h = (h ^ static_cast<unsigned char>(s[i])) * 0x100000001b3ull;
  return h;
}

// Every module's training flag, so that export can run the module in eval and put it back.
class EvalForExport {
 public:
  explicit EvalForExport(nn::Module& m) {
    for (auto& [name, mod] : m.named_modules()) flags_.emplace_back(mod, mod->is_training());
    m.eval();
  }
  ~EvalForExport() {
    for (auto& [mod, on] : flags_) mod->train(on);
    // train() recurses: restore the children's own flags after their parents'.
    for (auto& [mod, on] : flags_)
      if (mod->is_training() != on) mod->train(on);
  }
  EvalForExport(const EvalForExport&) = delete;
  EvalForExport& operator=(const EvalForExport&) = delete;

 private:
  std::vector<std::pair<nn::Module*, bool>> flags_;
};

}  // namespace detail

inline ExportResult export_model(nn::Module& module, const std::vector<AnyTensor>& example_inputs,
                                 const std::filesystem::path& path, const ExportOptions& o = {}) {
  detail::check_opset(o.opset);
  EMBER_CHECK(example_inputs.size() == 1 && example_inputs[0].defined(), ValueError,
              "onnx export: one example input expected (modules take one input), got ", example_inputs.size());
  const AnyTensor& example = example_inputs[0];
  // The graph's floating type.
  DType compute = DType::Float32;
  if (o.dtype) compute = *o.dtype;
  else if (is_floating(example.dtype())) compute = example.dtype();
  else
    for (const auto& p : module.parameters())
      if (is_floating(p.dtype())) {
        compute = p.dtype();
        break;
      }
  GraphBuilder b(o.opset, detail::float_type(compute));

  // The input, with its symbolic dimensions.
  ValueInfo in{o.input_name, is_floating(example.dtype()) ? b.compute_type() : elem_type_of(example.dtype()), {}};
  std::map<int, std::string> axes = o.dynamic_axes;
  if (axes.empty()) {
    if (example.dim() >= 1) axes[0] = "batch";
    if (!is_floating(example.dtype()) && example.dim() >= 2) axes[1] = "sequence";
  }
  for (int i = 0; i < example.dim(); ++i) {
    auto it = axes.find(i);
    in.shape.push_back(it != axes.end() ? Dim::symbol(it->second) : Dim::fixed(example.shape()[i]));
  }
  for (const auto& [i, name] : axes)
    EMBER_CHECK(i >= 0 && i < example.dim() && !name.empty(), ValueError, "onnx export: dynamic axis ", i, " ('",
                name, "') is not a dimension of the example input ", example.desc());

  detail::EvalForExport eval(module);
  Exporter ex(b, o.exporters, o.fold_batch_norm);
  Value out = ex.module(module, Value{o.input_name, in.type, in.shape});

  // The example through ember: the exported shape must agree where it is static.
  AnyTensor reference;
  {
    NoGradGuard no_grad;
    reference = module.forward_any(is_floating(example.dtype()) ? example.to(compute) : example);
  }
  bool agrees = reference.dim() == out.rank();
  for (int i = 0; agrees && i < out.rank(); ++i)
    agrees = out.dim(i) < 0 || out.dim(i) == reference.shape()[i];
  EMBER_CHECK(agrees, ShapeError, "onnx export: the exported graph's output ", out.shape_str(), " disagrees with ",
              module.type_name(), "'s output ", reference.desc(), " for the example input ", example.desc());
  const std::string result_name = o.output_name;
  b.graph().nodes.push_back(Node{"Identity", b.fresh("output"), "", {out.name}, {result_name}, {}});

  Graph& g = b.graph();
  g.name = o.graph_name;
  g.inputs = {in};
  ValueInfo outv{result_name, is_floating(reference.dtype()) ? out.type : elem_type_of(reference.dtype()), out.shape};
  g.outputs = {outv};

  Model model;
  model.ir_version = ir_version_for_opset(o.opset);
  model.opsets = {{"", o.opset}};
  model.producer_name = "ember";
  model.producer_version = kVersionString;
  model.doc_string = o.doc_string;
  if (o.training_step >= 0) model.metadata.emplace_back("training_step", std::to_string(o.training_step));
  model.metadata.emplace_back("ember.module", module.type_name());
  for (const auto& kv : o.metadata) model.metadata.push_back(kv);

  // Which weights go to the data file.
  uint64_t total = 0;
  for (const auto& t : g.initializers) total += t.raw.size();
  const bool external = o.external_data == ExternalData::Always ||
                        (o.external_data == ExternalData::Auto && total > static_cast<uint64_t>(o.external_data_above));
  ExportResult r;
  r.model_path = path;
  r.nodes = g.nodes.size();
  r.initializers = g.initializers.size();
  r.input = in;
  r.output = outv;
  std::vector<ExternalPlace> places(g.initializers.size());
  std::vector<const ExternalPlace*> place_of(g.initializers.size(), nullptr);
  const std::string model_file = path.filename().string();
  EMBER_CHECK(!model_file.empty(), IOError, "onnx export: '", path.string(), "' names no file");
  if (external) {
    uint64_t h = 0xcbf29ce484222325ull, offset = 0;
    for (size_t i = 0; i < g.initializers.size(); ++i) {
      const auto& raw = g.initializers[i].raw;
      if (raw.size() < static_cast<size_t>(o.external_min_tensor_bytes)) continue;
      offset = (offset + 4095) / 4096 * 4096;
      places[i].offset = offset;
      places[i].length = raw.size();
      place_of[i] = &places[i];
      offset += raw.size();
      h = detail::hash_bytes(h ^ offset, raw);
      ++r.external_initializers;
    }
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016" PRIx64, h);
    const std::string data_file = model_file + "." + hex + ".data";
    for (auto& p : places) p.location = data_file;
    r.data_path = path.parent_path() / data_file;
    if (r.external_initializers > 0) {
      AtomicWriter w(r.data_path);
      const std::string zeros(4096, '\0');
      uint64_t at = 0;
      for (size_t i = 0; i < g.initializers.size(); ++i) {
        if (!place_of[i]) continue;
        if (places[i].offset > at) w.write(zeros.data(), static_cast<size_t>(places[i].offset - at));
        w.write(g.initializers[i].raw.data(), g.initializers[i].raw.size());
        at = places[i].offset + places[i].length;
      }
      w.commit();
      r.data_bytes = at;
    } else {
      r.data_path.clear();
    }
  }
  model.graph = std::move(g);
  const EncodedModel encoded = encode_model_pieces(model, place_of);
  EMBER_CHECK(encoded.size() < (uint64_t{1} << 31), ValueError, "onnx export: the model is ", encoded.size(),
              " bytes, above protobuf's 2 GiB; use external_data = Auto or Always");
  {
    AtomicWriter w(path);
    encoded.write_to([&](const char* d, size_t n) { w.write(d, n); });
    w.commit();
  }
  r.model_bytes = encoded.size();
  // Data files of earlier exports to this path, no longer named by the model.
  std::error_code ec;
  const std::filesystem::path dir = path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() == model_file.size() + 22 && n.rfind(model_file + ".", 0) == 0 && n.ends_with(".data") &&
        e.path() != r.data_path)
      std::filesystem::remove(e.path(), ec);
  }
  return r;
}

}  // namespace ember::io::onnx
