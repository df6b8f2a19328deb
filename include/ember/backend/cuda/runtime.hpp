#pragma once
// CUDA runtime helpers (host code; any C++20 compiler with the CUDA headers can include this):
// error checks that throw ember's exceptions, the device count, a device guard, and the one
// non-blocking stream per device on which ember does all of its work.
//
// Every function here is inline with one definition, so translation units compiled by g++ and by
// nvcc share the same per-device streams (function-local statics have one instance per program).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "ember/core/error.hpp"

namespace ember::cuda {

namespace internal {

// The current device, or -1 when even that cannot be asked (no driver).
inline int current_device_or_minus_one() noexcept {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return d;
}

inline std::string where_str(const char* call, const char* file, int line) {
  const int dev = current_device_or_minus_one();
  return ::ember::detail::str_cat(" in ", call, " at ", file, ":", line,
                                  dev >= 0 ? ::ember::detail::str_cat(" (current device cuda:", dev, ")") : std::string());
}

[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line) {
  // A failed call also sets the runtime's "last error"; clear it (it is not sticky) so that the
  // launch check of the next kernel does not report this error a second time.
  (void)cudaGetLastError();
  throw CudaError(::ember::detail::str_cat("CUDA error ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")",
                                           where_str(call, file, line)));
}

inline void check_cuda(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess) throw_cuda_error(e, call, file, line);
}

}  // namespace internal

// Throws ember::CudaError naming the call, the file and line, the error and the current device.
#define EMBER_CUDA_CHECK(call) ::ember::cuda::internal::check_cuda((call), #call, __FILE__, __LINE__)
// After a kernel launch: reports a bad launch configuration (asynchronous faults show up later,
// at the next synchronising call, as a CudaError from that call).
#define EMBER_CUDA_CHECK_LAUNCH() ::ember::cuda::internal::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

// Number of CUDA devices the runtime sees. Any error (no driver: cudaErrorInsufficientDriver,
// CUDA_VISIBLE_DEVICES="": cudaErrorNoDevice, ...) counts as zero devices and is cleared.
inline int query_device_count() noexcept {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n < 0 ? 0 : n;
}

// The device count, asked once.
inline int runtime_device_count() noexcept {
  static const int n = query_device_count();
  return n;
}

// Makes `device` current for the guard's lifetime and restores the previous device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    EMBER_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) EMBER_CUDA_CHECK(cudaSetDevice(device));
    target_ = device;
  }
  ~DeviceGuard() {
    if (prev_ != target_) (void)cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  int target_ = 0;
};

namespace internal {
struct DeviceSlot {
  std::once_flag once;
  cudaStream_t stream = nullptr;
};
inline DeviceSlot* stream_slots() {
  // Never freed: tensors destroyed during static destruction still need their device's stream.
  static DeviceSlot* const slots = new DeviceSlot[static_cast<size_t>(runtime_device_count() > 0 ? runtime_device_count() : 1)];
  return slots;
}
inline void check_device_index(int device, const char* what) {
  EMBER_CHECK(device >= 0 && device < runtime_device_count(), DeviceError, what, ": device cuda:", device,
              " requested but ", runtime_device_count(), " CUDA device(s) are available");
}
}  // namespace internal

// The stream on which ember works on `device`: created on first use with cudaStreamNonBlocking
// (it does not synchronise with the legacy default stream), never destroyed (it must outlive every
// tensor, including those destroyed during static destruction).
inline cudaStream_t current_stream(int device) {
  internal::check_device_index(device, "current_stream");
  internal::DeviceSlot& slot = internal::stream_slots()[device];
  std::call_once(slot.once, [&] {
    DeviceGuard guard(device);
    EMBER_CUDA_CHECK(cudaStreamCreateWithFlags(&slot.stream, cudaStreamNonBlocking));
  });
  return slot.stream;
}

// Number of streaming multiprocessors of a device (asked once per device).
inline int multiprocessor_count(int device) {
  internal::check_device_index(device, "multiprocessor_count");
  struct Slot {
    std::once_flag once;
    int count = 0;
  };
  static Slot* const slots = new Slot[static_cast<size_t>(runtime_device_count() > 0 ? runtime_device_count() : 1)];
  Slot& s = slots[static_cast<size_t>(device)];
  std::call_once(s.once, [&] {
    EMBER_CUDA_CHECK(cudaDeviceGetAttribute(&s.count, cudaDevAttrMultiProcessorCount, device));
  });
  return s.count;
}

// "1.50 GiB" style sizes for messages.
inline std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while ((v >= 1024.0 || v <= -1024.0) && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace ember::cuda
