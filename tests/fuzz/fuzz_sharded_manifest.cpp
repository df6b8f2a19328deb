// libFuzzer target for the manifest of a sharded checkpoint (state.json's "fsdp" object,
// dist/sharded_checkpoint.hpp), which a load and a consolidation trust to cut shards out of the
// saving ranks' files: a real checkpoint of a small two-unit model is written once; each input,
// parsed as JSON, replaces its manifest, and consolidate_sharded_checkpoint and a load into the
// model must either succeed or throw an ember::Error. Nothing crashes, divides by zero, reads out
// of bounds or lets another exception out.
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude \
//     tests/fuzz/fuzz_sharded_manifest.cpp -o /tmp/fz -lz -lpthread && /tmp/fz -max_total_time=60 tests/fuzz/corpus/sharded_manifest
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "ember/dist/sharded_checkpoint.hpp"
#include "ember/dist/thread_group.hpp"
#include "ember/ember.hpp"

namespace {

using namespace ember;
namespace fs = std::filesystem;

struct Fixture {
  fs::path dir;
  std::shared_ptr<nn::Sequential> model;
  std::shared_ptr<dist::ThreadProcessGroup> group;
  std::unique_ptr<dist::FullyShardedDataParallel> fsdp;
  std::unique_ptr<optim::SGD> opt;
  std::unique_ptr<dist::ShardedCheckpointManager> ckpt;
  nlohmann::json state;  // the checkpoint's state.json as written

  Fixture() {
    dir = fs::temp_directory_path() / ("ember-fuzz-manifest-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    model = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(3, 5), std::make_shared<nn::Tanh>(),
                                             std::make_shared<nn::Linear>(5, 2));
    group = dist::ThreadProcessGroup::create(1)[0];
    fsdp = std::make_unique<dist::FullyShardedDataParallel>(model, *group);
    opt = std::make_unique<optim::SGD>(fsdp->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    op::mean(op::square((*fsdp)(AnyTensor(Tensor<float>::ones({2, 3}))))).backward();
    opt->step();
    ckpt = std::make_unique<dist::ShardedCheckpointManager>(dir, *group, dist::ShardedCheckpointOptions{.warn = [](const std::string&) {}});
    ckpt->save(1, {.fsdp = fsdp.get(), .optimizer = opt.get()});
    std::ifstream in(dir / "step-1" / "state.json");
    state = nlohmann::json::parse(in);
  }
  ~Fixture() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture f;
  nlohmann::json manifest = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (manifest.is_discarded()) return 0;  // not JSON: the JSON parser's own business
  nlohmann::json st = f.state;
  st["fsdp"] = manifest;
  {
    std::ofstream out(f.dir / "step-1" / "state.json", std::ios::trunc);
    out << st.dump();
  }
  try {
    dist::consolidate_sharded_checkpoint(f.dir / "step-1", f.dir / "consolidated.safetensors");
  } catch (const ember::Error&) {
  }
  try {
    (void)f.ckpt->load(1, {.fsdp = f.fsdp.get(), .optimizer = f.opt.get()});
  } catch (const ember::Error&) {
  }
  return 0;
}
