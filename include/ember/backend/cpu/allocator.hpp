#pragma once
// Host memory for CPU tensors: 64-byte aligned blocks with the same statistics and optional limit
// as the CUDA allocator, so memory behaviour (peaks, out-of-memory) can be tested without a GPU.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "ember/core/kernel_table.hpp"

namespace ember::cpu {

class HostAllocator {
 public:
  void* allocate(size_t bytes) {
    // A count beyond int64 would turn negative below and slip under the limit; none can be met.
    if (bytes > static_cast<size_t>(INT64_MAX) - 63)
      throw OutOfMemory(::ember::detail::str_cat("out of memory on cpu: tried to allocate ", bytes,
                                                 " bytes, more than any machine has"),
                        -1, current_.load(), limit_.load());
    const int64_t b = static_cast<int64_t>(bytes);
    int64_t limit = limit_.load();
    int64_t now = current_.fetch_add(b) + b;
    if (limit >= 0 && now > limit) {
      current_.fetch_sub(b);
      throw OutOfMemory(::ember::detail::str_cat("out of memory on cpu: tried to allocate ", bytes, " bytes with ",
                                        now - b, " bytes in use and a limit of ", limit,
                                        " bytes (set by set_memory_limit)"),
                        b, now - b, limit);
    }
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) {
      current_.fetch_sub(b);
      throw OutOfMemory(::ember::detail::str_cat("out of memory on cpu: allocating ", bytes, " bytes failed with ",
                                        now - b, " bytes in use"),
                        b, now - b, limit);
    }
    num_allocations_.fetch_add(1);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return p;
  }
  void deallocate(void* p, size_t bytes) noexcept {
    std::free(p);
    current_.fetch_sub(static_cast<int64_t>(bytes));
  }
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

}  // namespace ember::cpu
