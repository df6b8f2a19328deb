// libFuzzer target for the IDX reader (data/idx.hpp) and its gzip layer (data/gzip.hpp):
// whatever the bytes, parse_idx returns a tensor whose size matches the input or throws
// ember::FormatError, and gunzip (with a small output limit) decodes or throws FormatError; neither
// crashes nor reads out of bounds.
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude \
//     tests/fuzz/fuzz_idx.cpp -lz -o /tmp/fz && /tmp/fz -max_total_time=60 tests/fuzz/corpus/idx
#include <cstdint>
#include <cstdlib>

#include "ember/data/idx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  try {
    if (ember::data::is_gzip(data, size)) bytes = ember::data::gunzip(data, size, "fuzz", size_t{1} << 22);
  } catch (const ember::FormatError&) {
    return 0;
  }
  try {
    ember::AnyTensor t = ember::data::parse_idx(bytes.data(), bytes.size(), "fuzz");
    const size_t header = 4 + 4 * static_cast<size_t>(t.dim());
    if (header > bytes.size()) std::abort();
    // Every element was read from the input: the element count times the stored width fits.
    const size_t width = bytes[2] == 0x08 || bytes[2] == 0x09 ? 1 : bytes[2] == 0x0B ? 2 : bytes[2] == 0x0E ? 8 : 4;
    if (static_cast<size_t>(t.numel()) * width != bytes.size() - header) std::abort();
  } catch (const ember::FormatError&) {
  }
  return 0;
}
