// libFuzzer target for the TFRecord reader (data/tfrecord.hpp) and its tf.train.Example codec
// (data/tf_example.hpp): whatever the bytes, as a TFRecord file (gunzipped first when they are
// gzip) and as one Example record, with and without a spec, and as an index cache, the parsers
// return or throw ember::FormatError; none crashes nor reads out of bounds. A record that parses
// is re-encoded and must parse to the same features.
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude \
//     tests/fuzz/fuzz_tfrecord.cpp -lz -o /tmp/fz && /tmp/fz -max_total_time=60 tests/fuzz/corpus/tfrecord
#include <cstdint>
#include <cstdlib>

#include "ember/data/tfrecord.hpp"

namespace {

bool same(const ember::data::TfFeatures& a, const ember::data::TfFeatures& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto &x = a[i].second, &y = b[i].second;
    if (a[i].first != b[i].first || x.kind != y.kind || x.bytes != y.bytes || x.ints != y.ints ||
        x.floats.size() != y.floats.size())
      return false;
    for (size_t k = 0; k < x.floats.size(); ++k)  // bitwise: NaN payloads survive
      if (std::memcmp(&x.floats[k], &y.floats[k], 4) != 0) return false;
  }
  return true;
}

void example(const uint8_t* data, size_t size) {
  using namespace ember::data;
  try {
    const TfFeatures f = parse_tf_example(data, size, "fuzz");
    const auto again = encode_tf_example(f);
    if (!same(parse_tf_example(again.data(), again.size(), "fuzz re-encoded"), f)) std::abort();
  } catch (const ember::FormatError&) {
  }
  try {
    decode_tf_example(data, size, "fuzz");
  } catch (const ember::FormatError&) {
  }
  try {
    decode_tf_example(data, size, "fuzz", {{"image", {ember::DType::UInt8, {-1, 4}}}, {"label", {ember::DType::Int32, {}}}});
  } catch (const ember::FormatError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ember::data;
  example(data, size);
  if (auto offsets = decode_tfrecord_index(data, size, 1 << 20, 0))
    for (size_t i = 0; i < offsets->size(); ++i)
      if ((*offsets)[i] > (1u << 20) - 16) std::abort();
  std::vector<uint8_t> bytes(data, data + size);
  try {
    if (detail::tfrecord_looks_gzip(data, size)) bytes = gunzip(data, size, "fuzz", size_t{1} << 22);
  } catch (const ember::FormatError&) {
    return 0;
  }
  try {
    const auto offsets = index_tfrecord(bytes.data(), bytes.size(), "fuzz", true);
    for (uint64_t o : offsets) {
      const auto rec = detail::tfrecord_at(bytes.data(), bytes.size(), o, "fuzz");
      if (rec.first < bytes.data() || rec.first + rec.second > bytes.data() + bytes.size()) std::abort();
      example(rec.first, rec.second);
    }
  } catch (const ember::FormatError&) {
  }
  return 0;
}
