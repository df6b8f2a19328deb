#pragma once
// Host memory for CPU tensors: 64-byte aligned blocks with the same statistics and optional limit
// as the CUDA allocator, so memory behaviour (peaks, out-of-memory) can be tested without a GPU.
//
// Large blocks are cached. A training step frees and allocates the same large buffers every
// step (activations, gradients, outputs). glibc serves blocks above its mmap threshold (at most
// 32 MiB) with a fresh mmap, and gives the top of its heap back once more than twice that is free,
// so every step page-faulted its buffers in again: measured on this project's benchmarks, a
// quarter of an MLP step was spent in the kernel, and a LayerNorm forward over 32 MiB or an add
// of 16M floats ran 2.5x slower than with the memory kept. So a freed block of at least
// kCacheMinBytes goes to a free list of its size class (sizes rounded up to 1/8 of their power of
// two: at most 12.5% more memory than asked), and an allocation of that class takes it back.
// The cache holds at most cache_limit bytes (default kDefaultCacheLimit; set_cache_limit, 0 turns
// it off); empty_cache() returns them all. Cached bytes are not in use: they do not count in
// current_bytes or against the memory limit, and an allocation that fails empties the cache and
// retries once. Under AddressSanitizer the cache is off by default, so that a use after free
// still lands in freed memory ASan watches.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "ember/backend/memory_counters.hpp"
#include "ember/core/backend.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define EMBER_HOST_CACHE_DEFAULT_OFF 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMBER_HOST_CACHE_DEFAULT_OFF 1
#endif
#endif

namespace ember::cpu {

class HostAllocator {
 public:
  static constexpr size_t kCacheMinBytes = size_t{1} << 16;  // smaller blocks stay with malloc's bins
#if defined(EMBER_HOST_CACHE_DEFAULT_OFF)
  static constexpr int64_t kDefaultCacheLimit = 0;
#else
  static constexpr int64_t kDefaultCacheLimit = int64_t{1} << 30;  // 1 GiB
#endif

  HostAllocator() = default;
  HostAllocator(const HostAllocator&) = delete;
  HostAllocator& operator=(const HostAllocator&) = delete;
  // A block freed after this (a static tensor destroyed later at exit) goes straight to free():
  // the limit is 0 before the list is emptied.
  ~HostAllocator() {
    cache_limit_.store(0);
    empty_cache();
  }

  // The size a block of `bytes` is allocated with: the cache's size class for large blocks, else
  // the next multiple of 64 (aligned_alloc wants a multiple of the alignment).
  static size_t block_size(size_t bytes) {
    if (bytes < kCacheMinBytes) return (bytes + 63) / 64 * 64;
    int top = 63 - __builtin_clzll(static_cast<unsigned long long>(bytes));  // 2^top <= bytes
    const size_t step = size_t{1} << (top - 3);
    return (bytes + step - 1) / step * step;
  }

  void* allocate(size_t bytes) {
    // A count beyond int64 would turn negative below and slip under the limit; none can be met.
    if (bytes > static_cast<size_t>(INT64_MAX) - 63)
      throw OutOfMemory(::ember::detail::str_cat("out of memory on cpu: tried to allocate ", bytes,
                                                 " bytes, more than any machine has"),
                        -1, counters_.current(), counters_.limit());
    const int64_t b = static_cast<int64_t>(bytes);
    const auto [now, limit] = counters_.reserve(b, [&](int64_t in_use, int64_t lim) {
      return OutOfMemory(::ember::detail::str_cat("out of memory on cpu: tried to allocate ", bytes, " bytes with ",
                                                  in_use, " bytes in use and a limit of ", lim,
                                                  " bytes (set by set_memory_limit)"),
                         b, in_use, lim);
    });
    const size_t size = block_size(bytes);
    void* p = size >= kCacheMinBytes ? take_cached(size) : nullptr;
    if (!p) p = std::aligned_alloc(64, size);
    if (!p && cached_.load() > 0) {
      empty_cache();
      p = std::aligned_alloc(64, size);
    }
    if (!p) {
      counters_.release(b);
      throw OutOfMemory(::ember::detail::str_cat("out of memory on cpu: allocating ", bytes, " bytes failed with ",
                                        now - b, " bytes in use"),
                        b, now - b, limit);
    }
    counters_.allocated(now);
    return p;
  }
  void deallocate(void* p, size_t bytes) noexcept {
    counters_.release(static_cast<int64_t>(bytes));
    if (!p) return;
    const size_t size = block_size(bytes);
    if (size < kCacheMinBytes || !keep_cached(p, size)) std::free(p);
  }

  // Frees every cached block.
  void empty_cache() noexcept {
    std::unordered_map<size_t, std::vector<void*>> bins;
    {
      std::lock_guard<std::mutex> lock(mu_);
      bins.swap(bins_);
      cached_.store(0);
    }
    for (auto& [size, blocks] : bins)
      for (void* q : blocks) std::free(q);
  }
  // The most bytes the cache keeps (0: none; below the current content, the excess is freed).
  void set_cache_limit(int64_t bytes) {
    cache_limit_.store(bytes < 0 ? 0 : bytes);
    if (cached_.load() > cache_limit_.load()) empty_cache();
  }

  MemoryStats stats() const {
    MemoryStats s = counters_.stats();
    s.cached_bytes = cached_.load();
    return s;
  }
  void reset_peak() { counters_.reset_peak(); }
  void set_limit(int64_t bytes) { counters_.set_limit(bytes); }

 private:
  void* take_cached(size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = bins_.find(size);
    if (it == bins_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    cached_.fetch_sub(static_cast<int64_t>(size));
    return p;
  }
  bool keep_cached(void* p, size_t size) noexcept {
    const int64_t s = static_cast<int64_t>(size);
    if (s > cache_limit_.load()) return false;
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_.load() + s > cache_limit_.load()) return false;
    try {
      bins_[size].push_back(p);
    } catch (...) {  // no memory for the list itself: free the block instead
      return false;
    }
    cached_.fetch_add(s);
    return true;
  }

  ::ember::detail::MemoryCounters counters_;
  std::atomic<int64_t> cached_{0}, cache_limit_{kDefaultCacheLimit};
  std::mutex mu_;  // guards bins_
  std::unordered_map<size_t, std::vector<void*>> bins_;
};

}  // namespace ember::cpu
