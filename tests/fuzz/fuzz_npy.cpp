// libFuzzer target for the .npy header parser (data/npy.hpp): whatever the bytes,
// parse_npy_header returns a header whose data region lies exactly inside the buffer, or throws
// ember::FormatError; nothing crashes or reads out of bounds (the region is read, as the
// memory-mapped reader does).
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude \
//     tests/fuzz/fuzz_npy.cpp -o /tmp/fz && /tmp/fz -max_total_time=60 tests/fuzz/corpus/npy
#include <cstdint>
#include <cstdlib>

#include "ember/data/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    ember::data::NpyHeader h = ember::data::parse_npy_header(data, size, "fuzz");
    if (h.data_offset > size || h.data_bytes != size - h.data_offset) std::abort();
    if (static_cast<size_t>(h.shape.numel()) * ember::dtype_size(h.dtype) != h.data_bytes) std::abort();
    uint64_t sum = 0;
    for (size_t i = 0; i < h.data_bytes; ++i) sum += data[h.data_offset + i];
    volatile uint64_t sink = sum;
    (void)sink;
  } catch (const ember::FormatError&) {
  }
  return 0;
}
