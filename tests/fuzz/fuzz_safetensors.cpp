// libFuzzer target for the safetensors header parser and loader (io/safetensors_header.hpp):
// whatever the bytes, parse_safetensors returns a validated header or throws ember::FormatError;
// it never crashes or reads out of bounds. When the header is valid, every region it names lies
// inside the buffer: reading each one (as the loader does) must stay in bounds too.
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude \
//     tests/fuzz/fuzz_safetensors.cpp -o /tmp/fz && /tmp/fz -max_total_time=60 tests/fuzz/corpus/safetensors
#include <cstdint>
#include <cstdlib>

#include "ember/io/safetensors_header.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    ember::io::SafetensorsHeader h = ember::io::parse_safetensors(data, size, "fuzz");
    uint64_t sum = 0;
    for (const auto& t : h.tensors) {
      if (h.data_start + t.end > size) std::abort();  // the validator let an out-of-range region through
      for (uint64_t i = t.begin; i < t.end; ++i) sum += data[h.data_start + i];
    }
    volatile uint64_t sink = sum;
    (void)sink;
  } catch (const ember::FormatError&) {
  }
  return 0;
}
