#pragma once
// AllocatorBackend<Allocator>: the memory entries of the kernel table (core/backend.hpp) forwarded
// to the backend's own caching allocator. The CPU's HostAllocator and CUDA's DeviceAllocator take
// the same calls (their counters are backend/memory_counters.hpp), so both backends derive from it.
#include <cstddef>
#include <cstdint>
#include <utility>

#include "ember/core/backend.hpp"

namespace ember {

template <class Allocator>
class AllocatorBackend : public Backend {
 public:
  void* allocate(size_t bytes) override { return alloc_.allocate(bytes); }
  void deallocate(void* p, size_t bytes) noexcept override { alloc_.deallocate(p, bytes); }
  MemoryStats memory_stats() const override { return alloc_.stats(); }
  void reset_peak_memory() override { alloc_.reset_peak(); }
  void set_memory_limit(int64_t bytes) override { alloc_.set_limit(bytes); }
  void empty_cache() override { alloc_.empty_cache(); }
  void set_cache_limit(int64_t bytes) override { alloc_.set_cache_limit(bytes); }

 protected:
  // The allocator's constructor arguments.
  template <class... Args>
  explicit AllocatorBackend(Args&&... args) : alloc_(std::forward<Args>(args)...) {}

  Allocator alloc_;
};

}  // namespace ember
