#pragma once
// Runtime element types and their compile-time mapping.
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "ember/core/half.hpp"

namespace ember {

enum class DType : uint8_t { Float32, Float64, Float16, BFloat16, Int32, Int64, UInt8 };

inline constexpr int kNumDTypes = 7;

constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::UInt8: return "uint8";
  }
  return "?";
}

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float64: case DType::Int64: return 8;
    case DType::Float32: case DType::Int32: return 4;
    case DType::Float16: case DType::BFloat16: return 2;
    case DType::UInt8: return 1;
  }
  return 0;
}

constexpr bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Float16 || t == DType::BFloat16;
}
constexpr bool is_low_precision(DType t) { return t == DType::Float16 || t == DType::BFloat16; }

template <class T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::Float32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::Float64; };
template <> struct DTypeOf<half> { static constexpr DType value = DType::Float16; };
template <> struct DTypeOf<bfloat16> { static constexpr DType value = DType::BFloat16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::Int32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::Int64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::UInt8; };

template <class T> inline constexpr DType dtype_of = DTypeOf<T>::value;

template <class T>
concept Element = requires { DTypeOf<T>::value; };

// The type arithmetic is done in: float for the 16-bit floats (fp32 accumulation), T otherwise.
template <class T> struct ComputeType { using type = T; };
template <> struct ComputeType<half> { using type = float; };
template <> struct ComputeType<bfloat16> { using type = float; };
template <class T> using compute_t = typename ComputeType<T>::type;

// Calls f(T{}) with the C++ type matching a runtime dtype.
template <class F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::Float32: return f(float{});
    case DType::Float64: return f(double{});
    case DType::Float16: return f(half{});
    case DType::BFloat16: return f(bfloat16{});
    case DType::Int32: return f(int32_t{});
    case DType::Int64: return f(int64_t{});
    case DType::UInt8: return f(uint8_t{});
  }
  return f(float{});
}

}  // namespace ember
