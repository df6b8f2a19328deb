#pragma once
// Whole-file reads for the dataset readers, with IOErrors that name the file and the cause.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ember/core/error.hpp"

namespace ember::data {

inline std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  EMBER_CHECK(f != nullptr, IOError, "cannot open '", path, "' for reading: ", std::strerror(errno));
  std::vector<uint8_t> bytes;
  uint8_t buf[1 << 16];
  for (;;) {
    size_t got = std::fread(buf, 1, sizeof buf, f);
    bytes.insert(bytes.end(), buf, buf + got);
    if (got < sizeof buf) break;
  }
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  EMBER_CHECK(!failed, IOError, "reading '", path, "' failed: ", std::strerror(err));
  return bytes;
}

// True when the bytes start with the gzip magic (1f 8b).
inline bool is_gzip(const uint8_t* data, size_t size) { return size >= 2 && data[0] == 0x1f && data[1] == 0x8b; }

}  // namespace ember::data
