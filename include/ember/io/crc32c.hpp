#pragma once
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord framing uses it, and
// TensorFlow's masked form of it (TensorBoard event files and TFRecord datasets). Portable
// slicing-by-8 (eight bytes per step through eight tables): a TFRecord dataset checks every
// record's data as it reads it, so this runs over every byte of the dataset each epoch.
#include <array>
#include <cstddef>
#include <cstdint>

namespace ember::io {

namespace detail {
// t[0] is the byte-at-a-time table; t[k][b] is the CRC of byte b followed by k zero bytes.
inline const std::array<std::array<uint32_t, 256>, 8>& crc32c_tables() {
  static const std::array<std::array<uint32_t, 256>, 8> tables = [] {
    std::array<std::array<uint32_t, 256>, 8> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[0][i] = c;
    }
    for (size_t k = 1; k < 8; ++k)
      for (size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFu];
    return t;
  }();
  return tables;
}
}  // namespace detail

// CRC-32C of n bytes, continuing from `crc` (the CRC of the bytes before; 0 to start).
inline uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0) {
  const auto& t = detail::crc32c_tables();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    const uint32_t lo = (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24) ^ c;
    c = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^ t[3][p[4]] ^
        t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
  }
  for (size_t i = 0; i < n; ++i) c = t[0][(c ^ p[i]) & 0xFFu] ^ (c >> 8);
  return ~c;
}

// TFRecord's masked CRC: rotate right by 15 bits and add a constant, so that a CRC stored inside
// data that is itself checksummed does not produce trivial patterns.
inline uint32_t mask_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }
inline uint32_t unmask_crc32c(uint32_t masked) {
  const uint32_t rot = masked - 0xA282EAD8u;
  return (rot >> 17) | (rot << 15);
}

}  // namespace ember::io
