#pragma once
// The GGUF writer (the format: io/gguf_format.hpp): metadata and tensors in, the file's bytes out,
// to memory or atomically to a path (io/atomic_file.hpp). Bytes only; io/gguf.hpp adds ember tensors.
//
//   io::gguf::Writer w;
//   w.add("general.architecture", io::gguf::Value::string("gpt2"));
//   w.add_tensor("x", {2, 3}, io::gguf::GGMLType::F32, floats);   // row-major shape; borrowed bytes
//   w.write("x.gguf");
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/io/atomic_file.hpp"
#include "ember/io/gguf_format.hpp"

namespace ember::io::gguf {

// Receives a tensor's bytes in order; a TensorBytes producer calls it as often as it likes, with
// exactly TensorInfo::nbytes bytes in all (the writer checks).
using ByteSink = std::function<void(const void*, size_t)>;
using TensorBytes = std::function<void(const ByteSink&)>;

// Collects metadata and tensors, then writes the file: to bytes (serialize) or atomically to a path
// (write; io/atomic_file.hpp). The alignment is general.alignment's value when it is added (a u32
// power of two, as ggml and gguf-py require), else 32. Tensors are laid out in the order added.
class Writer {
 public:
  Writer& add(std::string key, Value value) {
    EMBER_CHECK(!key.empty() && key.size() <= kMaxKeyBytes, ValueError, "gguf writer: a key must have 1 to ",
                kMaxKeyBytes, " bytes, got ", key.size());
    for (unsigned char c : key)
      EMBER_CHECK(c >= 0x20 && c < 0x7f, ValueError, "gguf writer: key '", key, "' must be printable ASCII");
    EMBER_CHECK(!keys_.count(key), ValueError, "gguf writer: the key '", key, "' is added twice");
    if (key == "general.alignment") {
      EMBER_CHECK(value.type() == ValueType::UInt32, ValueError, "gguf writer: general.alignment must be UINT32, got ",
                  value.describe_type());
      const uint32_t a = value.get<uint32_t>();
      EMBER_CHECK(a != 0 && (a & (a - 1)) == 0, ValueError, "gguf writer: general.alignment must be a power of two, got ", a);
      alignment_ = a;
    }
    keys_.insert(key);
    kv_.push_back({std::move(key), std::move(value)});
    return *this;
  }
  // `shape` is row-major (ember's and PyTorch's order); the file gets it reversed, as ggml's ne.
  Writer& add_tensor(std::string name, const std::vector<int64_t>& shape, GGMLType type, TensorBytes bytes) {
    const char* w = "gguf writer";
    EMBER_CHECK(!name.empty() && name.size() <= kMaxNameBytes, ValueError, w, ": tensor name '", name, "' must have 1 to ",
                kMaxNameBytes, " bytes (ggml's limit)");
    EMBER_CHECK(!names_.count(name), ValueError, w, ": the tensor name '", name, "' is added twice");
    EMBER_CHECK(!shape.empty() && shape.size() <= static_cast<size_t>(kMaxGGMLDims), ValueError, w, ": tensor '", name,
                "' has ", shape.size(), " dimensions; ggml holds 1 to ", kMaxGGMLDims);
    const TypeTraits& tt = traits(type);
    TensorInfo info{name, {shape.rbegin(), shape.rend()}, type, 0, 0};
    uint64_t numel = 1;
    for (int64_t d : shape) {
      EMBER_CHECK(d >= 0, ValueError, w, ": tensor '", name, "' has a negative dimension");
      EMBER_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel) &&
                      numel <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                  ValueError, w, ": tensor '", name, "' has too many elements");
    }
    EMBER_CHECK(info.ne[0] % tt.block == 0, ValueError, w, ": tensor '", name, "' has rows of ", info.ne[0],
                " values; ", tt.name, " stores rows in blocks of ", tt.block);
    info.nbytes = numel / static_cast<uint64_t>(tt.block) * static_cast<uint64_t>(tt.bytes);
    names_.insert(name);  // only now: a refused tensor leaves the name free
    tensors_.push_back(std::move(info));
    bytes_.push_back(std::move(bytes));
    return *this;
  }
  // Borrowed bytes (TensorInfo::nbytes of them), which must stay valid until the file is written.
  Writer& add_tensor(std::string name, const std::vector<int64_t>& shape, GGMLType type, const void* data) {
    EMBER_CHECK(data != nullptr || shape_numel_is_zero(shape), ValueError, "gguf writer: tensor '", name,
                "' has no data");
    add_tensor(std::move(name), shape, type, TensorBytes{});
    bytes_.back() = [data, n = tensors_.back().nbytes](const ByteSink& sink) { sink(data, n); };
    return *this;
  }

  uint32_t alignment() const { return alignment_; }
  const KeyValues& metadata() const { return kv_; }
  // The tensors with their offsets.
  std::vector<TensorInfo> tensors() const {
    std::vector<TensorInfo> out = tensors_;
    uint64_t at = 0;
    for (auto& t : out) {
      t.offset = at;
      at += align_up(t.nbytes, alignment_);
    }
    return out;
  }
  uint64_t header_bytes() const {  // up to the end of the tensor infos
    uint64_t n = 24;
    uint64_t counted = 0;
    auto count = [&](const void*, size_t len) { counted += len; };
    for (const auto& kv : kv_) {
      n += 8 + kv.key.size() + 4;
      kv.value.emit(count);
    }
    for (const auto& t : tensors_) n += 8 + t.name.size() + 4 + 8 * t.ne.size() + 4 + 8;
    return n + counted;
  }
  uint64_t data_start() const { return align_up(header_bytes(), alignment_); }
  uint64_t file_size() const {
    uint64_t n = data_start();
    for (const auto& t : tensors_) n += align_up(t.nbytes, alignment_);
    return n;
  }

  // The whole file, in order, to `put`.
  void emit(const ByteSink& put) const {
    const std::vector<TensorInfo> infos = tensors();
    const uint64_t counts[2] = {infos.size(), kv_.size()};
    put("GGUF", 4);
    put(&kVersion, 4);
    put(counts, 16);
    for (const auto& kv : kv_) {
      const uint64_t n = kv.key.size();
      const auto type = static_cast<uint32_t>(kv.value.type());
      put(&n, 8);
      put(kv.key.data(), kv.key.size());
      put(&type, 4);
      kv.value.emit(put);
    }
    for (const auto& t : infos) {
      const uint64_t n = t.name.size();
      const auto nd = static_cast<uint32_t>(t.ne.size());
      const auto type = static_cast<uint32_t>(t.type);
      put(&n, 8);
      put(t.name.data(), t.name.size());
      put(&nd, 4);
      put(t.ne.data(), 8 * t.ne.size());
      put(&type, 4);
      put(&t.offset, 8);
    }
    static const uint8_t kZeros[256] = {};
    auto pad = [&](uint64_t n) {
      for (uint64_t k = (alignment_ - n % alignment_) % alignment_; k > 0;) {
        const size_t len = static_cast<size_t>(std::min<uint64_t>(k, sizeof kZeros));
        put(kZeros, len);
        k -= len;
      }
    };
    pad(header_bytes());
    for (size_t i = 0; i < infos.size(); ++i) {
      uint64_t got = 0;
      if (bytes_[i]) bytes_[i]([&](const void* p, size_t len) {
        got += len;
        EMBER_CHECK(got <= infos[i].nbytes, ValueError, "gguf writer: tensor '", infos[i].name, "' produced more than its ",
                    infos[i].nbytes, " bytes");
        put(p, len);
      });
      EMBER_CHECK(got == infos[i].nbytes, ValueError, "gguf writer: tensor '", infos[i].name, "' produced ", got,
                  " bytes; its type ", type_name(infos[i].type), " and shape make ", infos[i].nbytes);
      pad(got);
    }
  }
  std::vector<uint8_t> serialize() const {
    std::vector<uint8_t> out;
    out.reserve(static_cast<size_t>(file_size()));
    emit([&](const void* p, size_t n) { out.insert(out.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n); });
    return out;
  }
  // Writes the file atomically: the previous file, if any, stays as it was on any failure.
  void write(const std::filesystem::path& path) const {
    AtomicWriter w(path);
    // Small pieces (headers, padding) are gathered so that the file gets a few large writes.
    std::vector<uint8_t> buf;
    buf.reserve(size_t{1} << 20);
    emit([&](const void* p, size_t n) {
      if (buf.size() + n > buf.capacity()) {
        w.write(buf.data(), buf.size());
        buf.clear();
      }
      if (n >= buf.capacity()) return w.write(p, n);
      buf.insert(buf.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    });
    w.write(buf.data(), buf.size());
    w.commit();
  }

 private:
  static bool shape_numel_is_zero(const std::vector<int64_t>& shape) {
    return std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d == 0; });
  }
  KeyValues kv_;
  std::vector<TensorInfo> tensors_;
  std::vector<TensorBytes> bytes_;
  std::unordered_set<std::string> keys_, names_;
  uint32_t alignment_ = kDefaultAlignment;
};

}  // namespace ember::io::gguf
