#pragma once
// gzip decompression with zlib (link zlib: ZLIB::ZLIB in CMake, -lz): the IDX and CSV readers
// accept .gz files. Concatenated members are decoded one after another (as gunzip does).
// Corrupt, truncated or oversized input is a FormatError naming the source; never a crash.
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/data/read_file.hpp"

namespace ember::data {

// Output beyond max_bytes is refused (a small corrupt file must not expand into all memory).
inline constexpr size_t kMaxGunzipBytes = size_t{1} << 33;  // 8 GiB

inline std::vector<uint8_t> gunzip(const uint8_t* data, size_t size, const std::string& source,
                                   size_t max_bytes = kMaxGunzipBytes) {
  std::vector<uint8_t> out;
  size_t pos = 0;
  int members = 0;
  while (pos < size) {
    if (members > 0 && !is_gzip(data + pos, size - pos)) {
      // Trailing zero padding after the last member is common (tape blocks); anything else is not gzip.
      bool zeros = true;
      for (size_t i = pos; i < size && zeros; ++i) zeros = data[i] == 0;
      EMBER_CHECK(zeros, FormatError, "gzip: '", source, "': ", size - pos,
                  " bytes of garbage after gzip member ", members, " at byte ", pos);
      break;
    }
    z_stream zs{};
    EMBER_CHECK(inflateInit2(&zs, 16 + MAX_WBITS) == Z_OK, FormatError, "gzip: '", source,
                "': zlib inflateInit2 failed");
    zs.next_in = const_cast<Bytef*>(data + pos);
    int rc = Z_OK;
    size_t fed = 0;
    uint8_t buf[1 << 16];
    while (rc != Z_STREAM_END) {
      if (zs.avail_in == 0) {
        const size_t chunk = std::min<size_t>(size - pos - fed, size_t{1} << 30);
        if (chunk == 0) break;
        zs.avail_in = static_cast<uInt>(chunk);
        fed += chunk;
      }
      zs.next_out = buf;
      zs.avail_out = sizeof buf;
      rc = inflate(&zs, Z_NO_FLUSH);
      if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
        const std::string msg = zs.msg ? zs.msg : "unknown";
        const size_t at = pos + (fed - zs.avail_in);
        inflateEnd(&zs);
        throw FormatError(::ember::detail::str_cat("gzip: '", source, "': corrupt data near byte ", at, " (zlib: ",
                                                   msg, ")"));
      }
      const size_t produced = sizeof buf - zs.avail_out;
      if (out.size() + produced > max_bytes) {
        inflateEnd(&zs);
        throw FormatError(::ember::detail::str_cat("gzip: '", source, "': decompresses to more than ", max_bytes,
                                                   " bytes (the limit)"));
      }
      out.insert(out.end(), buf, buf + produced);
      if (rc == Z_BUF_ERROR && zs.avail_in == 0 && pos + fed >= size) break;  // input ran out
    }
    const size_t consumed = fed - zs.avail_in;
    inflateEnd(&zs);
    EMBER_CHECK(rc == Z_STREAM_END, FormatError, "gzip: '", source, "': truncated (the compressed stream of member ",
                members + 1, " ends at byte ", size, " before its end marker)");
    pos += consumed;
    ++members;
  }
  return out;
}

// A file's bytes, gunzipped when they start with the gzip magic.
inline std::vector<uint8_t> read_file_maybe_gzip(const std::string& path) {
  std::vector<uint8_t> bytes = read_file_bytes(path);
  if (is_gzip(bytes.data(), bytes.size())) return gunzip(bytes.data(), bytes.size(), path);
  return bytes;
}

}  // namespace ember::data
