#pragma once
// The statistics and the optional limit that the host and the device allocator keep alike
// (backend/cpu/allocator.hpp, backend/cuda/allocator.hpp): bytes in use, their peak, the number
// of allocations and the limit (negative: none). One implementation, so that memory behaviour
// tested on the CPU (peaks, out-of-memory at the limit) carries over to the GPU.
#include <atomic>
#include <cstdint>

#include "ember/core/backend.hpp"

namespace ember::detail {

class MemoryCounters {
 public:
  // What reserve counted: the bytes in use with the new block's, and the limit it was checked
  // against.
  struct Reserved {
    int64_t now, limit;
  };

  // Counts `bytes` more in use, unless that passes the limit: then counts nothing and throws
  // over_limit(bytes in use, limit) (the allocator's OutOfMemory).
  template <class OverLimit>
  Reserved reserve(int64_t bytes, OverLimit&& over_limit) {
    const int64_t limit = limit_.load();
    const int64_t now = current_.fetch_add(bytes) + bytes;
    if (limit >= 0 && now > limit) {
      current_.fetch_sub(bytes);
      throw over_limit(now - bytes, limit);
    }
    return {now, limit};
  }
  // After reserve, the allocation succeeded: one more allocation, the peak raised to `now`.
  void allocated(int64_t now) {
    num_allocations_.fetch_add(1);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }
  // Bytes no longer in use: a block freed, or one whose allocation failed after reserve.
  void release(int64_t bytes) noexcept { current_.fetch_sub(bytes); }

  int64_t current() const { return current_.load(); }
  int64_t limit() const { return limit_.load(); }
  // Everything but cached_bytes, which each allocator knows for itself.
  MemoryStats stats() const {
    MemoryStats s;
    s.current_bytes = current_.load();
    s.peak_bytes = peak_.load();
    s.num_allocations = num_allocations_.load();
    s.limit_bytes = limit_.load();
    return s;
  }
  void reset_peak() { peak_.store(current_.load()); }
  void set_limit(int64_t bytes) { limit_.store(bytes); }

 private:
  std::atomic<int64_t> current_{0}, peak_{0}, num_allocations_{0}, limit_{-1};
};

}  // namespace ember::detail
