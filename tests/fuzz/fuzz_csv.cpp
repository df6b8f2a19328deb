// libFuzzer target for the CSV reader (data/csv.hpp): whatever the bytes, parse_csv returns a
// table whose values fill rows x cols, and CsvDataset builds from it or throws ember::FormatError;
// nothing crashes or reads out of bounds. The first byte picks the options (header, label).
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude \
//     tests/fuzz/fuzz_csv.cpp -lz -o /tmp/fz && /tmp/fz -max_total_time=60 tests/fuzz/corpus/csv
#include <cstdint>
#include <cstdlib>

#include "ember/data/csv.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  ember::data::CsvOptions o;
  o.header = (data[0] & 1) != 0;
  o.skip_rows = (data[0] >> 1) & 3;
  o.integer_labels = (data[0] & 8) != 0;
  o.label_index = (data[0] & 16) ? 0 : -1;
  ++data;
  --size;
  try {
    ember::data::CsvTable t = ember::data::parse_csv(data, size, "fuzz", o);
    if (static_cast<int64_t>(t.values.size()) != t.rows * t.cols) std::abort();
    ember::data::CsvDataset ds(data, size, "fuzz", o);
    if (ds.size() != t.rows) std::abort();
    for (int64_t i = 0; i < ds.size(); ++i) (void)ds.get(i);
  } catch (const ember::FormatError&) {
  }
  return 0;
}
