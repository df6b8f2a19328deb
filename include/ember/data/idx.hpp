#pragma once
// IDX files (the MNIST / Fashion-MNIST format), plain or gzip (link zlib: ZLIB::ZLIB, -lz).
//
// Layout: two zero bytes, a type byte (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D
// float32, 0x0E float64), the number of dimensions, then each dimension as a big-endian uint32,
// then the elements, big-endian, row-major. uint8 stays uint8; int8 and int16 widen to int32
// (ember has neither); multi-byte types are byte-swapped to the host order.
//
// parse_idx works on a byte buffer (the fuzz target calls it); every malformed input is a
// FormatError naming the source, the rule broken and the figures.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/core/tensor.hpp"
#include "ember/data/dataset.hpp"
#include "ember/data/gzip.hpp"

namespace ember::data {

namespace detail {
inline uint32_t read_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}
}  // namespace detail

// Elements larger than this are refused (a corrupt header must not ask for petabytes).
inline constexpr int64_t kMaxIdxElements = int64_t{1} << 34;

inline AnyTensor parse_idx(const uint8_t* data, size_t size, const std::string& source) {
  EMBER_CHECK(size >= 4, FormatError, "idx: '", source, "': truncated: ", size,
              " bytes, shorter than the 4-byte magic");
  EMBER_CHECK(data[0] == 0 && data[1] == 0, FormatError, "idx: '", source,
              "': wrong magic: the first two bytes must be 0, got ", int{data[0]}, " ", int{data[1]},
              " (a gzip file that was not decompressed starts with 31 139)");
  const int type = data[2];
  const int ndim = data[3];
  int esize = 0;
  DType dtype = DType::UInt8;
  switch (type) {
    case 0x08: esize = 1; dtype = DType::UInt8; break;
    case 0x09: esize = 1; dtype = DType::Int32; break;
    case 0x0B: esize = 2; dtype = DType::Int32; break;
    case 0x0C: esize = 4; dtype = DType::Int32; break;
    case 0x0D: esize = 4; dtype = DType::Float32; break;
    case 0x0E: esize = 8; dtype = DType::Float64; break;
    default:
      throw FormatError(::ember::detail::str_cat("idx: '", source, "': unknown element type byte 0x", std::hex, type,
                                                 std::dec, " (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D "
                                                 "float32, 0x0E float64)"));
  }
  EMBER_CHECK(ndim >= 1 && ndim <= kMaxDims, FormatError, "idx: '", source, "': ", ndim,
              " dimensions; 1 to ", kMaxDims, " are supported");
  const size_t header = 4 + 4 * static_cast<size_t>(ndim);
  EMBER_CHECK(size >= header, FormatError, "idx: '", source, "': truncated header: ", ndim, " dimensions need ",
              header, " bytes, the file has ", size);
  Shape shape;
  int64_t numel = 1;
  for (int d = 0; d < ndim; ++d) {
    const int64_t n = detail::read_be32(data + 4 + 4 * d);
    shape.push_back(n);
    EMBER_CHECK(n == 0 || numel <= kMaxIdxElements / n, FormatError, "idx: '", source,
                "': the dimensions ask for more than ", kMaxIdxElements, " elements");
    numel *= n;
  }
  const size_t payload = static_cast<size_t>(numel) * static_cast<size_t>(esize);
  EMBER_CHECK(size - header == payload, FormatError, "idx: '", source, "': sizes disagree: the header's shape ",
              shape.str(), " needs ", payload, " bytes of data, the file has ", size - header,
              size - header < payload ? " (truncated)" : " (trailing bytes)");
  AnyTensor t = AnyTensor::empty(shape, dtype);
  const uint8_t* p = data + header;
  switch (type) {
    case 0x08:  // an empty tensor may have no buffer: memcpy with null is undefined even for 0 bytes
      if (payload != 0) std::memcpy(t.data_ptr(), p, payload);
      break;
    case 0x09: {
      auto* out = static_cast<int32_t*>(t.data_ptr());
      for (int64_t i = 0; i < numel; ++i) out[i] = static_cast<int8_t>(p[i]);
      break;
    }
    case 0x0B: {
      auto* out = static_cast<int32_t*>(t.data_ptr());
      for (int64_t i = 0; i < numel; ++i)
        out[i] = static_cast<int16_t>(static_cast<uint16_t>((p[2 * i] << 8) | p[2 * i + 1]));
      break;
    }
    case 0x0C:
    case 0x0D: {
      auto* out = static_cast<uint32_t*>(t.data_ptr());
      for (int64_t i = 0; i < numel; ++i) out[i] = detail::read_be32(p + 4 * i);
      break;
    }
    case 0x0E: {
      auto* out = static_cast<uint64_t*>(t.data_ptr());
      for (int64_t i = 0; i < numel; ++i)
        out[i] = (uint64_t{detail::read_be32(p + 8 * i)} << 32) | detail::read_be32(p + 8 * i + 4);
      break;
    }
  }
  return t;
}

// An IDX file (gzip when it starts with the gzip magic) as a tensor.
inline AnyTensor read_idx(const std::string& path) {
  std::vector<uint8_t> bytes = read_file_maybe_gzip(path);
  return parse_idx(bytes.data(), bytes.size(), path);
}

// Images and labels from a pair of IDX files (MNIST layout): example i has "image" (the image
// file's element type, its shape without the first dimension: uint8 [28, 28] for MNIST) and
// "label" (int64 scalar).
class IdxDataset : public Dataset {
 public:
  IdxDataset(const std::string& images_path, const std::string& labels_path)
      : name_("idx(" + images_path + ")") {
    images_ = read_idx(images_path);
    AnyTensor labels = read_idx(labels_path);
    EMBER_CHECK(labels.dim() == 1, FormatError, "idx: '", labels_path, "': labels must have 1 dimension, got shape ",
                labels.shape().str());
    EMBER_CHECK(images_.size(0) == labels.size(0), FormatError, "idx: sizes disagree: '", images_path, "' has ",
                images_.size(0), " records but '", labels_path, "' has ", labels.size(0));
    labels_ = labels.to(DType::Int64);
    n_ = labels_.size(0);
  }
  int64_t size() const override { return n_; }
  Example get(int64_t i) const override {
    check_index(i);
    return Example{{"image", images_.select(i)}, {"label", labels_.select(i)}};
  }
  std::string name() const override { return name_; }
  const AnyTensor& images() const { return images_; }
  const AnyTensor& labels() const { return labels_; }

 private:
  std::string name_;
  AnyTensor images_, labels_;
  int64_t n_ = 0;
};

// Fashion-MNIST as Debian's dataset-fashion-mnist installs it, or from the folder named by the
// environment variable EMBER_FASHION_MNIST_DIR. split: "train" (60,000) or "test" (10,000).
inline std::string fashion_mnist_dir() {
  const char* env = std::getenv("EMBER_FASHION_MNIST_DIR");
  return env && *env ? std::string(env) : std::string("/usr/share/datasets/fashion-mnist");
}
inline IdxDataset fashion_mnist(const std::string& split, const std::string& dir = fashion_mnist_dir()) {
  EMBER_CHECK(split == "train" || split == "test", ValueError, "fashion_mnist: split must be 'train' or 'test', got '",
              split, "'");
  const std::string prefix = dir + "/" + (split == "train" ? "train" : "t10k");
  return IdxDataset(prefix + "-images-idx3-ubyte.gz", prefix + "-labels-idx1-ubyte.gz");
}

}  // namespace ember::data
