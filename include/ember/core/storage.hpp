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
  Device device() const { return device_; }

 private:
  Device device_;
  size_t bytes_ = 0;
  void* ptr_ = nullptr;
  std::function<void(void*, size_t)> release_;  // empty: the device's allocator
};

}  // namespace ember
