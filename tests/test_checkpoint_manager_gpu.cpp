// train::CheckpointManager with device tensors: save_async stages CUDA tensors into pinned host
// memory with queued downloads and one synchronisation (counted on a pretend cuda:0 made of CPU
// kernels), and exact resume in a new process on cuda:0 (a [gpu] case that skips visibly without
// a GPU; the same run on the pretend cuda:0 keeps its code exercised in CI). A file of its own so
// that the GPU check (ctest -L gpu) runs these and not the CPU-only crash tests.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ember/ember.hpp"
#include "ember/train/checkpoint_manager.hpp"
#include "gpu_skip.hpp"
#include "pretend_gpu.hpp"
#include "resume_run.hpp"
#include "temp_dir.hpp"

using namespace ember;
namespace fs = std::filesystem;

namespace {

struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("ember-ckgpu") {}
};

using testing::env;
using testing::same_bytes;

// The pretend cuda:0, counting the calls that tell which staging path a save took.
struct CountingBackend : testing::PretendCudaBackend {
  std::atomic<int> syncs{0}, downloads{0}, copies_to_host{0}, pinned_allocs{0}, pinned_frees{0};
  void synchronize() override { ++syncs; }
  void download_async(void* dst, const void* src, size_t bytes) override {
    ++downloads;
    PretendCudaBackend::download_async(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    ++copies_to_host;
    PretendCudaBackend::copy_to_host(dst, src, bytes);
  }
  void* allocate_pinned(size_t bytes) override {
    ++pinned_allocs;
    return PretendCudaBackend::allocate_pinned(bytes);
  }
  void free_pinned(void* p, size_t bytes) noexcept override {
    ++pinned_frees;
    PretendCudaBackend::free_pinned(p, bytes);
  }
};

CountingBackend& counting_backend() {
  static CountingBackend b;
  return b;
}

// Installs the counting pretend cuda:0 for a scope (only where there is no real GPU).
struct CountingGpu {
  Backend* (*saved_factory)(int) = nullptr;
  int saved_count = 0;
  bool active = false;
  CountingGpu() {
    if (cuda::is_available()) return;
    saved_factory = detail::cuda_backend_factory();
    saved_count = detail::cuda_device_count_slot();
    register_cuda_backend([](int) -> Backend* { return &counting_backend(); }, 1);
    active = true;
  }
  ~CountingGpu() {
    if (active) register_cuda_backend(saved_factory, saved_count);
  }
};

// ------------------------------------------------------------------ the training run to resume
// tests/resume_run.hpp (test_checkpoint_manager.cpp runs it on the CPU), here on device d, saved
// with save_async (the pinned path).
using namespace testing::resume;

// check_exact_resume on cuda:0 (the real one, or the pretend one), saved with save_async.
void check_exact_resume_on_device(bool pretend) {
  TempDir dir;
  check_exact_resume(dir.path, "child: device training run", {std::string("EMBER_CKPT_PRETEND=") + (pretend ? "1" : "0")},
                     [](const std::string& out) { REQUIRE(out.find("All tests passed") != std::string::npos); });
}

}  // namespace

TEST_CASE("child: device training run", "[.]") {
  if (env("EMBER_CKPT_DIR").empty()) return;
  std::optional<testing::PretendGpu> pretend;
  if (env("EMBER_CKPT_PRETEND") == "1") pretend.emplace();
  REQUIRE(cuda::is_available());
  training_run_from_env({.device = Device::cuda(0), .save_async = true});
}

TEST_CASE("CheckpointManager: save_async of device tensors stages into reused pinned memory with one sync",
          "[checkpoint][device]") {
  CountingGpu gpu;  // the pretend cuda:0 (on a real GPU the counts are not checked)
  CountingBackend& b = counting_backend();
  TempDir dir;
  manual_seed(5);
  Mlp model;
  model.to(Device::cuda(0));
  optim::AdamW opt(model.parameters(), {.lr = 1e-2});
  for (auto& p : model.parameters()) p.set_grad(AnyTensor::full(p.shape(), 0.5, p.dtype(), p.device()));
  opt.step();  // exp_avg / exp_avg_sq on the device
  train::CheckpointTargets t{.model = &model, .optimizer = &opt};

  auto host_state = [&] {
    io::TensorList s;
    for (auto& [k, v] : model.state_dict()) s.emplace_back("model." + k, v.to(Device::cpu()));
    for (auto& [i, st] : opt.state_dict().state)
      for (auto& [k, v] : st) s.emplace_back("opt." + std::to_string(i) + "." + k, v.to(Device::cpu()));
    return s;
  };
  int64_t device_tensors = 0;
  for (auto& [k, v] : model.state_dict()) device_tensors += v.device().is_cpu() ? 0 : 1;
  for (auto& [i, st] : opt.state_dict().state)
    for (auto& [k, v] : st) device_tensors += v.device().is_cpu() ? 0 : 1;
  REQUIRE(device_tensors >= 8);  // 4 parameters, 2 moments each

  auto check_saved = [&](int64_t step, const io::TensorList& want) {
    train::CheckpointManager reader(dir.path);
    Mlp back;
    optim::AdamW back_opt(back.parameters(), {.lr = 1e-2});
    reader.load(step, {.model = &back, .optimizer = &back_opt});
    io::TensorList got;
    for (auto& [k, v] : back.state_dict()) got.emplace_back("model." + k, v);
    for (auto& [i, st] : back_opt.state_dict().state)
      for (auto& [k, v] : st) got.emplace_back("opt." + std::to_string(i) + "." + k, v);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      INFO(want[i].first);
      CHECK(got[i].first == want[i].first);
      CHECK(same_bytes(got[i].second, want[i].second));
    }
  };

  {
    train::CheckpointManager ckpt(dir.path);
    const io::TensorList want1 = host_state();
    const int syncs0 = b.syncs, downloads0 = b.downloads, copies0 = b.copies_to_host, pinned0 = b.pinned_allocs;
    ckpt.save_async(1, t);
    if (gpu.active) {
      CHECK(b.syncs - syncs0 == 1);                    // one device synchronisation per save_async
      CHECK(b.downloads - downloads0 == device_tensors);  // every device tensor queued, none copied synchronously
      CHECK(b.copies_to_host - copies0 == 0);
      CHECK(b.pinned_allocs - pinned0 == device_tensors);  // staged in pinned memory
    }
    // Training goes on: the checkpoint keeps the values at save_async.
    for (auto& p : model.parameters()) p.set_grad(AnyTensor::full(p.shape(), -2.0, p.dtype(), p.device()));
    opt.step();
    const io::TensorList want2 = host_state();
    const int syncs1 = b.syncs, downloads1 = b.downloads, pinned1 = b.pinned_allocs, copies1 = b.copies_to_host;
    ckpt.save_async(2, t);  // waits for the first, reuses its pinned buffers
    ckpt.wait();
    if (gpu.active) {
      CHECK(b.syncs - syncs1 == 1);
      CHECK(b.downloads - downloads1 == device_tensors);
      CHECK(b.pinned_allocs - pinned1 == 0);
      CHECK(b.copies_to_host - copies1 == 0);  // nor did the writer threads
    }
    check_saved(1, want1);
    check_saved(2, want2);
    CHECK_FALSE(same_bytes(want1[0].second, want2[0].second));
  }
  if (gpu.active) CHECK(b.pinned_frees == b.pinned_allocs);  // the manager freed its pinned buffers
}

TEST_CASE("CheckpointManager: exact resume in a new process on the pretend cuda:0 (save_async, pinned staging)",
          "[checkpoint][resume][device]") {
  if (cuda::is_available()) return;  // a real GPU runs the [gpu] case below instead
  check_exact_resume_on_device(/*pretend=*/true);
}

TEST_CASE("CheckpointManager: exact resume in a new process on cuda:0 (dropout, AdamW, warmup-cosine, fp16 "
          "GradScaler, accumulation, shuffled sampler)",
          "[checkpoint][resume][gpu]") {
  EMBER_REQUIRE_GPU();
  check_exact_resume_on_device(/*pretend=*/false);
}
