// libFuzzer target for the ONNX signature reader (deploy/triton_onnx_io.hpp) that
// io::triton::add_onnx_model runs over any .onnx file it is given: whatever the bytes, it returns
// a signature with at least one input and one output, or throws ember::FormatError; nothing
// crashes or reads out of bounds.
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude \
//     tests/fuzz/fuzz_onnx_signature.cpp -o /tmp/fz && /tmp/fz -max_total_time=60 tests/fuzz/corpus/onnx_signature
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "ember/deploy/triton_onnx_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto sig = ember::io::triton::read_onnx_signature_bytes(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.onnx");
    if (sig.inputs.empty() || sig.outputs.empty()) std::abort();
  } catch (const ember::FormatError&) {
  }
  return 0;
}
