#pragma once
// NumPy .npy files, memory-mapped (POSIX mmap; no extra library).
//
// Format versions 1.0, 2.0 and 3.0: the magic "\x93NUMPY", a version, the header length (2 bytes
// in 1.0, 4 after), a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// and the data. C order only, little-endian, the dtypes ember has: <f4 <f8 <f2 <i4 <i8 |u1 (and |b1
// as uint8). parse_npy_header works on a byte buffer (the fuzz target calls it); malformed input
// is a FormatError naming the source and the rule.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/core/tensor.hpp"
#include "ember/data/dataset.hpp"

namespace ember::data {

struct NpyHeader {
  DType dtype = DType::Float32;
  Shape shape;
  size_t data_offset = 0;  // where the elements start
  size_t data_bytes = 0;
};

namespace detail {
inline std::string_view npy_value_after(std::string_view dict, std::string_view key, const std::string& source) {
  for (const char* q : {"'", "\""}) {
    const std::string k = std::string(q) + std::string(key) + q;
    size_t p = dict.find(k);
    if (p == std::string_view::npos) continue;
    p += k.size();
    while (p < dict.size() && dict[p] == ' ') ++p;
    EMBER_CHECK(p < dict.size() && dict[p] == ':', FormatError, "npy: '", source, "': header key '", key,
                "' is not followed by ':'");
    ++p;
    while (p < dict.size() && dict[p] == ' ') ++p;
    return dict.substr(p);
  }
  throw FormatError(::ember::detail::str_cat("npy: '", source, "': header has no '", key, "' key"));
}
}  // namespace detail

inline NpyHeader parse_npy_header(const uint8_t* data, size_t size, const std::string& source) {
  static constexpr uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  EMBER_CHECK(size >= 10, FormatError, "npy: '", source, "': truncated: ", size, " bytes, shorter than the preamble");
  EMBER_CHECK(std::memcmp(data, kMagic, 6) == 0, FormatError, "npy: '", source,
              "': wrong magic (a .npy file starts with \\x93NUMPY)");
  const int major = data[6];
  EMBER_CHECK(major >= 1 && major <= 3, FormatError, "npy: '", source, "': format version ", major, ".",
              int{data[7]}, " is not supported (1.0, 2.0 and 3.0 are)");
  size_t hlen = 0, start = 0;
  if (major == 1) {
    hlen = size_t{data[8]} | (size_t{data[9]} << 8);
    start = 10;
  } else {
    EMBER_CHECK(size >= 12, FormatError, "npy: '", source, "': truncated preamble");
    hlen = size_t{data[8]} | (size_t{data[9]} << 8) | (size_t{data[10]} << 16) | (size_t{data[11]} << 24);
    start = 12;
  }
  EMBER_CHECK(hlen <= size - start, FormatError, "npy: '", source, "': truncated header: it says ", hlen,
              " bytes, the file has ", size - start, " after the preamble");
  std::string_view dict(reinterpret_cast<const char*>(data + start), hlen);
  EMBER_CHECK(!dict.empty() && dict.front() == '{', FormatError, "npy: '", source,
              "': header is not a dict literal");

  NpyHeader h;
  // descr
  std::string_view d = detail::npy_value_after(dict, "descr", source);
  EMBER_CHECK(!d.empty() && (d.front() == '\'' || d.front() == '"'), FormatError, "npy: '", source,
              "': 'descr' is not a string (structured dtypes are not supported)");
  const size_t close = d.find(d.front(), 1);
  EMBER_CHECK(close != std::string_view::npos, FormatError, "npy: '", source, "': unterminated 'descr' string");
  const std::string descr(d.substr(1, close - 1));
  if (descr == "<f4") h.dtype = DType::Float32;
  else if (descr == "<f8") h.dtype = DType::Float64;
  else if (descr == "<f2") h.dtype = DType::Float16;
  else if (descr == "<i4") h.dtype = DType::Int32;
  else if (descr == "<i8") h.dtype = DType::Int64;
  else if (descr == "|u1" || descr == "<u1" || descr == "|b1") h.dtype = DType::UInt8;
  else
    throw FormatError(::ember::detail::str_cat("npy: '", source, "': dtype '", descr,
                                               "' is not supported (little-endian <f4 <f8 <f2 <i4 <i8 |u1 |b1)"));
  // fortran_order
  std::string_view fo = detail::npy_value_after(dict, "fortran_order", source);
  if (fo.substr(0, 4) == "True")
    throw FormatError(::ember::detail::str_cat("npy: '", source,
                                               "': fortran_order is True; only C order is supported (save with "
                                               "np.ascontiguousarray)"));
  EMBER_CHECK(fo.substr(0, 5) == "False", FormatError, "npy: '", source, "': 'fortran_order' is neither True nor False");
  // shape
  std::string_view s = detail::npy_value_after(dict, "shape", source);
  EMBER_CHECK(!s.empty() && s.front() == '(', FormatError, "npy: '", source, "': 'shape' is not a tuple");
  const size_t rp = s.find(')');
  EMBER_CHECK(rp != std::string_view::npos, FormatError, "npy: '", source, "': unterminated 'shape' tuple");
  std::string_view dims = s.substr(1, rp - 1);
  int64_t numel = 1;
  size_t p = 0;
  while (p < dims.size()) {
    while (p < dims.size() && (dims[p] == ' ' || dims[p] == ',')) ++p;
    if (p >= dims.size()) break;
    int64_t v = 0;
    bool any = false;
    while (p < dims.size() && dims[p] >= '0' && dims[p] <= '9') {
      EMBER_CHECK(v <= (int64_t{1} << 40), FormatError, "npy: '", source, "': a dimension in 'shape' is too large");
      v = v * 10 + (dims[p] - '0');
      ++p;
      any = true;
    }
    EMBER_CHECK(any && (p >= dims.size() || dims[p] == ',' || dims[p] == ' '), FormatError, "npy: '", source,
                "': 'shape' (", dims, ") is not a tuple of non-negative integers");
    EMBER_CHECK(h.shape.dim() < kMaxDims, FormatError, "npy: '", source, "': more than ", kMaxDims, " dimensions");
    h.shape.push_back(v);
    EMBER_CHECK(v == 0 || numel <= (int64_t{1} << 40) / v, FormatError, "npy: '", source,
                "': 'shape' asks for more than 2^40 elements");
    numel *= v;
  }
  h.data_offset = start + hlen;
  h.data_bytes = static_cast<size_t>(numel) * dtype_size(h.dtype);
  EMBER_CHECK(size - h.data_offset == h.data_bytes, FormatError, "npy: '", source, "': sizes disagree: shape ",
              h.shape.str(), " of ", descr, " needs ", h.data_bytes, " bytes of data, the file has ",
              size - h.data_offset, size - h.data_offset < h.data_bytes ? " (truncated)" : " (trailing bytes)");
  return h;
}

// A read-only memory mapping of a .npy file. Shared by handles; unmapped with the last one.
class NpyArray {
 public:
  explicit NpyArray(const std::string& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    EMBER_CHECK(fd >= 0, IOError, "npy: cannot open '", path, "': ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      throw IOError(::ember::detail::str_cat("npy: cannot stat '", path, "': ", std::strerror(err)));
    }
    const size_t size = static_cast<size_t>(st.st_size);
    void* m = size > 0 ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
    const int err = errno;
    ::close(fd);
    EMBER_CHECK(size == 0 || m != MAP_FAILED, IOError, "npy: cannot map '", path, "': ", std::strerror(err));
    map_ = std::shared_ptr<void>(size > 0 ? m : nullptr, [size](void* q) {
      if (q) ::munmap(q, size);
    });
    header_ = parse_npy_header(static_cast<const uint8_t*>(map_.get()), size, path);
  }
  DType dtype() const { return header_.dtype; }
  const Shape& shape() const { return header_.shape; }
  const std::string& path() const { return path_; }
  const void* data() const { return static_cast<const uint8_t*>(map_.get()) + header_.data_offset; }
  // A copy of the whole array as a host tensor.
  AnyTensor to_tensor() const {
    AnyTensor t = AnyTensor::empty(header_.shape, header_.dtype);
    if (header_.data_bytes) std::memcpy(t.data_ptr(), data(), header_.data_bytes);
    return t;
  }
  // A copy of rows [begin, end) along the first dimension.
  AnyTensor rows(int64_t begin, int64_t end) const {
    EMBER_CHECK(header_.shape.dim() >= 1, ShapeError, "npy: '", path_, "' holds a scalar; it has no rows");
    EMBER_CHECK(begin >= 0 && begin <= end && end <= header_.shape[0], IndexError, "npy: '", path_, "': rows [",
                begin, ", ", end, ") out of range [0, ", header_.shape[0], ")");
    Shape s = header_.shape;
    s[0] = end - begin;
    AnyTensor t = AnyTensor::empty(s, header_.dtype);
    const size_t row = header_.shape[0] ? header_.data_bytes / static_cast<size_t>(header_.shape[0]) : 0;
    if (t.nbytes()) std::memcpy(t.data_ptr(), static_cast<const uint8_t*>(data()) + row * begin, t.nbytes());
    return t;
  }

 private:
  std::string path_;
  std::shared_ptr<void> map_;
  NpyHeader header_;
};

inline AnyTensor load_npy(const std::string& path) { return NpyArray(path).to_tensor(); }

// Named .npy files with the same first dimension, sliced along it: example i has, per field, a
// copy of row i (read from the mapping: the page cache, not ember, holds the file).
class NpyDataset : public Dataset {
 public:
  explicit NpyDataset(const std::vector<std::pair<std::string, std::string>>& fields_and_paths) {
    EMBER_CHECK(!fields_and_paths.empty(), ValueError, "NpyDataset: needs at least one (field, path)");
    for (const auto& [field, path] : fields_and_paths) {
      arrays_.emplace_back(field, NpyArray(path));
      const NpyArray& a = arrays_.back().second;
      EMBER_CHECK(a.shape().dim() >= 1, FormatError, "npy: '", path, "' holds a scalar; fields need a first dimension");
      EMBER_CHECK(a.shape()[0] == arrays_.front().second.shape()[0], FormatError, "npy: sizes disagree: '", path,
                  "' has ", a.shape()[0], " rows but '", arrays_.front().second.path(), "' has ",
                  arrays_.front().second.shape()[0]);
    }
    n_ = arrays_.front().second.shape()[0];
    name_ = "npy(" + arrays_.front().second.path() + ")";
  }
  int64_t size() const override { return n_; }
  Example get(int64_t i) const override {
    check_index(i);
    Example e;
    for (const auto& [field, a] : arrays_) e.set(field, a.rows(i, i + 1).select(0));
    return e;
  }
  std::string name() const override { return name_; }

 private:
  std::vector<std::pair<std::string, NpyArray>> arrays_;
  std::string name_;
  int64_t n_ = 0;
};

}  // namespace ember::data
