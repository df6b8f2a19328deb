#pragma once
// How dist::MpiProcessGroup hands ember's dtypes to MPI: the MPI datatype of a reduction and of a
// raw copy, the MPI_Op of a ReduceOp, the float32 temporary of 16-bit floats, and the division of
// ReduceOp::Avg. Part of ember/dist/mpi.hpp, which includes it where mpi.h exists.
#include <mpi.h>

#include <cstdint>
#include <type_traits>

#include "ember/core/dtype.hpp"
#include "ember/core/half.hpp"
#include "ember/dist/process_group.hpp"

namespace ember::dist::detail {

// The MPI datatype that carries a dtype's values in a reduction (16-bit floats: float32 temporary).
inline MPI_Datatype mpi_reduce_type(DType t) {
  switch (t) {
    case DType::Float32: case DType::Float16: case DType::BFloat16: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Int32: return MPI_INT32_T;
    case DType::Int64: return MPI_INT64_T;
    case DType::UInt8: return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}
// The MPI datatype that moves a dtype's raw values (broadcast, all_gather).
inline MPI_Datatype mpi_raw_type(DType t) {
  if (t == DType::Float16 || t == DType::BFloat16) return MPI_UINT16_T;
  return mpi_reduce_type(t);
}
inline bool is_16bit_float(DType t) { return t == DType::Float16 || t == DType::BFloat16; }

inline MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

// 16-bit float values <-> float32 temporary.
inline void widen_16(DType t, const void* src, float* dst, int64_t n) {
  if (t == DType::Float16) {
    auto* s = static_cast<const half*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
  } else {
    auto* s = static_cast<const bfloat16*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
  }
}
inline void narrow_16(DType t, const float* src, void* dst, int64_t n) {
  if (t == DType::Float16) {
    auto* d = static_cast<half*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = half(src[i]);
  } else {
    auto* d = static_cast<bfloat16*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = bfloat16(src[i]);
  }
}

// Divides n values of a reduction buffer (in its MPI reduce type) by `by`.
inline void divide_in_place(DType t, void* p, int64_t n, int by) {
  auto div = [&](auto* x) {
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<std::remove_reference_t<decltype(x[i])>>(x[i] / by);
  };
  switch (t) {
    case DType::Float32: case DType::Float16: case DType::BFloat16: div(static_cast<float*>(p)); break;
    case DType::Float64: div(static_cast<double*>(p)); break;
    case DType::Int32: div(static_cast<int32_t*>(p)); break;
    case DType::Int64: div(static_cast<int64_t*>(p)); break;
    case DType::UInt8: div(static_cast<uint8_t*>(p)); break;
  }
}


}  // namespace ember::dist::detail
