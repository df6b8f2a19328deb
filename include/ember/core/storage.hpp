#pragma once
// A block of device (or host) memory owned through the device's backend allocator.
#include <cstddef>
#include <functional>
#include <memory>

#include "ember/core/backend_registry.hpp"

namespace ember {

class Storage {
 public:
  Storage(Device device, size_t bytes) : device_(device), bytes_(bytes) {
    if (bytes_ > 0) ptr_ = backend_for(device_).allocate(bytes_);
  }
  // Adopts memory allocated elsewhere, freed by `release` instead of the device's allocator
  // (checkpoint staging: host tensors in pinned memory from Backend::allocate_pinned).
  Storage(Device device, void* ptr, size_t bytes, std::function<void(void*, size_t)> release)
      : device_(device), bytes_(bytes), ptr_(ptr), release_(std::move(release)) {}
  ~Storage() {
    if (!ptr_) return;
    if (release_) {
      release_(ptr_, bytes_);
    } else {
      backend_for(device_).deallocate(ptr_, bytes_);
    }
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }

  // Gives the memory back while the Storage (and every tensor on it) lives on; reallocate() gets
  // `bytes()` fresh, uninitialised bytes again. Fully sharded data parallelism
  // (dist/fsdp.hpp) frees a unit's gathered parameters this way between uses: the autograd
  // tape's saved handles share this Storage, so they see the memory again when it is re-gathered
  // for the backward (torch's storage resize_(0)). Only for memory from the device's allocator.
  bool allocated() const { return ptr_ != nullptr || bytes_ == 0; }
  void release_memory() {
    if (!ptr_) return;
    EMBER_CHECK(!release_, ValueError, "Storage::release_memory: the memory was allocated elsewhere");
    backend_for(device_).deallocate(ptr_, bytes_);
    ptr_ = nullptr;
  }
  void reallocate() {
    if (ptr_ || bytes_ == 0) return;
    ptr_ = backend_for(device_).allocate(bytes_);
  }
  Device device() const { return device_; }

 private:
  Device device_;
  size_t bytes_ = 0;
  void* ptr_ = nullptr;
  std::function<void(void*, size_t)> release_;  // empty: the device's allocator
};

}  // namespace ember
