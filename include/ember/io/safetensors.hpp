#pragma once
// safetensors files (the Hugging Face format; header rules in io/safetensors_header.hpp):
//
//   io::save_file("model.safetensors", model.state_dict(), {{"step", "1000"}});
//   io::TensorList sd = io::load_file("model.safetensors");            // every tensor, on the CPU
//   io::SafetensorsFile f("big.safetensors");                          // memory-mapped, validated
//   AnyTensor w = f.get("h.0.attn.c_attn.weight", Device::cuda(0));    // one tensor at a time
//
// The writer emits the header in the order given (metadata first), padded with spaces so that the
// data starts at a multiple of 8, then the tensors' bytes in the same order, contiguously; it
// refuses two tensors that share storage (as safetensors does: tied weights are saved once) and
// writes atomically (io/atomic_file.hpp). The reader maps the file read-only and copies a tensor's
// bytes straight from the mapping into the tensor's memory; onto a GPU through two pinned host
// buffers that the file object keeps (a chunk is copied from the mapping into one while the other
// uploads: Backend::allocate_pinned / upload_async).
#include <sys/mman.h>
#include <sys/stat.h>

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ember/core/tensor.hpp"
#include "ember/io/atomic_file.hpp"
#include "ember/io/safetensors_header.hpp"

namespace ember::io {

// Ordered name -> tensor list (the same type as nn::StateDict).
using TensorList = std::vector<std::pair<std::string, AnyTensor>>;
using Metadata = std::map<std::string, std::string>;

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

// The file's bytes in memory (what save_file writes).
inline std::vector<uint8_t> serialize(const TensorList& tensors, const Metadata& metadata = {}) {
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

// Called with every byte range written, in order (a checksum of the file as it is written).
using ByteObserver = std::function<void(const void*, size_t)>;

// Writes a safetensors file atomically. Throws ValueError for tensors it refuses (before touching
// the disk) and IOError for a failed write (the previous file, if any, stays as it was).
inline void save_file(const std::filesystem::path& path, const TensorList& tensors, const Metadata& metadata = {},
                      const ByteObserver& on_bytes = {}) {
  const std::string who = "io::save_file('" + path.string() + "')";
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

// A safetensors file mapped read-only; the header is validated on opening.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path) : path_(path.string()) {
    int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) detail::throw_io("cannot open safetensors file", path_, errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      detail::throw_io("cannot stat safetensors file", path_, err);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      throw IOError("safetensors file '" + path_ + "' is not a regular file");
    }
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      int err = errno;
      ::close(fd);
      if (p == MAP_FAILED) detail::throw_io("cannot map safetensors file", path_, err);
      map_ = static_cast<const uint8_t*>(p);
    } else {
      ::close(fd);
    }
    try {
      header_ = parse_safetensors(map_, size_, path_);
    } catch (...) {
      unmap();
      throw;
    }
  }
  SafetensorsFile(SafetensorsFile&& o) noexcept
      : path_(std::move(o.path_)), map_(std::exchange(o.map_, nullptr)), size_(std::exchange(o.size_, 0)),
        header_(std::move(o.header_)), staging_(std::exchange(o.staging_, {})), chunk_(o.chunk_) {}
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept {
    if (this != &o) {
      unmap();
      path_ = std::move(o.path_);
      map_ = std::exchange(o.map_, nullptr);
      size_ = std::exchange(o.size_, 0);
      header_ = std::move(o.header_);
      staging_ = std::exchange(o.staging_, {});
      chunk_ = o.chunk_;
    }
    return *this;
  }
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile() { unmap(); }

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  const SafetensorsHeader& header() const { return header_; }
  const Metadata& metadata() const { return header_.metadata; }
  size_t size() const { return header_.tensors.size(); }
  bool contains(const std::string& name) const { return header_.find(name) != nullptr; }
  std::vector<std::string> keys() const {
    std::vector<std::string> k;
    for (const auto& t : header_.tensors) k.push_back(t.name);
    return k;
  }
  const TensorEntry& entry(const std::string& name) const {
    const TensorEntry* e = header_.find(name);
    EMBER_CHECK(e != nullptr, ValueError, "safetensors file '", path_, "' has no tensor '", name, "'");
    return *e;
  }
  // The raw bytes of a tensor inside the mapping (valid while this object lives).
  const uint8_t* data(const std::string& name) const { return map_ + header_.data_start + entry(name).begin; }

  // A new tensor on `device` with the stored values. Loads onto a GPU share this object's pinned
  // staging buffers: call get() from one thread at a time for those.
  AnyTensor get(const std::string& name, Device device = Device::cpu()) const { return load(entry(name), device); }

  // The size of each of the two pinned staging buffers for GPU loads (default 16 MiB).
  void set_staging_bytes(size_t bytes) {
    free_staging();
    staging_.backend = nullptr;
    chunk_ = bytes > 0 ? bytes : 1;
  }

  // Every tensor, in data order.
  TensorList load_all(Device device = Device::cpu()) const {
    TensorList out;
    out.reserve(header_.tensors.size());
    for (const auto& e : header_.tensors) out.emplace_back(e.name, load(e, device));
    return out;
  }

 private:
  AnyTensor load(const TensorEntry& e, Device device) const {
    EMBER_CHECK(e.dtype.has_value(), DTypeError, "safetensors file '", path_, "': tensor '", e.name, "' has dtype ",
                e.dtype_name, ", which ember cannot hold (ember holds F64, F32, F16, BF16, I64, I32, U8)");
    EMBER_CHECK(e.shape.size() <= static_cast<size_t>(kMaxDims), ShapeError, "safetensors file '", path_,
                "': tensor '", e.name, "' has ", e.shape.size(), " dimensions; ember tensors have at most ", kMaxDims);
    AnyTensor t = AnyTensor::empty(Shape(e.shape), *e.dtype, device);
    if (e.nbytes() == 0) return t;
    const uint8_t* src = map_ + header_.data_start + e.begin;
    if (device.is_cpu()) {
      std::memcpy(t.data_ptr(), src, e.nbytes());
      return t;
    }
    upload(t.backend(), static_cast<uint8_t*>(t.data_ptr()), src, e.nbytes());
    return t;
  }

  // Double-buffered upload through pinned memory: the copy from the mapping into one buffer
  // overlaps the upload from the other.
  void upload(Backend& b, uint8_t* dst, const uint8_t* src, size_t n) const {
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
  void free_staging() const noexcept {
    for (void*& p : staging_.buf)
      if (p) {
        staging_.backend->free_pinned(p, staging_.bytes);
        p = nullptr;
      }
  }
  void unmap() noexcept {
    free_staging();
    if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
    map_ = nullptr;
  }

  struct Staging {
    Backend* backend = nullptr;
    size_t bytes = 0;
    void* buf[2] = {nullptr, nullptr};
  };

  std::string path_;
  const uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
  SafetensorsHeader header_;
  mutable Staging staging_;  // pinned buffers for GPU loads, allocated on the first one
  size_t chunk_ = size_t{16} << 20;
};

// Every tensor of a file, as new tensors on `device`.
inline TensorList load_file(const std::filesystem::path& path, Device device = Device::cpu()) {
  return SafetensorsFile(path).load_all(device);
}
// The file's "__metadata__" (empty when it has none).
inline Metadata load_metadata(const std::filesystem::path& path) { return SafetensorsFile(path).metadata(); }

// The tensors of an in-memory file (what serialize() gives), on the CPU.
inline TensorList deserialize(const uint8_t* data, size_t size, std::string_view name = "<buffer>") {
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
