#pragma once
// A block of device (or host) memory owned through the device's backend allocator.
#include <cstddef>
#include <memory>

#include "ember/core/backend.hpp"

namespace ember {

class Storage {
 public:
  Storage(Device device, size_t bytes) : device_(device), bytes_(bytes) {
    if (bytes_ > 0) ptr_ = backend_for(device_).allocate(bytes_);
  }
  ~Storage() {
    if (ptr_) backend_for(device_).deallocate(ptr_, bytes_);
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
};

}  // namespace ember
