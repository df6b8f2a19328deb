// Generation speed of nn::GPT on the CPU against Hugging Face transformers' generate() on the same
// model (twin: bench_generate.py, which also makes the model folder). Greedy decoding of batch 1:
// a prompt of --prompt random tokens (Philox seed 0, so both sides feed the same ids), then
// --new tokens; tokens/s = new tokens / wall time of the whole generate() call (prefill included),
// the median of --runs calls after one warm-up. Also the same without the KV cache (every step runs
// the whole sequence), which is what the cache saves.
//
//   python benchmarks/bench_generate.py --make /tmp/gpt2-124m          (random GPT-2 124M weights)
//   ./bench_generate --model /tmp/gpt2-124m --threads 2 [--prompt 32 --new 64 --runs 3 --no-cache-too 1]
//   python benchmarks/bench_generate.py --model /tmp/gpt2-124m --threads 2 [same flags]
// Prints one line per mode: "<who> <mode> threads=<n> tokens/s=<median> (runs: ...)", and checks
// that the cached and uncached runs produced the same tokens.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ember/ember.hpp>
#include <ember/nn/gpt.hpp>

using namespace ember;

namespace {
std::string flag(int argc, char** argv, const std::string& name, const std::string& def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == "--" + name) return argv[i + 1];
  return def;
}
}  // namespace

int main(int argc, char** argv) try {
  const std::string dir = flag(argc, argv, "model", "");
  if (dir.empty()) {
    std::fprintf(stderr, "usage: bench_generate --model DIR [--threads N --prompt 32 --new 64 --runs 3]\n");
    return 2;
  }
  const int threads = std::atoi(flag(argc, argv, "threads", "2").c_str());
  const int64_t prompt_len = std::atoll(flag(argc, argv, "prompt", "32").c_str());
  const int64_t new_tokens = std::atoll(flag(argc, argv, "new", "64").c_str());
  const int runs = std::atoi(flag(argc, argv, "runs", "3").c_str());
  const bool no_cache_too = flag(argc, argv, "no-cache-too", "1") == "1";
  set_num_threads(threads);

  auto t0 = std::chrono::steady_clock::now();
  auto gpt = nn::GPT::from_huggingface(dir);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("ember load %s: %.2f s (%lld parameters)\n", dir.c_str(), load_s,
              static_cast<long long>(gpt->parameter_count()));

  Generator gen(0);
  std::vector<int64_t> ids;
  for (double u : Tensor<double>::rand({prompt_len}, Device::cpu(), 0.0, 1.0, gen).to_vector())
    ids.push_back(std::min<int64_t>(static_cast<int64_t>(u * static_cast<double>(gpt->config().vocab_size)),
                                    gpt->config().vocab_size - 1));
  const auto prompt = Tensor<int64_t>::from_vector(ids, {1, prompt_len});
  std::printf("ember prompt ids (for bench_generate.py --prompt-ids): ");
  for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%lld", i ? "," : "", static_cast<long long>(ids[i]));
  std::printf("\n");

  std::vector<int64_t> cached_tokens;
  for (bool cache : {true, false}) {
    if (!cache && !no_cache_too) break;
    const nn::GenerateOptions o{.max_new_tokens = new_tokens, .temperature = 0.0, .use_cache = cache};
    std::vector<double> tps;
    std::vector<int64_t> tokens = gpt->generate(prompt, o).to_vector();  // warm-up
    for (int r = 0; r < runs; ++r) {
      auto a = std::chrono::steady_clock::now();
      tokens = gpt->generate(prompt, o).to_vector();
      tps.push_back(static_cast<double>(new_tokens) /
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
    }
    if (cache) cached_tokens = tokens;
    else if (tokens != cached_tokens) std::printf("WARNING: the cached and uncached runs chose different tokens\n");
    std::vector<double> sorted = tps;
    std::sort(sorted.begin(), sorted.end());
    std::printf("ember %s threads=%d tokens/s=%.2f (runs:", cache ? "kv-cache" : "no-cache", threads,
                sorted[sorted.size() / 2]);
    for (double t : tps) std::printf(" %.2f", t);
    std::printf(")\n");
  }
  std::printf("ember tokens:");
  for (size_t i = static_cast<size_t>(prompt_len); i < cached_tokens.size() && i < static_cast<size_t>(prompt_len) + 8; ++i)
    std::printf(" %lld", static_cast<long long>(cached_tokens[i]));
  std::printf(" ...\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_generate: %s\n", e.what());
  return 1;
}
