#pragma once
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord framing uses it, and
// TensorFlow's masked form of it (TensorBoard event files and TFRecord datasets). Table-driven,
// one byte at a time.
#include <array>
#include <cstddef>
#include <cstdint>

namespace ember::io {

namespace detail {
inline const std::array<uint32_t, 256>& crc32c_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}
}  // namespace detail

// CRC-32C of n bytes, continuing from `crc` (the CRC of the bytes before; 0 to start).
inline uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0) {
  const auto& t = detail::crc32c_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
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
