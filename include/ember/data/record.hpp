#pragma once
// The sample record ember's packer writes into LMDB (examples/pack_dataset, data/lmdb.hpp): one
// Example per record, each field with its name, dtype and shape, so a reader needs no schema.
// No library needed; decode_record works on a byte buffer (the fuzz target calls it).
//
//   "EMBR" u8 version(1) u8 field_count
//   per field: u8 name_length, name, u8 kind, u8 ndim, ndim x i64 dims (little-endian),
//              u64 payload_bytes, payload
//   kind: the ember DType code (0 float32 ... 6 uint8: the elements, little-endian, row-major), or
//   kEncodedImage (the PNG/JPEG file's bytes, shape [bytes]; decoded when read, see LmdbDataset).
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/core/tensor.hpp"
#include "ember/data/dataset.hpp"

namespace ember::data {

inline constexpr uint8_t kRecordVersion = 1;
inline constexpr uint8_t kEncodedImage = 0x80;

// A field to write: a host tensor, or (encoded = true) a uint8 1-D tensor of PNG/JPEG bytes.
struct RecordField {
  std::string name;
  AnyTensor value;
  bool encoded = false;
};

inline std::vector<uint8_t> encode_record(const std::vector<RecordField>& fields) {
  EMBER_CHECK(fields.size() <= 255, ValueError, "encode_record: ", fields.size(), " fields (at most 255)");
  std::vector<uint8_t> out = {'E', 'M', 'B', 'R', kRecordVersion, static_cast<uint8_t>(fields.size())};
  auto put = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  };
  for (const auto& f : fields) {
    EMBER_CHECK(!f.name.empty() && f.name.size() <= 255, ValueError, "encode_record: field name '", f.name,
                "' must have 1 to 255 bytes");
    EMBER_CHECK(f.value.defined() && f.value.device().is_cpu(), ValueError, "encode_record: field '", f.name,
                "' must be a host tensor");
    EMBER_CHECK(!f.encoded || (f.value.dtype() == DType::UInt8 && f.value.dim() == 1), ValueError,
                "encode_record: encoded field '", f.name, "' must be uint8 [bytes]");
    out.push_back(static_cast<uint8_t>(f.name.size()));
    put(f.name.data(), f.name.size());
    out.push_back(f.encoded ? kEncodedImage : static_cast<uint8_t>(f.value.dtype()));
    out.push_back(static_cast<uint8_t>(f.value.dim()));
    for (int64_t d : f.value.shape()) put(&d, 8);
    const uint64_t n = f.value.nbytes();
    put(&n, 8);
    put(f.value.data_ptr(), n);
  }
  return out;
}

// Decodes an encoded-image field's bytes into a tensor (images.hpp's decode_image fits).
using ImageDecoder = std::function<AnyTensor(const uint8_t*, size_t, const std::string& source)>;

// `source` names the database and the record in messages. Encoded images are decoded by `decoder`,
// or, without one, returned as their uint8 [bytes].
inline Example decode_record(const uint8_t* data, size_t size, const std::string& source,
                             const ImageDecoder& decoder = {}) {
  size_t pos = 0;
  auto need = [&](size_t n, const char* what) {
    EMBER_CHECK(n <= size - pos, FormatError, "record: ", source, ": truncated in ", what, " (needs ", n,
                " bytes at offset ", pos, ", the record has ", size, ")");
  };
  need(6, "the header");
  EMBER_CHECK(std::memcmp(data, "EMBR", 4) == 0, FormatError, "record: ", source,
              ": wrong magic (not written by ember's packer)");
  EMBER_CHECK(data[4] == kRecordVersion, FormatError, "record: ", source, ": version ", int{data[4]},
              " (this reader knows ", int{kRecordVersion}, ")");
  const int nfields = data[5];
  pos = 6;
  Example ex;
  for (int k = 0; k < nfields; ++k) {
    need(1, "a field name length");
    const size_t nlen = data[pos++];
    need(nlen, "a field name");
    const std::string name(reinterpret_cast<const char*>(data + pos), nlen);
    pos += nlen;
    EMBER_CHECK(!name.empty(), FormatError, "record: ", source, ": field ", k + 1, " has an empty name");
    EMBER_CHECK(!ex.has(name), FormatError, "record: ", source, ": field '", name, "' appears twice");
    need(2, "a field kind");
    const uint8_t kind = data[pos++];
    const int ndim = data[pos++];
    EMBER_CHECK(kind == kEncodedImage || kind < kNumDTypes, FormatError, "record: ", source, ": field '", name,
                "' has unknown kind ", int{kind});
    EMBER_CHECK(ndim <= kMaxDims && (kind != kEncodedImage || ndim == 1), FormatError, "record: ", source,
                ": field '", name, "' has ", ndim, " dimensions");
    need(8 * static_cast<size_t>(ndim) + 8, "a field shape");
    Shape shape;
    int64_t numel = 1;
    for (int d = 0; d < ndim; ++d) {
      int64_t v;
      std::memcpy(&v, data + pos, 8);
      pos += 8;
      EMBER_CHECK(v >= 0 && (v == 0 || numel <= (int64_t{1} << 40) / v), FormatError, "record: ", source,
                  ": field '", name, "' has a bad dimension ", v);
      shape.push_back(v);
      numel *= v;
    }
    uint64_t bytes;
    std::memcpy(&bytes, data + pos, 8);
    pos += 8;
    const DType dt = kind == kEncodedImage ? DType::UInt8 : static_cast<DType>(kind);
    EMBER_CHECK(bytes == static_cast<uint64_t>(numel) * dtype_size(dt), FormatError, "record: ", source,
                ": sizes disagree: field '", name, "' of shape ", shape.str(), " ", dtype_name(dt), " says ", bytes,
                " payload bytes");
    need(static_cast<size_t>(bytes), "a field payload");
    if (kind == kEncodedImage && decoder) {
      ex.set(name, decoder(data + pos, static_cast<size_t>(bytes), source + " field '" + name + "'"));
    } else {
      AnyTensor t = AnyTensor::empty(shape, dt);
      if (bytes) std::memcpy(t.data_ptr(), data + pos, static_cast<size_t>(bytes));
      ex.set(name, std::move(t));
    }
    pos += static_cast<size_t>(bytes);
  }
  EMBER_CHECK(pos == size, FormatError, "record: ", source, ": ", size - pos, " trailing bytes after ", nfields,
              " fields");
  return ex;
}

}  // namespace ember::data
