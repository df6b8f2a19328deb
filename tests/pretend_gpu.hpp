#pragma once
// A stand-in for cuda:0 on machines without a GPU: the CPU kernels behind a backend that reports
// itself as cuda:0. Tensors "on cuda:0" then exist, so device checks and the parity harnesses can
// be exercised end to end in CI. Never active when a real GPU is present.
#include "ember/backend/cpu/cpu_backend.hpp"
#include <ember/ember.hpp>

namespace ember::testing {

class PretendCudaBackend : public cpu::CpuBackend {
 public:
  Device device() const override { return Device::cuda(0); }
};

// Installs the pretend device for a scope when no real GPU is present (active == true then).
struct PretendGpu {
  Backend* (*saved_factory)(int) = nullptr;
  int saved_count = 0;
  bool active = false;
  PretendGpu() {
    if (cuda::is_available()) return;
    saved_factory = detail::cuda_backend_factory();
    saved_count = detail::cuda_device_count_slot();
    register_cuda_backend(
        [](int) -> Backend* {
          static PretendCudaBackend b;
          return &b;
        },
        1);
    active = true;
  }
  ~PretendGpu() {
    if (active) register_cuda_backend(saved_factory, saved_count);
  }
  PretendGpu(const PretendGpu&) = delete;
  PretendGpu& operator=(const PretendGpu&) = delete;
};

}  // namespace ember::testing
