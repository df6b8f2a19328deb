#pragma once
// The registry of backends: backend_for(Device), the CPU backend (always present) and the CUDA
// backend that the nvcc-compiled translation unit registers at start-up (backend/cuda/ember_cuda.cu),
// and the memory statistics of a device. The interface itself is core/backend.hpp; the CUDA
// backend's registration (register_cuda_backend, cuda::device_count) is core/cuda_registration.hpp.
#include "ember/core/backend.hpp"
#include "ember/core/cuda_registration.hpp"

namespace ember {

// The CPU backend. Header-only (the default): defined in backend/cpu/cpu_backend.hpp, which
// this header includes at its end, so every translation unit compiles the whole backend again.
// EMBER_COMPILED_LIB (core/macros.hpp): the backend is compiled once, in src/cpu_backend.cpp, and
// the other files neither see nor compile it (about a third of a test file's compile time).
#if defined(EMBER_COMPILED_LIB)
namespace detail {
Backend& compiled_cpu_backend();  // src/cpu_backend.cpp
}  // namespace detail
inline Backend& cpu_backend() { return detail::compiled_cpu_backend(); }
#else
inline Backend& cpu_backend();
#endif

inline Backend& backend_for(Device d) {
  if (d.is_cpu()) return cpu_backend();
  EMBER_CHECK(cuda::is_compiled(), DeviceError, "device ", d.str(),
              " requested but the CUDA backend is not compiled into this program (link ember::cuda, "
              "which compiles include/ember/backend/cuda/ember_cuda.cu with nvcc)");
  EMBER_CHECK(d.index() >= 0 && d.index() < cuda::device_count(), DeviceError, "device ", d.str(),
              " requested but ", cuda::device_count(), " CUDA device(s) are available");
  return *detail::cuda_backend_factory()(d.index());
}

// Memory statistics of a device.
inline MemoryStats memory_stats(Device d = Device::cpu()) { return backend_for(d).memory_stats(); }
inline void reset_peak_memory(Device d = Device::cpu()) { backend_for(d).reset_peak_memory(); }
inline void set_memory_limit(Device d, int64_t bytes) { backend_for(d).set_memory_limit(bytes); }
inline void empty_cache(Device d = Device::cpu()) { backend_for(d).empty_cache(); }
inline void set_cache_limit(Device d, int64_t bytes) { backend_for(d).set_cache_limit(bytes); }
inline void synchronize(Device d) { backend_for(d).synchronize(); }

}  // namespace ember

// With EMBER_COMPILED_LIB the backend is compiled once (src/cpu_backend.cpp) and stays out of
// the other files; a file that names cpu::CpuBackend includes it itself.
#if !defined(EMBER_COMPILED_LIB)
#include "ember/backend/cpu/cpu_backend.hpp"
#endif
