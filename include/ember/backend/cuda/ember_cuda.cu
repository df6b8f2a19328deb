// The CUDA backend's one translation unit. Compiled by nvcc into every program that links
// ember::cuda; at start-up it fills ember's kernel table (ember::register_cuda_backend,
// core/cuda_registration.hpp) so that every other translation unit, compiled by any C++20
// compiler, reaches the CUDA kernels through ember::backend_for(Device::cuda(i)). It includes the
// kernel table's interface (core/backend.hpp), not the registry (core/backend_registry.hpp), so no
// CPU kernel (backend/cpu/*) is compiled here.
//
// Start-up only asks the runtime for the device count (no GPU or no driver: zero devices, and the
// backend is still registered so that ember::cuda::is_compiled() is true). A device's stream,
// memory pool, cuBLAS handle and backend object are created on its first use.
#include <mutex>

#include <nvtx3/nvToolsExt.h>  // header-only (NVTX 3): ranges that Nsight Systems shows

#include "ember/backend/cuda/cuda_backend.hpp"
#include "ember/backend/cuda/runtime.hpp"
#include "ember/core/backend.hpp"
#include "ember/core/cuda_registration.hpp"
#include "ember/core/error.hpp"
#include "ember/core/trace.hpp"

namespace ember::cuda_impl {
namespace {

Backend* backend_for_device(int device) {
  const int count = ::ember::cuda::runtime_device_count();
  EMBER_CHECK(device >= 0 && device < count, DeviceError, "device cuda:", device, " requested but ", count,
              " CUDA device(s) are available");
  struct Slot {
    std::once_flag once;
    CudaBackend* backend = nullptr;
  };
  // Never freed: tensors destroyed during static destruction still deallocate through their backend.
  static Slot* const slots = new Slot[static_cast<size_t>(count)];
  Slot& s = slots[device];
  std::call_once(s.once, [&] { s.backend = new CudaBackend(device); });
  return s.backend;
}

void nvtx_push(const char* name) { nvtxRangePushA(name); }
void nvtx_pop() { nvtxRangePop(); }

struct Registrar {
  Registrar() {
    register_cuda_backend(&backend_for_device, ::ember::cuda::runtime_device_count());
    // The profiler's ops, modules and phases as NVTX ranges (core/trace.hpp).
    ::ember::trace::external_ranges().push = &nvtx_push;
    ::ember::trace::external_ranges().pop = &nvtx_pop;
  }
};
const Registrar registrar;

}  // namespace
}  // namespace ember::cuda_impl
