// libFuzzer target for what nn::GPT::from_huggingface reads from a model folder before any tensor
// (nn/detail/gpt_huggingface.hpp): config.json (GPT::config_from_huggingface) and
// model.safetensors.index.json (gpt_hf_detail::index_shards). The bytes are parsed as JSON, then
// both readers run on them. Whatever the bytes, each returns or throws an ember::Error (a
// FormatError or ValueError naming the field), never another exception; an accepted config has
// positive sizes with n_embd divisible by n_head, as the GPT constructor requires, and equal to
// the file's own numbers; an accepted index names only plain file names inside the folder.
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude \
//     tests/fuzz/fuzz_gpt2_config.cpp -o /tmp/fz && /tmp/fz -max_total_time=60 tests/fuzz/corpus/gpt2_config
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ember/nn/gpt.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    const ember::nn::GPTConfig c = ember::nn::GPT::config_from_huggingface(j, "fuzz/config.json");
    if (c.vocab_size <= 0 || c.block_size <= 0 || c.n_layer <= 0 || c.n_head <= 0 || c.n_embd <= 0 ||
        c.n_embd % c.n_head != 0 || c.n_inner < 0 || !(c.dropout >= 0.0 && c.dropout <= 1.0))
      std::abort();
    if (c.vocab_size != j.at("vocab_size").get<int64_t>() || c.n_embd != j.at("n_embd").get<int64_t>()) std::abort();
  } catch (const ember::Error&) {
  }
  try {
    const auto shards = ember::nn::gpt_hf_detail::index_shards(j, "/fuzz", "fuzz/index.json", "fuzz");
    for (const auto& p : shards)
      if (p.parent_path() != "/fuzz" || p.filename() == ".." || p.filename() == ".") std::abort();
  } catch (const ember::Error&) {
  }
  return 0;
}
