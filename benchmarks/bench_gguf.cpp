// GGUF export of a GPT-2 124M-sized nn::GPT (the default GPTConfig, random weights) in F32, F16 and
// Q8_0: seconds per export (median of --runs, after one warm-up; the time includes the conversion,
// the writes and the fsyncs of the atomic write) and the file's size against the F32 weights'
// bytes (plain main).
//   ./bench_gguf [--runs 3] [--dir /tmp]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <ember/deploy/gguf_export.hpp>
#include <ember/ember.hpp>
#include <ember/nn/gpt.hpp>

using namespace ember;
namespace gg = ember::io::gguf;

int main(int argc, char** argv) {
  int runs = 3;
  std::filesystem::path dir = std::filesystem::temp_directory_path();
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--runs")) runs = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--dir")) dir = argv[i + 1];
  }
  nn::GPT gpt(nn::GPTConfig{});
  const int64_t params = gpt.parameter_count();
  const uint64_t f32_bytes = static_cast<uint64_t>(params) * 4;
  std::printf("GPT-2 124M-sized nn::GPT: %lld parameters (%llu bytes in F32); %d runs each, files in %s\n",
              static_cast<long long>(params), static_cast<unsigned long long>(f32_bytes), runs, dir.string().c_str());
  std::printf("%-6s %10s %10s %14s %12s\n", "type", "seconds", "min", "file (bytes)", "of F32 data");
  for (const gg::GGMLType type : {gg::GGMLType::F32, gg::GGMLType::F16, gg::GGMLType::Q8_0}) {
    const auto path = dir / "ember_bench_gpt2.gguf";
    std::vector<double> secs;
    gg::GPTExportResult r;
    for (int k = 0; k <= runs; ++k) {  // k == 0: warm-up (page cache, allocator)
      const auto t0 = std::chrono::steady_clock::now();
      r = gg::export_gpt(gpt, path, {.type = type});
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (k > 0) secs.push_back(s);
    }
    std::sort(secs.begin(), secs.end());
    std::printf("%-6s %10.3f %10.3f %14llu %11.2f%%\n", gg::type_name(type), secs[secs.size() / 2], secs[0],
                static_cast<unsigned long long>(r.file_bytes),
                100.0 * static_cast<double>(r.file_bytes) / static_cast<double>(f32_bytes));
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
}
