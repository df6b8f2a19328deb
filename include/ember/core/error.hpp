#pragma once
// ember's exception hierarchy. Every message names the op and the
// shapes, dtypes and devices involved; bad input never aborts the process.
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace ember {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class ShapeError : public Error { public: using Error::Error; };
class DTypeError : public Error { public: using Error::Error; };
class DeviceError : public Error { public: using Error::Error; };
class IndexError : public Error { public: using Error::Error; };
class ValueError : public Error { public: using Error::Error; };
class AutogradError : public Error { public: using Error::Error; };
class CudaError : public Error { public: using Error::Error; };
class CublasError : public Error { public: using Error::Error; };
class CudnnError : public Error { public: using Error::Error; };
class NcclError : public Error { public: using Error::Error; };
class IOError : public Error { public: using Error::Error; };
class FormatError : public Error { public: using Error::Error; };
class DistributedError : public Error { public: using Error::Error; };

// Thrown when an allocation does not fit: on a GPU when the driver says so, on any device when
// the allocator's configured limit would be exceeded. Carries the figures.
class OutOfMemory : public Error {
 public:
  OutOfMemory(const std::string& msg, int64_t requested, int64_t in_use, int64_t limit)
      : Error(msg), requested_bytes(requested), in_use_bytes(in_use), limit_bytes(limit) {}
  int64_t requested_bytes;
  int64_t in_use_bytes;
  int64_t limit_bytes;  // -1 when no limit was set
};

namespace detail {
// Appends one part of a message as std::ostream's operator<< prints it. Text, characters and
// integers are appended directly and floating-point numbers through snprintf's %g (the stream's
// default format); only other types go through a stream. Messages are built in many places, each
// with its own mix of argument types: this keeps each mix's instantiation small.
inline void append_integer(std::string& s, long long v) { s += std::to_string(v); }
inline void append_unsigned(std::string& s, unsigned long long v) { s += std::to_string(v); }
inline void append_floating(std::string& s, long double v) {
  char buf[64];
  const int n = std::snprintf(buf, sizeof buf, "%Lg", v);
  s.append(buf, n > 0 ? static_cast<size_t>(n) : 0);
}
template <class T>
void append_part(std::string& s, const T& v) {
  if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    s += std::string_view(v);
  } else if constexpr (std::is_same_v<T, char> || std::is_same_v<T, signed char> ||
                       std::is_same_v<T, unsigned char>) {
    s += static_cast<char>(v);
  } else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    append_integer(s, v);
  } else if constexpr (std::is_integral_v<T>) {  // bool prints as 1 or 0, as the stream does
    append_unsigned(s, v);
  } else if constexpr (std::is_floating_point_v<T>) {
    append_floating(s, v);
  } else {
    std::ostringstream os;
    os << v;
    s += os.str();
  }
}
template <class... Args>
std::string str_cat(const Args&... args) {
  std::string s;
  (append_part(s, args), ...);
  return s;
}
}  // namespace detail

// EMBER_CHECK(cond, ErrorType, message parts...): throws ErrorType with the parts streamed.
#define EMBER_CHECK(cond, ErrorType, ...)                              \
  do {                                                                 \
    if (!(cond)) throw ErrorType(::ember::detail::str_cat(__VA_ARGS__)); \
  } while (0)

}  // namespace ember
