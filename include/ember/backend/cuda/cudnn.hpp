#pragma once
// cuDNN (host code): error checks and one handle per device, created on first use and bound to the
// device's ember stream.
#include <cudnn.h>

#include <memory>
#include <mutex>

#include "ember/backend/cuda/runtime.hpp"

namespace ember::cuda {

namespace internal {
inline void check_cudnn(cudnnStatus_t s, const char* call, const char* file, int line) {
  if (s != CUDNN_STATUS_SUCCESS) {
    // cuDNN 9 keeps a more detailed message about the last failure of this thread.
    char detail_msg[512] = {};
    cudnnGetLastErrorString(detail_msg, sizeof detail_msg);
    throw CudnnError(::ember::detail::str_cat("cuDNN error ", static_cast<int>(s), " (", cudnnGetErrorString(s), ")",
                                              detail_msg[0] ? ::ember::detail::str_cat(": ", detail_msg) : std::string(),
                                              where_str(call, file, line)));
  }
}
}  // namespace internal

#define EMBER_CUDNN_CHECK(call) ::ember::cuda::internal::check_cudnn((call), #call, __FILE__, __LINE__)

// cuDNN's version at run time (e.g. 91900 for 9.19.0), which may differ from the header's.
inline size_t cudnn_runtime_version() { return cudnnGetVersion(); }

// The cuDNN handle of a device, bound to current_stream(device). Never destroyed (it must outlive
// static destruction, when the driver may already be gone).
inline cudnnHandle_t cudnn_handle(int device) {
  return internal::stream_bound_handle<cudnnHandle_t>(device, "cudnn_handle", [](cudaStream_t stream) {
    cudnnHandle_t h = nullptr;
    EMBER_CUDNN_CHECK(cudnnCreate(&h));
    EMBER_CUDNN_CHECK(cudnnSetStream(h, stream));
    return h;
  });
}

}  // namespace ember::cuda
