#pragma once
// GGUF files (llama.cpp's and ggml's model format, version 3; the format itself, the Q8_0
// quantizer and the validating parser are in io/gguf_format.hpp, the writer in io/gguf_writer.hpp):
//
//   io::gguf::Writer w;
//   w.add("general.architecture", io::gguf::Value::string("gpt2"));
//   w.add("gpt2.block_count", io::gguf::Value::of<uint32_t>(12));
//   io::gguf::add_tensor(w, "token_embd.weight", wte, io::gguf::GGMLType::Q8_0);  // converted while writing
//   w.write("model.gguf");                                                         // atomically
//
//   io::gguf::GGUFFile f("model.gguf");          // mapped read-only, validated on opening
//   uint32_t n = f.value("gpt2.block_count").get<uint32_t>();
//   AnyTensor w = f.get("token_embd.weight");    // F32 / F16 / BF16 as such, Q8_0 dequantized to float32
//
// ember tensors are row-major; a GGUF tensor info lists its dimensions reversed (ggml's ne), which
// add_tensor and get() take care of. deploy/gguf_export.hpp maps nn::GPT onto llama.cpp's gpt2.
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "ember/core/tensor.hpp"
#include "ember/io/atomic_file.hpp"
#include "ember/io/gguf_format.hpp"
#include "ember/io/gguf_writer.hpp"
#include "ember/io/mapped_file.hpp"

namespace ember::io::gguf {

namespace detail {
// Converts `n` elements of a floating tensor's host bytes to float.
inline void to_float(DType dt, const uint8_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    switch (dt) {
      case DType::Float32: std::memcpy(dst + i, src + 4 * i, 4); break;
      case DType::Float64: { double d; std::memcpy(&d, src + 8 * i, 8); dst[i] = static_cast<float>(d); break; }
      case DType::Float16: { uint16_t h; std::memcpy(&h, src + 2 * i, 2); dst[i] = ::ember::detail::half_bits_to_float(h); break; }
      default: { uint16_t b; std::memcpy(&b, src + 2 * i, 2); dst[i] = ::ember::detail::bf16_bits_to_float(b); break; }
    }
  }
}
}  // namespace detail

// Encodes `n` floats as `type` (F32, F16 with round to nearest even, or Q8_0) into `out`, which
// holds n / block * bytes of the type. `what` names the tensor in errors, `first` is x[0]'s index in it.
inline void encode(const float* x, int64_t n, GGMLType type, uint8_t* out, std::string_view what, int64_t first = 0) {
  switch (type) {
    case GGMLType::F32: std::memcpy(out, x, static_cast<size_t>(n) * 4); return;
    case GGMLType::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = ::ember::detail::float_to_half_bits(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case GGMLType::Q8_0: quantize_q8_0(x, n, out, what, first); return;
    default:
      throw ValueError(::ember::detail::str_cat(what, ": ember writes GGUF tensors as F32, F16 or Q8_0, not ", type_name(type)));
  }
}

// The bytes of a floating ember tensor (any device, any floating dtype) stored as `type`, produced
// when the writer writes them: a float32 tensor in host memory written as F32 goes out as it is,
// everything else is converted in chunks of 64 Ki values, so memory stays bounded. A device tensor
// is copied to the host first, one tensor at a time.
inline TensorBytes tensor_bytes(const AnyTensor& t, GGMLType type, std::string name) {
  EMBER_CHECK(t.defined(), ValueError, "gguf: tensor '", name, "' is undefined");
  EMBER_CHECK(is_floating(t.dtype()), DTypeError, "gguf: tensor '", name, "' is ", t.desc(),
              "; ember writes floating tensors (as F32, F16 or Q8_0)");
  EMBER_CHECK(type == GGMLType::F32 || type == GGMLType::F16 || type == GGMLType::Q8_0, ValueError, "gguf: tensor '",
              name, "': ember writes F32, F16 or Q8_0, not ", type_name(type));
  return [t, type, name = std::move(name)](const ByteSink& sink) {
    const int64_t n = t.numel();
    if (n == 0) return;
    std::vector<uint8_t> host;
    const uint8_t* src = static_cast<const uint8_t*>(t.data_ptr());
    if (!t.device().is_cpu()) {
      host.resize(t.nbytes());
      t.backend().copy_to_host(host.data(), t.data_ptr(), t.nbytes());
      src = host.data();
    }
    if (type == GGMLType::F32 && t.dtype() == DType::Float32) return sink(src, t.nbytes());
    if (type == GGMLType::F16 && t.dtype() == DType::Float16) return sink(src, t.nbytes());
    constexpr int64_t kChunk = int64_t{1} << 16;  // a multiple of Q8_0's block
    const TypeTraits& tt = traits(type);
    const size_t es = dtype_size(t.dtype());
    std::vector<float> f(static_cast<size_t>(std::min(n, kChunk)));
    std::vector<uint8_t> out(static_cast<size_t>(std::min(n, kChunk) / tt.block * tt.bytes));
    for (int64_t at = 0; at < n; at += kChunk) {
      const int64_t len = std::min(kChunk, n - at);
      detail::to_float(t.dtype(), src + static_cast<size_t>(at) * es, len, f.data());
      encode(f.data(), len, type, out.data(), name, at);
      sink(out.data(), static_cast<size_t>(len / tt.block * tt.bytes));
    }
  };
}
// Adds a tensor under `name` with the tensor's own shape.
inline Writer& add_tensor(Writer& w, const std::string& name, const AnyTensor& t, GGMLType type) {
  EMBER_CHECK(t.defined(), ValueError, "gguf: tensor '", name, "' is undefined");
  return w.add_tensor(name, t.shape().vec(), type, tensor_bytes(t, type, name));
}

// A GGUF file mapped read-only; parse_gguf validates it on opening.
class GGUFFile {
 public:
  explicit GGUFFile(const std::filesystem::path& path)
      : file_(path.string(), "gguf"), contents_(parse_gguf(file_.data(), file_.size(), file_.path())) {}

  const std::string& path() const { return file_.path(); }
  uint64_t file_size() const { return file_.size(); }
  const Contents& contents() const { return contents_; }
  const KeyValues& metadata() const { return contents_.metadata; }
  const std::vector<TensorInfo>& tensors() const { return contents_.tensors; }
  uint32_t alignment() const { return contents_.alignment; }
  bool contains(const std::string& key) const { return contents_.find(key) != nullptr; }
  const Value& value(const std::string& key) const {
    const Value* v = contents_.find(key);
    EMBER_CHECK(v != nullptr, ValueError, "gguf file '", file_.path(), "' has no metadata key '", key, "'");
    return *v;
  }
  const TensorInfo& info(const std::string& name) const {
    const TensorInfo* t = contents_.tensor(name);
    EMBER_CHECK(t != nullptr, ValueError, "gguf file '", file_.path(), "' has no tensor '", name, "'");
    return *t;
  }
  // A tensor's stored bytes inside the mapping (info(name).nbytes of them; valid while this lives).
  const uint8_t* data(const std::string& name) const { return file_.data() + contents_.data_start + info(name).offset; }

  // A new tensor with the stored values, in row-major shape: F32, F16, BF16, F64, I32, I64 as the
  // matching ember dtype; Q8_0 dequantized to float32. Other types are a DTypeError naming it.
  AnyTensor get(const std::string& name, Device device = Device::cpu()) const {
    const TensorInfo& t = info(name);
    const std::vector<int64_t> shape = t.shape();
    EMBER_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), ShapeError, "gguf file '", file_.path(), "': tensor '", name,
                "' has ", shape.size(), " dimensions; ember tensors have at most ", kMaxDims);
    const uint8_t* src = data(name);
    DType dt;
    switch (t.type) {
      case GGMLType::F32: case GGMLType::Q8_0: dt = DType::Float32; break;
      case GGMLType::F16: dt = DType::Float16; break;
      case GGMLType::BF16: dt = DType::BFloat16; break;
      case GGMLType::F64: dt = DType::Float64; break;
      case GGMLType::I32: dt = DType::Int32; break;
      case GGMLType::I64: dt = DType::Int64; break;
      default:
        throw DTypeError(::ember::detail::str_cat("gguf file '", file_.path(), "': tensor '", name, "' is ", type_name(t.type),
                                                  ", which ember does not decode (it reads F32, F16, BF16, F64, I32, I64 and Q8_0)"));
    }
    AnyTensor out = AnyTensor::empty(Shape(shape), dt);
    if (t.numel() > 0) {
      if (t.type == GGMLType::Q8_0)
        dequantize_q8_0(src, t.numel(), static_cast<float*>(out.data_ptr()));
      else
        std::memcpy(out.data_ptr(), src, static_cast<size_t>(t.nbytes));
    }
    return device.is_cpu() ? out : out.to(device);
  }

 private:
  io::detail::MappedFile file_;
  Contents contents_;
};

}  // namespace ember::io::gguf
