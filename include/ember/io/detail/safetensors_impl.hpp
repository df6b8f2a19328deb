#pragma once
// The safetensors reader and writer (io/safetensors.hpp declares them): nlohmann-json,
// compiled once into the library under EMBER_COMPILED_LIB, included by the header otherwise.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "ember/io/atomic_file.hpp"
#include "ember/io/safetensors.hpp"

namespace ember::io {

namespace detail {
// The JSON header for these tensors, padded with spaces to a multiple of 8 bytes. Checks names,
// definedness and storage sharing; `who` names the operation in messages.
inline std::string safetensors_header_json(const TensorList& tensors, const Metadata& metadata,
                                           const std::string& who) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    j["__metadata__"] = std::move(m);
  }
  std::unordered_map<const Storage*, const std::string*> owners;
  uint64_t pos = 0;
  for (const auto& [name, t] : tensors) {
    EMBER_CHECK(name != "__metadata__", ValueError, who, ": '__metadata__' is reserved and cannot name a tensor");
    EMBER_CHECK(t.defined(), ValueError, who, ": tensor '", name, "' is undefined");
    EMBER_CHECK(!j.contains(name), ValueError, who, ": the name '", name, "' appears twice");
    if (t.nbytes() > 0 && t.impl()->storage) {
      auto [it, fresh] = owners.emplace(t.impl()->storage.get(), &name);
      EMBER_CHECK(fresh, ValueError, who, ": tensors '", *it->second, "' and '", name,
                  "' share storage (tied or view tensors); safetensors stores each tensor's own bytes: save one "
                  "of them, or save a clone() of the other");
    }
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = safetensors_dtype_name(t.dtype());
    e["shape"] = t.shape().vec();
    e["data_offsets"] = {pos, pos + t.nbytes()};
    pos += t.nbytes();
    j[name] = std::move(e);
  }
  std::string s = j.dump();
  s.append((8 - s.size() % 8) % 8, ' ');
  return s;
}

// Calls sink(ptr, bytes) with a tensor's bytes in host memory: the tensor's own memory on the
// CPU, staged through a bounded host buffer for a device tensor.
template <class Sink>
void tensor_bytes(const AnyTensor& t, std::vector<char>& staging, Sink&& sink) {
  const size_t n = t.nbytes();
  if (n == 0) return;
  if (t.device().is_cpu()) {
    sink(static_cast<const char*>(t.data_ptr()), n);
    return;
  }
  constexpr size_t kChunk = size_t{64} << 20;
  staging.resize(std::min(n, kChunk));
  for (size_t off = 0; off < n; off += kChunk) {
    const size_t len = std::min(kChunk, n - off);
    t.backend().copy_to_host(staging.data(), static_cast<const char*>(t.data_ptr()) + off, len);
    sink(staging.data(), len);
  }
}
}  // namespace detail

EMBER_LIB_INLINE std::vector<uint8_t> serialize(const TensorList& tensors, const Metadata& metadata) {
  const std::string header = detail::safetensors_header_json(tensors, metadata, "io::serialize");
  std::vector<uint8_t> out(8 + header.size());
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  std::vector<char> staging;
  for (const auto& [name, t] : tensors)
    detail::tensor_bytes(t, staging, [&](const char* p, size_t len) { out.insert(out.end(), p, p + len); });
  return out;
}

EMBER_LIB_INLINE void save_file(const std::string& path, const TensorList& tensors,
                                const Metadata& metadata, const ByteObserver& on_bytes) {
  const std::string who = "io::save_file('" + path + "')";
  const std::string header = detail::safetensors_header_json(tensors, metadata, who);
  AtomicWriter w(path);
  auto put = [&](const void* p, size_t len) {
    w.write(p, len);
    if (on_bytes) on_bytes(p, len);
  };
  const uint64_t n = header.size();
  put(&n, 8);
  put(header.data(), header.size());
  std::vector<char> staging;
  for (const auto& [name, t] : tensors) detail::tensor_bytes(t, staging, put);
  w.commit();
}

EMBER_LIB_INLINE SafetensorsFile::SafetensorsFile(const std::string& path)
    : file_(path, "safetensors"), header_(parse_safetensors(file_.data(), file_.size(), file_.path())) {}

EMBER_LIB_INLINE SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : file_(std::move(o.file_)), header_(std::move(o.header_)), staging_(std::exchange(o.staging_, {})),
      chunk_(o.chunk_) {}

EMBER_LIB_INLINE SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    free_staging();
    file_ = std::move(o.file_);
    header_ = std::move(o.header_);
    staging_ = std::exchange(o.staging_, {});
    chunk_ = o.chunk_;
  }
  return *this;
}

EMBER_LIB_INLINE std::vector<std::string> SafetensorsFile::keys() const {
  std::vector<std::string> k;
  for (const auto& t : header_.tensors) k.push_back(t.name);
  return k;
}

EMBER_LIB_INLINE const TensorEntry& SafetensorsFile::entry(const std::string& name) const {
  const TensorEntry* e = header_.find(name);
  EMBER_CHECK(e != nullptr, ValueError, "safetensors file '", file_.path(), "' has no tensor '", name, "'");
  return *e;
}

EMBER_LIB_INLINE void SafetensorsFile::set_staging_bytes(size_t bytes) {
  free_staging();
  staging_.backend = nullptr;
  chunk_ = bytes > 0 ? bytes : 1;
}

EMBER_LIB_INLINE TensorList SafetensorsFile::load_all(Device device) const {
  TensorList out;
  out.reserve(header_.tensors.size());
  for (const auto& e : header_.tensors) out.emplace_back(e.name, load(e, device));
  return out;
}

EMBER_LIB_INLINE AnyTensor SafetensorsFile::load(const TensorEntry& e, Device device) const {
  EMBER_CHECK(e.dtype.has_value(), DTypeError, "safetensors file '", file_.path(), "': tensor '", e.name, "' has dtype ",
              e.dtype_name, ", which ember cannot hold (ember holds F64, F32, F16, BF16, I64, I32, U8)");
  EMBER_CHECK(e.shape.size() <= static_cast<size_t>(kMaxDims), ShapeError, "safetensors file '", file_.path(),
              "': tensor '", e.name, "' has ", e.shape.size(), " dimensions; ember tensors have at most ", kMaxDims);
  AnyTensor t = AnyTensor::empty(Shape(e.shape), *e.dtype, device);
  if (e.nbytes() == 0) return t;
  const uint8_t* src = file_.data() + header_.data_start + e.begin;
  if (device.is_cpu()) {
    std::memcpy(t.data_ptr(), src, e.nbytes());
    return t;
  }
  upload(t.backend(), static_cast<uint8_t*>(t.data_ptr()), src, e.nbytes());
  return t;
}

EMBER_LIB_INLINE void SafetensorsFile::upload(Backend& b, uint8_t* dst, const uint8_t* src, size_t n) const {
  if (staging_.backend != &b) {
    free_staging();
    staging_.backend = &b;
    staging_.bytes = chunk_;
  }
  uint64_t ticket[2] = {0, 0};
  try {
    size_t off = 0;
    for (int i = 0; off < n; i ^= 1) {
      const size_t len = std::min(staging_.bytes, n - off);
      if (!staging_.buf[i]) staging_.buf[i] = b.allocate_pinned(staging_.bytes);
      if (ticket[i]) b.wait_upload(ticket[i]);  // that buffer's previous chunk has been read
      std::memcpy(staging_.buf[i], src + off, len);
      ticket[i] = b.upload_async(dst + off, staging_.buf[i], len);
      off += len;
    }
  } catch (...) {
    for (uint64_t tk : ticket)
      if (tk) b.wait_upload(tk);
    throw;
  }
  for (uint64_t tk : ticket)
    if (tk) b.wait_upload(tk);  // the buffers are free for the next tensor
}

EMBER_LIB_INLINE void SafetensorsFile::free_staging() const noexcept {
  for (void*& p : staging_.buf)
    if (p) {
      staging_.backend->free_pinned(p, staging_.bytes);
      p = nullptr;
    }
}

EMBER_LIB_INLINE TensorList load_file(const std::string& path, Device device) {
  return SafetensorsFile(path).load_all(device);
}
EMBER_LIB_INLINE Metadata load_metadata(const std::string& path) { return SafetensorsFile(path).metadata(); }

EMBER_LIB_INLINE TensorList deserialize(const uint8_t* data, size_t size, std::string_view name) {
  SafetensorsHeader h = parse_safetensors(data, size, name);
  TensorList out;
  for (const auto& e : h.tensors) {
    EMBER_CHECK(e.dtype.has_value(), DTypeError, "safetensors '", name, "': tensor '", e.name, "' has dtype ",
                e.dtype_name, ", which ember cannot hold (ember holds F64, F32, F16, BF16, I64, I32, U8)");
    EMBER_CHECK(e.shape.size() <= static_cast<size_t>(kMaxDims), ShapeError, "safetensors '", name, "': tensor '",
                e.name, "' has ", e.shape.size(), " dimensions; ember tensors have at most ", kMaxDims);
    AnyTensor t = AnyTensor::empty(Shape(e.shape), *e.dtype);
    if (e.nbytes() > 0) std::memcpy(t.data_ptr(), data + h.data_start + e.begin, e.nbytes());
    out.emplace_back(e.name, t);
  }
  return out;
}

}  // namespace ember::io
