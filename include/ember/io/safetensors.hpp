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
//
// Paths are std::string (a std::filesystem::path converts to one). The definitions (nlohmann-json)
// are in io/detail/safetensors_impl.hpp, compiled once into the library under
// EMBER_COMPILED_LIB (core/macros.hpp), included here when header-only.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ember/core/macros.hpp"
#include "ember/core/tensor.hpp"
#include "ember/io/mapped_file.hpp"
#include "ember/io/safetensors_header.hpp"

namespace ember::io {

// Ordered name -> tensor list (the same type as nn::StateDict).
using TensorList = std::vector<std::pair<std::string, AnyTensor>>;
using Metadata = std::map<std::string, std::string>;

// The file's bytes in memory (what save_file writes).
EMBER_LIB_INLINE std::vector<uint8_t> serialize(const TensorList& tensors, const Metadata& metadata = {});

// Called with every byte range written, in order (a checksum of the file as it is written).
using ByteObserver = std::function<void(const void*, size_t)>;

// Writes a safetensors file atomically. Throws ValueError for tensors it refuses (before touching
// the disk) and IOError for a failed write (the previous file, if any, stays as it was).
EMBER_LIB_INLINE void save_file(const std::string& path, const TensorList& tensors,
                                const Metadata& metadata = {}, const ByteObserver& on_bytes = {});

// A safetensors file mapped read-only; the header is validated on opening.
class SafetensorsFile {
 public:
  EMBER_LIB_INLINE explicit SafetensorsFile(const std::string& path);
  EMBER_LIB_INLINE SafetensorsFile(SafetensorsFile&& o) noexcept;
  EMBER_LIB_INLINE SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile() { free_staging(); }

  const std::string& path() const { return file_.path(); }
  uint64_t file_size() const { return file_.size(); }
  const SafetensorsHeader& header() const { return header_; }
  const Metadata& metadata() const { return header_.metadata; }
  size_t size() const { return header_.tensors.size(); }
  bool contains(const std::string& name) const { return header_.find(name) != nullptr; }
  EMBER_LIB_INLINE std::vector<std::string> keys() const;
  EMBER_LIB_INLINE const TensorEntry& entry(const std::string& name) const;
  // The raw bytes of a tensor inside the mapping (valid while this object lives).
  const uint8_t* data(const std::string& name) const { return file_.data() + header_.data_start + entry(name).begin; }

  // A new tensor on `device` with the stored values. Loads onto a GPU share this object's pinned
  // staging buffers: call get() from one thread at a time for those.
  AnyTensor get(const std::string& name, Device device = Device::cpu()) const { return load(entry(name), device); }

  // The size of each of the two pinned staging buffers for GPU loads (default 16 MiB).
  EMBER_LIB_INLINE void set_staging_bytes(size_t bytes);

  // Every tensor, in data order.
  EMBER_LIB_INLINE TensorList load_all(Device device = Device::cpu()) const;

 private:
  EMBER_LIB_INLINE AnyTensor load(const TensorEntry& e, Device device) const;
  // Double-buffered upload through pinned memory: the copy from the mapping into one buffer
  // overlaps the upload from the other.
  EMBER_LIB_INLINE void upload(Backend& b, uint8_t* dst, const uint8_t* src, size_t n) const;
  EMBER_LIB_INLINE void free_staging() const noexcept;

  struct Staging {
    Backend* backend = nullptr;
    size_t bytes = 0;
    void* buf[2] = {nullptr, nullptr};
  };

  detail::MappedFile file_;
  SafetensorsHeader header_;
  mutable Staging staging_;  // pinned buffers for GPU loads, allocated on the first one
  size_t chunk_ = size_t{16} << 20;
};

// Every tensor of a file, as new tensors on `device`.
EMBER_LIB_INLINE TensorList load_file(const std::string& path, Device device = Device::cpu());
// The file's "__metadata__" (empty when it has none).
EMBER_LIB_INLINE Metadata load_metadata(const std::string& path);

// The tensors of an in-memory file (what serialize() gives), on the CPU.
EMBER_LIB_INLINE TensorList deserialize(const uint8_t* data, size_t size, std::string_view name = "<buffer>");

}  // namespace ember::io

#if !defined(EMBER_COMPILED_LIB)
#include "ember/io/detail/safetensors_impl.hpp"
#endif
