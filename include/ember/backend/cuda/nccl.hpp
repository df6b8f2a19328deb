#pragma once
// NCCL (host code): the include and the error check used by ember's GPU collectives (dist/).
#include <nccl.h>

#include <string>

#include "ember/backend/cuda/runtime.hpp"
#include "ember/core/dtype.hpp"

namespace ember::cuda {

namespace internal {
// `comm` (may be null) lets NCCL add its own description of the last failure.
inline void check_nccl(ncclResult_t r, ncclComm_t comm, const char* call, const char* file, int line) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  const char* last = ncclGetLastError(comm);
  throw NcclError(::ember::detail::str_cat("NCCL error ", static_cast<int>(r), " (", ncclGetErrorString(r), ")",
                                           (last && last[0]) ? ::ember::detail::str_cat(": ", last) : std::string(),
                                           where_str(call, file, line)));
}
}  // namespace internal

// EMBER_NCCL_CHECK(call): throws ember::NcclError naming the call, file, line and NCCL's message.
// ncclInProgress (non-blocking communicators) is not an error.
#define EMBER_NCCL_CHECK(call) ::ember::cuda::internal::check_nccl((call), nullptr, #call, __FILE__, __LINE__)
// The same, with the communicator whose last error NCCL should describe.
#define EMBER_NCCL_CHECK_COMM(call, comm) ::ember::cuda::internal::check_nccl((call), (comm), #call, __FILE__, __LINE__)

// NCCL's version at run time as major*10000 + minor*100 + patch (e.g. 22809 for 2.28.9).
inline int nccl_runtime_version() {
  int v = 0;
  EMBER_NCCL_CHECK(ncclGetVersion(&v));
  return v;
}

// The NCCL data type of an ember dtype (every ember dtype has one).
inline ncclDataType_t nccl_dtype(DType t) {
  switch (t) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Float16: return ncclFloat16;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Int32: return ncclInt32;
    case DType::Int64: return ncclInt64;
    case DType::UInt8: return ncclUint8;
  }
  throw DTypeError(::ember::detail::str_cat("nccl_dtype: unknown dtype ", static_cast<int>(t)));
}

}  // namespace ember::cuda
