#pragma once
// ember's exception hierarchy (DESIGN.md decision 8). Every message names the op and the
// shapes, dtypes and devices involved; bad input never aborts the process.
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
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
template <class... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// EMBER_CHECK(cond, ErrorType, message parts...): throws ErrorType with the parts streamed.
#define EMBER_CHECK(cond, ErrorType, ...)                              \
  do {                                                                 \
    if (!(cond)) throw ErrorType(::ember::detail::str_cat(__VA_ARGS__)); \
  } while (0)

}  // namespace ember
