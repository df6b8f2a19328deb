#pragma once
// CudaBackend's asynchronous uploads (the kernel table's upload_async, upload_finished,
// wait_upload; core/backend.hpp) (host code; internal linkage, as cuda_backend.hpp): a copy stream
// per device, ordered against the compute stream by events, and tickets in queue order that say
// when an upload has landed.
#include <cstdint>
#include <mutex>
#include <vector>

#include "ember/backend/cuda/runtime.hpp"

namespace ember::cuda_impl {
namespace {

class UploadQueue {
 public:
  // The copy stream: non-blocking, never destroyed (the backend lives for the whole program).
  UploadQueue(int device, cudaStream_t compute) : device_(device), stream_(compute) {
    ::ember::cuda::DeviceGuard g(device_);
    EMBER_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  }

  cudaStream_t copy_stream() const { return copy_stream_; }

  // after_compute: dst is the compute stream's (a fresh allocation there may reuse memory its
  // queued kernels still use), so the copy waits for that queued work; memory allocated on the
  // copy stream is already in its order and needs no wait.
  uint64_t queue(void* dst, const void* host_src, size_t bytes, bool after_compute) {
    ::ember::cuda::DeviceGuard g(device_);
    std::lock_guard<std::mutex> lock(mu_);
    retire();
    Upload u;
    if (!free_.empty()) {
      u = free_.back();
      free_.pop_back();
    } else {
      EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&u.ready, cudaEventDisableTiming));
      EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&u.done, cudaEventDisableTiming));
    }
    // copy stream after the compute stream's queued work (dst's stream-ordered allocation) ...
    if (after_compute) {
      EMBER_CUDA_CHECK(cudaEventRecord(u.ready, stream_));
      EMBER_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, u.ready, 0));
    }
    if (bytes > 0) EMBER_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, copy_stream_));
    // ... and the compute stream's later kernels after the copy.
    EMBER_CUDA_CHECK(cudaEventRecord(u.done, copy_stream_));
    EMBER_CUDA_CHECK(cudaStreamWaitEvent(stream_, u.done, 0));
    u.ticket = ++last_ticket_;
    pending_.push_back(u);
    return u.ticket;
  }
  bool finished(uint64_t ticket) {
    ::ember::cuda::DeviceGuard g(device_);
    std::lock_guard<std::mutex> lock(mu_);
    retire();
    return ticket <= finished_ticket_;
  }
  void wait(uint64_t ticket) {
    ::ember::cuda::DeviceGuard g(device_);
    std::lock_guard<std::mutex> lock(mu_);
    for (const Upload& u : pending_)
      if (u.ticket >= ticket) {
        EMBER_CUDA_CHECK(cudaEventSynchronize(u.done));
        break;
      }
    retire();
  }

 private:
  // An upload's events: pending in ticket order (the copy stream runs them in that order).
  struct Upload {
    cudaEvent_t ready = nullptr;
    cudaEvent_t done = nullptr;
    uint64_t ticket = 0;
  };
  // Moves the finished uploads (a prefix of pending_) to the free list. Holds mu_.
  void retire() {
    while (!pending_.empty()) {
      cudaError_t q = cudaEventQuery(pending_.front().done);
      if (q == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return;
      }
      ::ember::cuda::internal::check_cuda(q, "cudaEventQuery(upload)", __FILE__, __LINE__);
      finished_ticket_ = pending_.front().ticket;
      free_.push_back(pending_.front());
      pending_.erase(pending_.begin());
    }
  }

  int device_;
  cudaStream_t stream_;
  cudaStream_t copy_stream_ = nullptr;
  std::mutex mu_;
  std::vector<Upload> pending_, free_;
  uint64_t last_ticket_ = 0, finished_ticket_ = 0;
};

}  // namespace
}  // namespace ember::cuda_impl
