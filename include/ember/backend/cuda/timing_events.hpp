#pragma once
// CudaBackend's timing events (the profiler's device time; core/backend.hpp timing_event_*)
// (host code; internal linkage, as cuda_backend.hpp): a pool of CUDA events recorded on the
// device's stream, which only grows; ids are 1 + index.
#include <cstdint>
#include <mutex>
#include <vector>

#include "ember/backend/cuda/runtime.hpp"

namespace ember::cuda_impl {
namespace {

class TimingEvents {
 public:
  TimingEvents(int device, cudaStream_t stream) : device_(device), stream_(stream) {}

  uint64_t record() {
    ::ember::cuda::DeviceGuard g(device_);
    std::lock_guard<std::mutex> lock(mu_);
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      EMBER_CUDA_CHECK(cudaEventCreate(&e));  // with timing (the default flags)
      events_.push_back(e);
    }
    EMBER_CUDA_CHECK(cudaEventRecord(events_[used_], stream_));
    return ++used_;
  }
  double elapsed_ms(uint64_t start, uint64_t end) {
    ::ember::cuda::DeviceGuard g(device_);
    std::lock_guard<std::mutex> lock(mu_);
    if (start == 0 || end == 0 || start > used_ || end > used_) return -1.0;
    EMBER_CUDA_CHECK(cudaEventSynchronize(events_[end - 1]));
    float ms = 0;
    EMBER_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[start - 1], events_[end - 1]));
    return ms;
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    used_ = 0;
  }

 private:
  int device_;
  cudaStream_t stream_;
  std::mutex mu_;
  std::vector<cudaEvent_t> events_;  // never destroyed (the backend lives for the program)
  size_t used_ = 0;
};

}  // namespace
}  // namespace ember::cuda_impl
