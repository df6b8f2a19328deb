// libFuzzer target for the GGUF parser (io/gguf_format.hpp; the writer, io/gguf_writer.hpp, for the round trip): whatever the bytes, parse_gguf returns
// validated contents or throws ember::FormatError; it never crashes, reads out of bounds or
// allocates what the bytes merely claim. When it accepts a file, every tensor's data lies inside
// the buffer (read here as the reader would), each Q8_0 tensor dequantizes in bounds, and writing
// the parsed contents again with the writer gives a file that parses to the same contents.
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude \
//     tests/fuzz/fuzz_gguf.cpp -o /tmp/fz && /tmp/fz -max_total_time=60 tests/fuzz/corpus/gguf
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ember/io/gguf_format.hpp"
#include "ember/io/gguf_writer.hpp"

namespace gg = ember::io::gguf;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gg::Contents c;
  try {
    c = gg::parse_gguf(data, size, "fuzz");
  } catch (const ember::FormatError&) {
    return 0;
  }
  uint64_t sum = 0;
  for (const auto& t : c.tensors) {
    if (c.data_start + t.offset + t.nbytes > size) std::abort();  // the validator let an out-of-range region through
    const uint8_t* p = data + c.data_start + t.offset;
    for (uint64_t i = 0; i < t.nbytes; ++i) sum += p[i];
    if (t.type == gg::GGMLType::Q8_0 && t.numel() <= (int64_t{1} << 16)) {
      std::vector<float> y(static_cast<size_t>(t.numel()));
      gg::dequantize_q8_0(p, t.numel(), y.data());
    }
  }
  volatile uint64_t sink = sum;
  (void)sink;
  // Round trip: what the parser accepted, the writer writes (with the same alignment) and the
  // parser reads back identically. Names of files ember did not write may break the writer's
  // stricter rules (an empty or non-ASCII key, a 0-dim tensor): those are skipped.
  try {
    gg::Writer w;
    for (const auto& kv : c.metadata) w.add(kv.key, kv.value);
    for (const auto& t : c.tensors)
      w.add_tensor(t.name, t.shape(), t.type, static_cast<const void*>(data + c.data_start + t.offset));
    const std::vector<uint8_t> again = w.serialize();
    const gg::Contents d = gg::parse_gguf(again.data(), again.size(), "fuzz-again");
    if (d.metadata.size() != c.metadata.size() || d.tensors.size() != c.tensors.size() || d.alignment != c.alignment)
      std::abort();
    for (size_t i = 0; i < c.tensors.size(); ++i)
      if (d.tensors[i].name != c.tensors[i].name || d.tensors[i].ne != c.tensors[i].ne ||
          d.tensors[i].nbytes != c.tensors[i].nbytes ||
          std::memcmp(again.data() + d.data_start + d.tensors[i].offset, data + c.data_start + c.tensors[i].offset,
                      static_cast<size_t>(c.tensors[i].nbytes)) != 0)
        std::abort();
  } catch (const ember::ValueError&) {
  }
  return 0;
}
