#pragma once
// A stand-in for cuda:0 on machines without a GPU: the CPU kernels behind a backend that reports
// itself as cuda:0. Tensors "on cuda:0" then exist, so device checks and the parity harnesses can
// be exercised end to end in CI. Never active when a real GPU is present.
#include <iostream>

#include "ember/backend/cpu/cpu_backend.hpp"
#include <ember/ember.hpp>

namespace ember::testing {

class PretendCudaBackend : public cpu::CpuBackend {
 public:
  Device device() const override { return Device::cuda(0); }
};

// Serves cuda:0 from `backend` for a scope (active == true then), and puts back what was
// registered before. By default only where there is no real GPU; Always: whatever is there (a
// test of what a device backend is asked to do).
class CudaStandIn {
 public:
  enum When { WithoutGpu, Always };
  explicit CudaStandIn(Backend& backend, When when = WithoutGpu) {
    if (when == WithoutGpu && cuda::is_available()) return;
    saved_factory_ = detail::cuda_backend_factory();
    saved_count_ = detail::cuda_device_count_slot();
    saved_backend_ = served();
    served() = &backend;
    register_cuda_backend([](int) -> Backend* { return served(); }, 1);
    active = true;
  }
  ~CudaStandIn() {
    if (!active) return;
    register_cuda_backend(saved_factory_, saved_count_);
    served() = saved_backend_;
  }
  CudaStandIn(const CudaStandIn&) = delete;
  CudaStandIn& operator=(const CudaStandIn&) = delete;

  bool active = false;

 private:
  static Backend*& served() {
    static Backend* b = nullptr;
    return b;
  }
  Backend* (*saved_factory_)(int) = nullptr;
  int saved_count_ = 0;
  Backend* saved_backend_ = nullptr;
};

// A CudaStandIn serving one backend of type B, made once for the program (backend() reads it).
template <class B, CudaStandIn::When when = CudaStandIn::WithoutGpu>
struct StandIn : CudaStandIn {
  StandIn() : CudaStandIn(backend(), when) {}
  static B& backend() {
    static B b;
    return b;
  }
};

// Installs the pretend device for a scope when no real GPU is present (active == true then).
using PretendGpu = StandIn<PretendCudaBackend>;

// True when there is a cuda:0, real or pretend; otherwise prints "SKIPPED: ..." (ctest counts the
// test as skipped) and the test returns.
inline bool cuda_device_or_skip() {
  if (cuda::is_available()) return true;
  std::cout << "SKIPPED: no cuda:0, real or pretend\n";
  return false;
}

}  // namespace ember::testing
