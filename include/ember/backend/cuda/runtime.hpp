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

// What the start-up device-count query found: the count, and when it is zero why (the runtime's
// error, with the driver and runtime versions; "" when devices were found). The query runs before
// `main` (ember_cuda.cu registers the backend from a static initialiser), where an exception
// cannot be reported, so the reason is kept here and printed by every "SKIPPED: no GPU" line
// (tests/gpu_skip.hpp) and by ember_device_report.
struct DeviceCountQuery {
  int count = 0;
  std::string error;
};

// Any error (no driver: cudaErrorInsufficientDriver, CUDA_VISIBLE_DEVICES="": cudaErrorNoDevice,
// ...) counts as zero devices; the runtime's last error is cleared.
inline DeviceCountQuery query_device_count_and_reason() noexcept {
  DeviceCountQuery q;
  try {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      int driver = 0, runtime = 0;
      (void)cudaDriverGetVersion(&driver);  // 0 when no driver is loaded
      (void)cudaRuntimeGetVersion(&runtime);
      (void)cudaGetLastError();
      auto ver = [](int v) { return v ? std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10) : std::string("none"); };
      q.error = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                "); driver CUDA version " + ver(driver) + ", runtime " + ver(runtime);
      return q;
    }
    q.count = n < 0 ? 0 : n;
    if (q.count == 0) q.error = "cudaGetDeviceCount found 0 devices";
  } catch (...) {  // std::bad_alloc from the message: the count stays 0
    q.count = 0;
  }
  return q;
}

// The start-up query, made once per program.
inline const DeviceCountQuery& device_count_query() noexcept {
  static const DeviceCountQuery q = query_device_count_and_reason();
  return q;
}

// Number of CUDA devices the runtime sees (0 on any error; device_count_error() says why).
inline int query_device_count() noexcept { return query_device_count_and_reason().count; }

// The device count, asked once.
inline int runtime_device_count() noexcept { return device_count_query().count; }

// Why runtime_device_count() is 0 ("" when it is not).
inline const std::string& device_count_error() noexcept { return device_count_query().error; }

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

// The value make() gives for a device (a library handle, an attribute), made once per device on
// first use (std::call_once: thread-safe; a throw leaves it to the next call) and kept for the
// program's life: the slots are never freed, so handles outlive static destruction, when the
// driver may already be gone. Each call site has its own slots (Make is its lambda's type).
template <class V, class Make>
V once_per_device(int device, const char* what, Make&& make) {
  check_device_index(device, what);
  struct Slot {
    std::once_flag once;
    V value{};
  };
  static Slot* const slots = new Slot[static_cast<size_t>(runtime_device_count() > 0 ? runtime_device_count() : 1)];
  Slot& s = slots[static_cast<size_t>(device)];
  std::call_once(s.once, [&] { s.value = make(); });
  return s.value;
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

namespace internal {
// A library's handle of a device (cuBLAS, cuDNN): create(stream) makes it under a DeviceGuard and
// binds it to current_stream(device), once per device (once_per_device: never destroyed).
template <class H, class Create>
H stream_bound_handle(int device, const char* what, Create&& create) {
  return once_per_device<H>(device, what, [&] {
    cudaStream_t stream = current_stream(device);
    DeviceGuard guard(device);
    return create(stream);
  });
}
}  // namespace internal

// Number of streaming multiprocessors of a device (asked once per device).
inline int multiprocessor_count(int device) {
  return internal::once_per_device<int>(device, "multiprocessor_count", [&] {
    int count = 0;
    EMBER_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  });
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
