#pragma once
// Pinned staging of CudaBackend's copy_from_host (host code; internal linkage, as cuda_backend.hpp).
// copy_from_host must leave the caller free to reuse its buffer on return. Rather
// than waiting for the stream (which would stall the host behind all queued kernels at every batch
// upload), small and medium uploads are copied into a pinned staging buffer first; a buffer is
// reused once the event recorded after its transfer has completed.
#include <cstring>
#include <mutex>
#include <vector>

#include "ember/backend/cuda/runtime.hpp"

namespace ember::cuda_impl {
namespace {

class UploadStaging {
 public:
  static constexpr size_t kMaxBytes = size_t{32} << 20;  // larger uploads copy directly and synchronise
  static constexpr size_t kMaxBuffers = 8;

  // Copies host_src to dst on `stream` through a staging buffer; false when no buffer is available
  // (the caller then copies directly and synchronises).
  bool upload(void* dst, const void* host_src, size_t bytes, cudaStream_t stream) {
    if (bytes > kMaxBytes) return false;
    std::lock_guard<std::mutex> lock(mu_);
    Buffer* buf = nullptr;
    for (Buffer& b : buffers_) {
      if (b.capacity < bytes) continue;
      cudaError_t q = cudaEventQuery(b.done);
      if (q == cudaSuccess) {
        buf = &b;
        break;
      }
      if (q != cudaErrorNotReady) ::ember::cuda::internal::check_cuda(q, "cudaEventQuery(staging)", __FILE__, __LINE__);
    }
    if (buf == nullptr) {
      if (buffers_.size() >= kMaxBuffers) return false;
      size_t cap = size_t{1} << 20;  // at least 1 MiB, so a buffer serves many later uploads
      while (cap < bytes) cap *= 2;
      Buffer b;
      if (cudaHostAlloc(&b.ptr, cap, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
      }
      b.capacity = cap;
      EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming));
      buffers_.push_back(b);
      buf = &buffers_.back();
    }
    std::memcpy(buf->ptr, host_src, bytes);
    EMBER_CUDA_CHECK(cudaMemcpyAsync(dst, buf->ptr, bytes, cudaMemcpyHostToDevice, stream));
    EMBER_CUDA_CHECK(cudaEventRecord(buf->done, stream));
    return true;
  }

 private:
  struct Buffer {
    void* ptr = nullptr;
    size_t capacity = 0;
    cudaEvent_t done = nullptr;
  };
  std::mutex mu_;
  std::vector<Buffer> buffers_;  // never freed (pinned memory must outlive static destruction)
};

}  // namespace
}  // namespace ember::cuda_impl
