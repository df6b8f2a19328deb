// libFuzzer target for the meta.yaml reader (logging/mlflow_files.hpp) that MlflowRun runs over an
// existing mlruns/ folder when it continues a run or finds an experiment by name: whatever the
// bytes, parse_meta_yaml returns keys that are one line each and hold no ':' (or throws an
// ember::Error); nothing crashes or reads out of bounds.
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude \
//     tests/fuzz/fuzz_mlflow_meta.cpp -o /tmp/fz && /tmp/fz -max_total_time=60 tests/fuzz/corpus/mlflow_meta
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ember/logging/mlflow_files.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto entries = ember::logging::mlflow_files::parse_meta_yaml(std::string(reinterpret_cast<const char*>(data), size));
    for (const auto& [key, value] : entries)
      if (key.find('\n') != std::string::npos || key.find(':') != std::string::npos) std::abort();
  } catch (const ember::Error&) {
  }
  return 0;
}
