// libFuzzer target for the numerics-settings exchange of the process groups
// (dist/same_settings.hpp): the bytes each rank receives from its peers are decoded without
// trusting them. Whatever the bytes, decode() returns settings with no repeated name, encode() of
// them decodes to the same settings (when they fit and hold no control characters or overlong
// values, which encode cleans or cuts), and compare() over up to 9 ranks (the
// per-rank and the grouped message) neither crashes nor reports a difference between identical
// ranks. The first byte picks the number of ranks; the rest is cut into that many rank buffers.
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude \
//     tests/fuzz/fuzz_settings.cpp -o /tmp/fz && /tmp/fz -max_total_time=60 tests/fuzz/corpus/settings
#include <cstdint>
#include <cstdlib>

#include "ember/dist/same_settings.hpp"

namespace sd = ember::dist::settings_detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t ranks = 1 + data[0] % 9;
  ++data;
  --size;
  const size_t share = size / ranks;
  std::vector<sd::Decoded> all;
  for (size_t r = 0; r < ranks; ++r) {
    const size_t n = r + 1 == ranks ? size - share * r : share;
    sd::Decoded d = sd::decode(data + share * r, n);
    for (size_t i = 0; i < d.settings.size(); ++i)
      for (size_t j = i + 1; j < d.settings.size(); ++j)
        if (d.settings[i].name == d.settings[j].name) std::abort();  // repeated names are dropped
    // Round trip: what a rank decoded, sent on again, decodes the same (when it fits and is short).
    auto plain = [](const std::string& t) {
      for (char c : t)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;  // encode turns these into '?'
      return true;
    };
    bool short_values = true;
    for (const auto& e : d.settings)
      short_values = short_values && e.name.size() <= 100 && plain(e.name) &&
                     (!e.value || (e.value->size() <= ember::dist::kMaxSettingValue && plain(*e.value)));
    const auto bytes = sd::encode(d.settings, ember::dist::SettingsCheck::Warn);
    if (bytes.size() != ember::dist::kSettingsBytes || bytes.back() != 0) std::abort();
    const sd::Decoded again = sd::decode(bytes.data(), bytes.size());
    if (short_values && again.settings.size() == d.settings.size())
      for (size_t i = 0; i < d.settings.size(); ++i)
        if (again.settings[i].name != d.settings[i].name || again.settings[i].value != d.settings[i].value) std::abort();
    all.push_back(std::move(d));
  }
  (void)sd::compare(all, "fuzz");
  // Identical ranks never disagree.
  std::vector<sd::Decoded> same(ranks, all[0]);
  if (!sd::compare(same, "fuzz").empty()) std::abort();
  return 0;
}
