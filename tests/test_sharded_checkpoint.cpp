// Sharded checkpoints of FullyShardedDataParallel (dist/sharded_checkpoint.hpp) with
// ThreadProcessGroup ranks: bitwise round trips, exact AdamW resumption, resharding to another
// world size, consolidation into Module::save's file, damaged and foreign checkpoints. The rank
// threads record values; the test thread checks them after join (Catch2 is not thread-safe).
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <random>
#include <thread>

#include "ember/dist/fsdp.hpp"
#include "ember/dist/sharded_checkpoint.hpp"
#include "ember/dist/thread_group.hpp"
#include "thread_ranks.hpp"
#include "ember/ember.hpp"

using namespace ember;
namespace fs = std::filesystem;

namespace {

template <class Fn>
void run_ranks(int world, Fn fn) {
  testing::run_thread_ranks(world, std::move(fn));
}

// Three Linear units, a root unit (the output scale `gain`) and a buffer (`shift`, replicated).
struct Net : nn::ModuleBase<Net> {
  std::shared_ptr<nn::Sequential> body;
  AnyTensor gain, shift;
  explicit Net(int64_t hidden = 16) {
    body = register_module("body", std::make_shared<nn::Sequential>(
                                       std::make_shared<nn::Linear>(6, hidden), std::make_shared<nn::Tanh>(),
                                       std::make_shared<nn::Linear>(hidden, 15), std::make_shared<nn::Tanh>(),
                                       std::make_shared<nn::Linear>(15, 3)));
    gain = register_parameter("gain", Tensor<float>::from_vector({1.0f, 0.5f, 2.0f}));
    shift = register_buffer("shift", Tensor<float>::from_vector({0.1f, -0.2f, 0.3f}));
  }
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    return Tensor<T>(op::add(op::mul((*body)(x), gain), shift));
  }
};

std::shared_ptr<Net> make_net(uint64_t seed, int64_t hidden = 16) {
  auto m = std::make_shared<Net>(hidden);
  Generator gen(seed);
  NoGradGuard no_grad;
  for (auto& [n, p] : m->named_parameters()) {
    AnyTensor t = p;
    nn::init::uniform_(t, -0.5, 0.5, gen);
  }
  return m;
}

constexpr int64_t kGlobalBatch = 12;

// This rank's rows of the global batch of `step` (12 rows, split evenly over the world).
std::pair<Tensor<float>, Tensor<float>> batch(int64_t step, int rank, int world) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * step + 1));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x, y;
  for (int64_t i = 0; i < kGlobalBatch * 6; ++i) x.push_back(u(rng));
  for (int64_t i = 0; i < kGlobalBatch * 3; ++i) y.push_back(u(rng));
  const int64_t b = kGlobalBatch / world;
  std::vector<float> xs(x.begin() + rank * b * 6, x.begin() + (rank + 1) * b * 6);
  std::vector<float> ys(y.begin() + rank * b * 3, y.begin() + (rank + 1) * b * 3);
  return {Tensor<float>::from_vector(xs, {b, 6}), Tensor<float>::from_vector(ys, {b, 3})};
}

bool same_bytes(const AnyTensor& a, const AnyTensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0);
}

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) {
    path = fs::temp_directory_path() / ("ember_sharded_ckpt_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

struct Plan {
  int world = 4;
  int stage = 3;
  int64_t begin = 0, end = 8;  // the steps to run (begin > 0: resume from the latest checkpoint)
  std::vector<int64_t> save_at;  // save after these steps
  fs::path dir;
  std::function<void(const std::string&)> warn;
};

struct Run {
  std::vector<double> losses;                  // the mean over ranks, per step run
  nn::StateDict saved_full, loaded_full, final_full;  // full_state_dict at the last save / after load / at the end
  std::vector<std::vector<AnyTensor>> saved_shards, loaded_shards;  // [rank][unit]
  std::vector<optim::OptimizerStateDict> saved_opt, loaded_opt;     // [rank]
  int64_t loaded_step = -1, loaded_world = 0;
  double lr_after_load = 0;
};

// Trains Net with AdamW and a StepLR over FSDP; every rank's loss is averaged into Run::losses.
Run train(const Plan& p) {
  Run res;
  const size_t W = static_cast<size_t>(p.world);
  std::vector<std::vector<double>> losses(W);
  res.saved_shards.resize(W);
  res.loaded_shards.resize(W);
  res.saved_opt.resize(W);
  res.loaded_opt.resize(W);
  run_ranks(p.world, [&](int r, dist::ProcessGroup& g) {
    auto net = make_net(p.begin > 0 ? 99 : 3);  // a resumed run starts from other values
    dist::FullyShardedDataParallel fsdp(net, g, {.stage = p.stage, .units = {"body.0", "body.2", "body.4"}});
    optim::AdamW opt(fsdp.parameters(), {.lr = 1e-2, .weight_decay = 0.01});
    optim::StepLR sched(opt, 3, 0.5);
    dist::ShardedCheckpointManager ckpt(p.dir, g, {.keep_last = 3, .warn = p.warn});
    dist::ShardedCheckpointTargets t{.fsdp = &fsdp, .optimizer = &opt, .scheduler = &sched};
    const size_t ri = static_cast<size_t>(r);
    if (p.begin > 0) {
      auto loaded = ckpt.load_latest(t);
      if (!loaded) throw std::runtime_error("no checkpoint to resume from");
      if (r == 0) {
        res.loaded_step = loaded->step;
        res.loaded_world = loaded->saved_world;
        res.lr_after_load = opt.param_groups()[0].options.at("lr");
      }
      for (size_t i = 0; i < fsdp.unit_count(); ++i) res.loaded_shards[ri].push_back(fsdp.shard(i).detach().clone());
      res.loaded_opt[ri] = opt.state_dict();
      auto full = fsdp.full_state_dict();
      if (r == 0) res.loaded_full = full;
    }
    for (int64_t s = p.begin; s < p.end; ++s) {
      auto [x, y] = batch(s, r, p.world);
      opt.zero_grad();
      auto loss = nn::functional::mse_loss(fsdp(x), y);
      losses[ri].push_back(loss.item());
      loss.backward();
      opt.step();
      sched.step();
      if (std::find(p.save_at.begin(), p.save_at.end(), s + 1) != p.save_at.end()) {
        ckpt.save(s + 1, t, {.epoch = 0, .data = {{"step", s + 1}}});
        res.saved_shards[ri].clear();
        for (size_t i = 0; i < fsdp.unit_count(); ++i) res.saved_shards[ri].push_back(fsdp.shard(i).detach().clone());
        res.saved_opt[ri] = opt.state_dict();
        auto full = fsdp.full_state_dict();
        if (r == 0) res.saved_full = full;
      }
    }
    auto full = fsdp.full_state_dict();
    if (r == 0) res.final_full = full;
  });
  for (size_t s = 0; s < losses[0].size(); ++s) {
    double sum = 0;
    for (size_t r = 0; r < W; ++r) sum += losses[r][s];
    res.losses.push_back(sum / static_cast<double>(W));
  }
  return res;
}

double rel_diff(double a, double b) { return std::abs(a - b) / std::max(1.0, std::max(std::abs(a), std::abs(b))); }

void check_same_state(const nn::StateDict& a, const nn::StateDict& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    CHECK(a[i].first == b[i].first);
    CHECK(same_bytes(a[i].second, b[i].second));
  }
}

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("sharded checkpoint: bitwise round trip and exact AdamW resumption, stage 2 and 3", "[sharded_checkpoint]") {
  for (int stage : {2, 3}) {
    INFO("stage " << stage);
    TempDir dir("roundtrip" + std::to_string(stage));
    const Run straight = train({.world = 4, .stage = stage, .dir = dir.path / "straight"});
    const Run first = train({.world = 4, .stage = stage, .end = 4, .save_at = {2, 4}, .dir = dir.path / "a"});
    const Run resumed = train({.world = 4, .stage = stage, .begin = 4, .end = 8, .dir = dir.path / "a"});
    CHECK(resumed.loaded_step == 4);
    CHECK(resumed.loaded_world == 4);
    CHECK(resumed.lr_after_load == Approx(1e-2 * 0.5));  // StepLR(3, 0.5) after 4 steps
    for (size_t r = 0; r < 4; ++r) {
      REQUIRE(resumed.loaded_shards[r].size() == first.saved_shards[r].size());
      for (size_t i = 0; i < first.saved_shards[r].size(); ++i)
        CHECK(same_bytes(resumed.loaded_shards[r][i], first.saved_shards[r][i]));
      const auto& a = first.saved_opt[r].state;
      const auto& b = resumed.loaded_opt[r].state;
      REQUIRE(a.size() == b.size());
      for (const auto& [idx, st] : a)
        for (size_t k = 0; k < st.size(); ++k) {
          INFO("rank " << r << " state." << idx << "." << st[k].first);
          CHECK(same_bytes(st[k].second, b.at(idx)[k].second));
        }
    }
    check_same_state(resumed.loaded_full, first.saved_full);
    // The resumed run continues with the uninterrupted run's losses and ends at its parameters.
    std::vector<double> losses = first.losses;
    losses.insert(losses.end(), resumed.losses.begin(), resumed.losses.end());
    REQUIRE(losses.size() == straight.losses.size());
    for (size_t s = 0; s < losses.size(); ++s) {
      INFO("step " << s);
      CHECK(losses[s] == straight.losses[s]);  // same world, same reduction order: bitwise
    }
    check_same_state(resumed.final_full, straight.final_full);
  }
}

TEST_CASE("sharded checkpoint: resharding 4 -> 2, 4 -> 3 and 2 -> 4 ranks continues the saved run", "[sharded_checkpoint]") {
  for (auto [from, to] : {std::pair{4, 2}, std::pair{4, 3}, std::pair{2, 4}}) {
    for (int stage : {3, 2}) {
      if (stage == 2 && from == 2) continue;  // stage 2: 4 -> 2 and 4 -> 3
      INFO(from << " -> " << to << " ranks, stage " << stage);
      TempDir dir("reshard");
      const Run straight = train({.world = from, .stage = stage, .dir = dir.path / "straight"});
      const Run first = train({.world = from, .stage = stage, .end = 4, .save_at = {4}, .dir = dir.path / "a"});
      const Run resumed = train({.world = to, .stage = stage, .begin = 4, .end = 8, .dir = dir.path / "a"});
      CHECK(resumed.loaded_world == from);
      // The parameters are cut and re-padded, not computed: bitwise the saved ones.
      check_same_state(resumed.loaded_full, first.saved_full);
      // The optimizer's elementwise state is resharded alike: its concatenation over the new ranks
      // (the first N elements) is the old ranks' concatenation; step counts are taken as they are.
      for (const auto& [idx, st] : first.saved_opt[0].state)
        for (size_t k = 0; k < st.size(); ++k) {
          auto cat = [&](const std::vector<optim::OptimizerStateDict>& per_rank) {
            std::vector<double> v;
            for (const auto& sd : per_rank) {
              auto part = sd.state.at(idx)[k].second.to_double_vector();
              v.insert(v.end(), part.begin(), part.end());
            }
            return v;
          };
          std::vector<double> a = cat(first.saved_opt), b = cat(resumed.loaded_opt);
          INFO("state." << idx << "." << st[k].first);
          if (st[k].second.dim() == 0) {
            CHECK(b[0] == a[0]);
          } else {
            const size_t n = std::min(a.size(), b.size());
            CHECK(std::equal(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n), b.begin()));
            CHECK(std::all_of(a.begin() + static_cast<std::ptrdiff_t>(n), a.end(), [](double v) { return v == 0; }));
            CHECK(std::all_of(b.begin() + static_cast<std::ptrdiff_t>(n), b.end(), [](double v) { return v == 0; }));
          }
        }
      // The mean loss over the new ranks follows the saved world's run; only the summation order
      // of the gradient average differs (a few float32 ulps).
      REQUIRE(resumed.losses.size() == 4);
      double worst = 0;
      for (size_t s = 0; s < 4; ++s) worst = std::max(worst, rel_diff(resumed.losses[s], straight.losses[4 + s]));
      INFO("worst relative loss difference " << worst);
      CHECK(worst < 1e-6);
    }
  }
}

TEST_CASE("sharded checkpoint: consolidation writes Module::save's file of the unwrapped model", "[sharded_checkpoint]") {
  TempDir dir("consolidate");
  const Run first = train({.world = 3, .stage = 3, .end = 3, .save_at = {3}, .dir = dir.path / "a"});
  const fs::path out = dir.path / "model.safetensors";
  dist::consolidate_sharded_checkpoint(dir.path / "a" / "step-3", out);
  // An unwrapped model with the values of full_state_dict, saved by Module::save: the same bytes.
  auto plain = make_net(5);
  plain->load_state_dict(first.saved_full);
  const fs::path ref = dir.path / "plain.safetensors";
  plain->save(ref.string());
  CHECK(file_bytes(out) == file_bytes(ref));
  io::TensorList got = io::load_file(out.string());
  auto names = make_net(1)->state_dict();
  REQUIRE(got.size() == names.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].first == names[i].first);
    CHECK(same_bytes(got[i].second, first.saved_full[i].second));
  }
  // A damaged folder is refused, naming the file.
  {
    std::fstream f(dir.path / "a" / "step-3" / "params.rank2.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  CHECK_THROWS_WITH(dist::consolidate_sharded_checkpoint(dir.path / "a" / "step-3", dir.path / "x.safetensors"),
                    Catch::Contains("params.rank2.safetensors fails its CRC32 check"));
}

TEST_CASE("sharded checkpoint: a damaged shard is skipped with a warning, stale temporaries are removed", "[sharded_checkpoint]") {
  TempDir dir("damaged");
  train({.world = 2, .stage = 3, .end = 4, .save_at = {2, 4}, .dir = dir.path});
  REQUIRE(fs::exists(dir.path / "step-4" / "params.rank1.safetensors"));
  {
    std::fstream f(dir.path / "step-4" / "optimizer.rank1.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x55');
  }
  const fs::path stale = dir.path / ".tmp-step-6-999999999-0";  // no such process
  fs::create_directories(stale);
  std::mutex mu;
  std::vector<std::string> warnings;
  const Run resumed = train({.world = 2, .stage = 3, .begin = 2, .end = 3, .dir = dir.path, .warn = [&](const std::string& m) {
                               std::lock_guard<std::mutex> lock(mu);
                               warnings.push_back(m);
                             }});
  CHECK(resumed.loaded_step == 2);
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("skipping checkpoint") && Catch::Contains("step-4") &&
                              Catch::Contains("optimizer.rank1.safetensors fails its CRC32 check"));
  CHECK(!fs::exists(stale));
}

TEST_CASE("sharded checkpoint: another model's checkpoint is an error naming the first difference", "[sharded_checkpoint]") {
  TempDir dir("mismatch");
  train({.world = 2, .stage = 3, .end = 1, .save_at = {1}, .dir = dir.path});
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int r, dist::ProcessGroup& g) {
    auto net = make_net(3, /*hidden=*/12);
    dist::FullyShardedDataParallel fsdp(net, g, {.units = {"body.0", "body.2", "body.4"}});
    optim::AdamW opt(fsdp.parameters(), {.lr = 1e-2});
    dist::ShardedCheckpointManager ckpt(dir.path, g);
    try {
      ckpt.load_latest({.fsdp = &fsdp, .optimizer = &opt});
    } catch (const ValueError& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
  });
  for (const auto& e : errors) {
    CHECK_THAT(e, Catch::Contains("was saved from another model") && Catch::Contains("unit 'body.0'") &&
                      Catch::Contains("body.0.weight [16, 6]") && Catch::Contains("body.0.weight [12, 6]"));
  }
}

TEST_CASE("sharded checkpoint: a hand-edited manifest is a FormatError naming it, on load and consolidation",
          "[sharded_checkpoint][errors]") {
  TempDir dir("manifest");
  train({.world = 2, .stage = 3, .end = 2, .save_at = {2}, .dir = dir.path});
  const fs::path state = dir.path / "step-2" / "state.json";
  const std::string original = file_bytes(state);
  auto edit = [&](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json j = nlohmann::json::parse(original);
    change(j["fsdp"]);
    std::ofstream(state, std::ios::trunc) << j.dump();
  };
  auto load_error = [&] {
    try {
      train({.world = 2, .stage = 3, .begin = 2, .end = 2, .dir = dir.path});
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string("no FormatError");
  };
  auto consolidate_error = [&] {
    try {
      dist::consolidate_sharded_checkpoint(dir.path / "step-2", dir.path / "out.safetensors");
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string("no FormatError");
  };
  edit([](nlohmann::json& m) { m["units"][0]["shard_numel"] = 0; });  // would divide by zero
  CHECK_THAT(load_error(), Catch::Contains("shard_numel or world is wrong"));
  CHECK_THAT(consolidate_error(), Catch::Contains("shard_numel or world is wrong"));
  edit([](nlohmann::json& m) { m["world"] = 0; });
  CHECK_THAT(load_error(), Catch::Contains("world size 0 is not a number of ranks"));
  edit([](nlohmann::json& m) { m["world"] = "two"; });
  CHECK_THAT(load_error(), Catch::Contains("does not hold a sharded checkpoint's manifest"));
  CHECK_THAT(consolidate_error(), Catch::Contains("does not hold a sharded checkpoint's manifest"));
  edit([](nlohmann::json& m) { m["units"][0]["params"][0].erase("offset"); });
  CHECK_THAT(consolidate_error(), Catch::Contains("does not hold a sharded checkpoint's manifest"));
  CHECK_FALSE(fs::exists(dir.path / "out.safetensors"));
}
