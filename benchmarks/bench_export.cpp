// Export of a GPT-2 124M-sized nn::GPT (the default GPTConfig, random weights) to ONNX: seconds
// per export (median of --runs, after one warm-up) and the files' size against the weights'
// bytes, for fp32 and fp16 graphs, weights inline and in an external data file (plain main).
//   ./bench_export [--runs 3] [--dir /tmp]
// The target: under 2 s, the files within 1% of the weights' size.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <ember/deploy/onnx.hpp>
#include <ember/ember.hpp>
#include <ember/nn/gpt.hpp>

using namespace ember;

int main(int argc, char** argv) {
  int runs = 3;
  std::filesystem::path dir = std::filesystem::temp_directory_path();
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--runs")) runs = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--dir")) dir = argv[i + 1];
  }
  nn::GPT gpt(nn::GPTConfig{});
  const int64_t params = gpt.parameter_count();
  const auto ids = Tensor<int64_t>::from_vector({1, 2, 3, 4}, {1, 4});
  std::printf("GPT-2 124M-sized nn::GPT: %lld parameters; %d runs each, files in %s\n",
              static_cast<long long>(params), runs, dir.string().c_str());
  std::printf("%-22s %10s %14s %14s %10s\n", "case", "seconds", "files (bytes)", "weights", "overhead");
  struct Variant {
    const char* name;
    DType dtype;
    io::onnx::ExternalData external;
  };
  for (const Variant v : {Variant{"fp32 inline", DType::Float32, io::onnx::ExternalData::Never},
                          Variant{"fp32 external data", DType::Float32, io::onnx::ExternalData::Always},
                          Variant{"fp16 inline", DType::Float16, io::onnx::ExternalData::Never},
                          Variant{"fp16 external data", DType::Float16, io::onnx::ExternalData::Always}}) {
    const auto path = dir / "ember_bench_gpt2.onnx";
    std::vector<double> secs;
    io::onnx::ExportResult r;
    for (int k = 0; k <= runs; ++k) {  // k == 0: warm-up (page cache, allocator)
      const auto t0 = std::chrono::steady_clock::now();
      r = io::onnx::export_model(gpt, {ids}, path, {.dtype = v.dtype, .external_data = v.external});
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (k > 0) secs.push_back(s);
    }
    std::sort(secs.begin(), secs.end());
    const uint64_t files = r.model_bytes + r.data_bytes;
    const uint64_t weights = static_cast<uint64_t>(params) * dtype_size(v.dtype);
    std::printf("%-22s %10.3f %14llu %14llu %9.3f%%\n", v.name, secs[secs.size() / 2],
                static_cast<unsigned long long>(files), static_cast<unsigned long long>(weights),
                100.0 * (static_cast<double>(files) - static_cast<double>(weights)) / static_cast<double>(weights));
    std::error_code ec;
    std::filesystem::remove(path, ec);
    if (!r.data_path.empty()) std::filesystem::remove(r.data_path, ec);
  }
}
