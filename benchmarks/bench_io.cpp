// Save and load throughput of a 124M-parameter state dict with GPT-2-small shapes (float32,
// 498 MB), against the Python safetensors library on the same machine (benchmarks/bench_io.py, run
// interleaved with ember's rounds when --python is given), and the time the training thread is
// blocked by CheckpointManager::save_async against save.
//
//   bench_io [--dir /tmp] [--rounds 3] [--python /path/to/python] [--json out.json]
//
// Plain main (no Google Benchmark): each round writes and reads files of half a gigabyte.
// Figures are medians over the rounds. Saves include fsync (ember's writes are atomic: temporary
// file, fsync, rename, fsync of the folder); loads read a file that was just written, so from the
// page cache (the figure is memory and parsing speed, not the disk's).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <ember/ember.hpp>
#include <ember/train/checkpoint_manager.hpp>

using namespace ember;
namespace fs = std::filesystem;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// GPT-2 small (124M): torch / Hugging Face names and shapes.
std::vector<std::pair<std::string, std::vector<int64_t>>> gpt2_shapes() {
  std::vector<std::pair<std::string, std::vector<int64_t>>> s;
  s.push_back({"wte.weight", {50257, 768}});
  s.push_back({"wpe.weight", {1024, 768}});
  for (int i = 0; i < 12; ++i) {
    const std::string p = "h." + std::to_string(i) + ".";
    s.push_back({p + "ln_1.weight", {768}});
    s.push_back({p + "ln_1.bias", {768}});
    s.push_back({p + "attn.c_attn.weight", {768, 2304}});
    s.push_back({p + "attn.c_attn.bias", {2304}});
    s.push_back({p + "attn.c_proj.weight", {768, 768}});
    s.push_back({p + "attn.c_proj.bias", {768}});
    s.push_back({p + "ln_2.weight", {768}});
    s.push_back({p + "ln_2.bias", {768}});
    s.push_back({p + "mlp.c_fc.weight", {768, 3072}});
    s.push_back({p + "mlp.c_fc.bias", {3072}});
    s.push_back({p + "mlp.c_proj.weight", {3072, 768}});
    s.push_back({p + "mlp.c_proj.bias", {768}});
  }
  s.push_back({"ln_f.weight", {768}});
  s.push_back({"ln_f.bias", {768}});
  return s;
}

// A module tree holding parameters under dotted names (for CheckpointManager, which saves modules).
struct Bag : nn::Module {
  using nn::Module::register_module;
  using nn::Module::register_parameter;
  std::map<std::string, std::shared_ptr<Bag>> kids;
  void put(const std::string& name, AnyTensor t) {
    const size_t dot = name.find('.');
    if (dot == std::string::npos) {
      register_parameter(name, t);
      return;
    }
    const std::string head = name.substr(0, dot);
    auto& k = kids[head];
    if (!k) k = register_module(head, std::make_shared<Bag>());
    k->put(name.substr(dot + 1), t);
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp", python, json_out;
  int rounds = 3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_io: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--dir") dir = next();
    else if (a == "--rounds") rounds = std::max(1, std::atoi(next().c_str()));
    else if (a == "--python") python = next();
    else if (a == "--json") json_out = next();
    else {
      std::fprintf(stderr, "usage: bench_io [--dir D] [--rounds N] [--python PY] [--json OUT]\n");
      return 2;
    }
  }
  const fs::path work = fs::path(dir) / ("ember-bench-io-" + std::to_string(::getpid()));
  fs::create_directories(work);

  manual_seed(0);
  io::TensorList sd;
  Bag model;
  int64_t params = 0;
  for (auto& [name, shape] : gpt2_shapes()) {
    auto t = Tensor<float>::randn(Shape(shape), Device::cpu(), 0.0, 0.02);
    params += t.numel();
    sd.emplace_back(name, t);
    model.put(name, t);
  }
  const double gb = static_cast<double>(params) * 4.0 / 1e9;
  std::printf("state dict: %lld parameters (%.3f GB float32), %zu tensors; files in %s\n",
              static_cast<long long>(params), gb, sd.size(), work.c_str());

  std::vector<double> save_s, load_s, open_s, ck_save_s, ck_async_block_s, ck_async_total_s;
  std::vector<double> py_save, py_save_fsync, py_load;
  const std::string bench_py = std::string(EMBER_BENCH_SOURCE_DIR) + "/bench_io.py";
  // One manager for the whole run, as in a training loop: its first save_async allocates the host
  // buffers it stages into (page faults: as slow as a copy into fresh memory), later ones reuse them.
  train::CheckpointManager ckpt(work / "ckpt", {.keep_last = 2});
  // The same with one copying thread (what save_async did before copy_threads), timed alternately.
  train::CheckpointManager ckpt1(work / "ckpt1", {.keep_last = 2, .copy_threads = 1});
  std::vector<double> ck1_async_block_s;
  ckpt1.save_async(0, {.model = &model});
  ckpt1.wait();
  {
    const double t0 = now_s();
    ckpt.save_async(0, {.model = &model});
    const double first = now_s() - t0;
    ckpt.wait();
    std::printf("first save_async (allocates its staging buffers) blocked for %.3f s\n", first);
  }
  for (int r = 0; r < rounds; ++r) {
    const fs::path f = work / "model.safetensors";
    double t0 = now_s();
    io::save_file(f, sd);
    save_s.push_back(now_s() - t0);
    t0 = now_s();
    io::TensorList back = io::load_file(f);
    load_s.push_back(now_s() - t0);
    t0 = now_s();
    { io::SafetensorsFile m(f); }
    open_s.push_back(now_s() - t0);
    back.clear();

    {
      t0 = now_s();
      ckpt.save(2 * r + 1, {.model = &model});
      ck_save_s.push_back(now_s() - t0);
      t0 = now_s();
      ckpt.save_async(2 * r + 2, {.model = &model});
      const double blocked = now_s() - t0;
      ckpt.wait();
      ck_async_block_s.push_back(blocked);
      ck_async_total_s.push_back(now_s() - t0);
      t0 = now_s();
      ckpt1.save_async(2 * r + 2, {.model = &model});
      ck1_async_block_s.push_back(now_s() - t0);
      ckpt1.wait();
    }

    if (!python.empty()) {
      const std::string cmd = "'" + python + "' '" + bench_py + "' --dir '" + work.string() + "' --rounds 1";
      FILE* p = ::popen(cmd.c_str(), "r");
      char line[512];
      while (p && std::fgets(line, sizeof line, p)) {
        double a, b, c;
        if (std::sscanf(line, "python round: save %lf save+fsync %lf load %lf", &a, &b, &c) == 3) {
          py_save.push_back(a);
          py_save_fsync.push_back(b);
          py_load.push_back(c);
        } else if (std::string(line).find("SKIPPED") != std::string::npos) {
          std::printf("%s", line);
        }
      }
      if (p) ::pclose(p);
    }
  }
  fs::remove_all(work);

  auto rate = [&](double s) { return s > 0 ? gb / s : 0.0; };
  std::printf("ember io::save_file (atomic, fsync)        %7.3f s  %6.2f GB/s\n", median(save_s), rate(median(save_s)));
  std::printf("ember io::load_file (page cache)           %7.3f s  %6.2f GB/s\n", median(load_s), rate(median(load_s)));
  std::printf("ember SafetensorsFile open (mmap + header) %7.4f s\n", median(open_s));
  std::printf("CheckpointManager::save                    %7.3f s\n", median(ck_save_s));
  std::printf("CheckpointManager::save_async blocks for   %7.3f s  (%.1f%% of save; %.3f s until written)\n",
              median(ck_async_block_s), 100.0 * median(ck_async_block_s) / median(ck_save_s), median(ck_async_total_s));
  std::printf("  the same with copy_threads = 1           %7.3f s  (%.1f%% of save)\n", median(ck1_async_block_s),
              100.0 * median(ck1_async_block_s) / median(ck_save_s));
  if (!py_save.empty()) {
    std::printf("python safetensors.numpy save_file          %7.3f s  %6.2f GB/s  (no fsync)\n", median(py_save),
                rate(median(py_save)));
    std::printf("python save_file + fsync                    %7.3f s  %6.2f GB/s\n", median(py_save_fsync),
                rate(median(py_save_fsync)));
    std::printf("python safetensors.numpy load_file          %7.3f s  %6.2f GB/s\n", median(py_load),
                rate(median(py_load)));
    std::printf("ember / python: save (both fsync) %.2fx, load %.2fx\n", median(py_save_fsync) / median(save_s),
                median(py_load) / median(load_s));
  }
  if (!json_out.empty()) {
    nlohmann::json j = {{"parameters", params}, {"gigabytes", gb}, {"rounds", rounds},
                        {"ember_save_s", median(save_s)}, {"ember_load_s", median(load_s)},
                        {"ember_open_s", median(open_s)}, {"checkpoint_save_s", median(ck_save_s)},
                        {"checkpoint_save_async_block_s", median(ck_async_block_s)},
                        {"checkpoint_save_async_total_s", median(ck_async_total_s)},
                        {"checkpoint_save_async_block_1thread_s", median(ck1_async_block_s)}};
    if (!py_save.empty()) {
      j["python_save_s"] = median(py_save);
      j["python_save_fsync_s"] = median(py_save_fsync);
      j["python_load_s"] = median(py_load);
    }
    std::ofstream(json_out) << j.dump(2) << "\n";
  }
  return 0;
}
