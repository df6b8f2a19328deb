#pragma once
// Device memory for CUDA tensors: the stream-ordered allocator
// (cudaMallocAsync / cudaFreeAsync on the device's ember stream) drawing from the device's default
// memory pool, whose release threshold is raised to UINT64_MAX so that freed memory stays cached
// in the pool instead of going back to the driver at every synchronisation. The statistics and
// the optional limit behave like the host allocator's (backend/cpu/allocator.hpp), so memory
// behaviour tested on the CPU carries over.
#include <atomic>
#include <cstdint>

#include "ember/backend/cuda/runtime.hpp"
#include "ember/backend/memory_counters.hpp"
#include "ember/core/backend.hpp"

namespace ember::cuda {

class DeviceAllocator {
 public:
  DeviceAllocator(int device, cudaStream_t stream) : device_(device), stream_(stream) {
    DeviceGuard guard(device_);
    // cudaMallocAsync needs stream-ordered memory pools, which some set-ups lack (an old driver,
    // some virtualised GPUs): say so here instead of failing at the first allocation with
    // cudaErrorNotSupported. ember_device_report prints this attribute for every device.
    int pools = 0;
    EMBER_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device_));
    EMBER_CHECK(pools != 0, DeviceError, "cuda:", device_,
                " does not support stream-ordered memory pools (cudaDevAttrMemoryPoolsSupported is 0), which "
                "ember's CUDA allocator (cudaMallocAsync) needs: update the driver, or use a GPU that has them");
    EMBER_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, device_));
    uint64_t threshold = UINT64_MAX;
    EMBER_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  void* allocate(size_t bytes) { return allocate(bytes, stream_); }
  // In the order of another stream of this device (the copy stream's upload destinations); freed
  // on the ember stream by deallocate, as the pool allows.
  void* allocate(size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return nullptr;
    const int64_t b = static_cast<int64_t>(bytes);
    const auto [now, limit] = counters_.reserve(b, [&](int64_t in_use, int64_t lim) {
      return OutOfMemory(::ember::detail::str_cat("out of memory on cuda:", device_, ": tried to allocate ",
                                                  format_bytes(b), " (", b, " bytes) with ", format_bytes(in_use),
                                                  " (", in_use, " bytes) in use and a limit of ", format_bytes(lim),
                                                  " (", lim, " bytes, set by set_memory_limit)"),
                         b, in_use, lim);
    });
    void* p = nullptr;
    cudaError_t e;
    {
      DeviceGuard guard(device_);
      e = cudaMallocAsync(&p, bytes, stream);
      if (e == cudaErrorMemoryAllocation) {
        // Let the pool give its unused (possibly fragmented) memory back to the driver and retry
        // once; memory freed in stream order becomes reusable after the synchronisation.
        (void)cudaGetLastError();
        e = cudaStreamSynchronize(stream_);
        if (e == cudaSuccess && stream != stream_) e = cudaStreamSynchronize(stream);
        if (e == cudaSuccess) e = cudaMemPoolTrimTo(pool_, 0);
        if (e == cudaSuccess) e = cudaMallocAsync(&p, bytes, stream);
      }
      if (e != cudaSuccess) {
        counters_.release(b);
        (void)cudaGetLastError();
        if (e == cudaErrorMemoryAllocation) throw out_of_memory(b, now - b, limit);
        internal::throw_cuda_error(e, "cudaMallocAsync(&p, bytes, stream)", __FILE__, __LINE__);
      }
    }
    counters_.allocated(now);
    return p;
  }

  // Never throws: errors here (for instance the runtime already unloaded at program exit) are
  // cleared and ignored.
  void deallocate(void* p, size_t bytes) noexcept {
    if (p == nullptr) return;
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    if (prev != device_) (void)cudaSetDevice(device_);
    (void)cudaFreeAsync(p, stream_);
    if (prev >= 0 && prev != device_) (void)cudaSetDevice(prev);
    (void)cudaGetLastError();
    counters_.release(static_cast<int64_t>(bytes));
  }

  MemoryStats stats() const {
    MemoryStats s = counters_.stats();
    const int64_t reserved = reserved_bytes();
    s.cached_bytes = reserved > s.current_bytes ? reserved - s.current_bytes : 0;
    return s;
  }
  void reset_peak() { counters_.reset_peak(); }
  void set_limit(int64_t bytes) { counters_.set_limit(bytes < 0 ? -1 : bytes); }

  // Bytes the pool holds from the driver (live tensors plus cached free memory).
  int64_t reserved_bytes() const noexcept {
    uint64_t v = 0;
    if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &v) != cudaSuccess) {
      (void)cudaGetLastError();
      return -1;
    }
    return static_cast<int64_t>(v);
  }

  cudaMemPool_t pool() const { return pool_; }

  // Gives the pool's unused memory back to the driver once the work queued so far has finished.
  void empty_cache() {
    DeviceGuard guard(device_);
    EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    EMBER_CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
  }
  // The pool keeps at most `bytes` of unused memory past a synchronisation (-1: all of it).
  void set_cache_limit(int64_t bytes) {
    DeviceGuard guard(device_);
    uint64_t threshold = bytes < 0 ? UINT64_MAX : static_cast<uint64_t>(bytes);
    EMBER_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));
  }

 private:
  OutOfMemory out_of_memory(int64_t requested, int64_t in_use, int64_t limit) const {
    size_t free_b = 0, total_b = 0;
    std::string device_figures;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      device_figures = ::ember::detail::str_cat(", and the device has ", format_bytes(static_cast<int64_t>(free_b)),
                                                " free of ", format_bytes(static_cast<int64_t>(total_b)),
                                                " total (cudaMemGetInfo)");
    } else {
      (void)cudaGetLastError();
    }
    const int64_t reserved = reserved_bytes();
    return OutOfMemory(
        ::ember::detail::str_cat("out of memory on cuda:", device_, ": cudaMallocAsync of ", format_bytes(requested),
                                 " (", requested, " bytes) failed with ", format_bytes(in_use), " (", in_use,
                                 " bytes) held by ember tensors on this device",
                                 reserved >= 0 ? ::ember::detail::str_cat(", ", format_bytes(reserved),
                                                                          " reserved by its memory pool")
                                               : std::string(),
                                 device_figures,
                                 "; free some tensors, reduce the batch size or recompute activations (nn::recompute)"),
        requested, in_use, limit);
  }

  int device_;
  cudaStream_t stream_;
  cudaMemPool_t pool_ = nullptr;
  ::ember::detail::MemoryCounters counters_;
};

}  // namespace ember::cuda
