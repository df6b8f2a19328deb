#pragma once
// The training run that the exact-resume tests of train::CheckpointManager stop and resume
// (test_checkpoint_manager.cpp on the CPU with save; test_checkpoint_manager_gpu.cpp on cuda:0 with
// save_async): dropout, AdamW, warmup-cosine, an fp16 GradScaler, gradient accumulation and a
// shuffled sampler, so that every piece of state a checkpoint holds changes the result. Each run
// is a process of its own (child_process.hpp): the child calls training_run_from_env, the parent
// check_exact_resume.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ember/ember.hpp"
#include "ember/data/distributed_sampler.hpp"
#include "ember/train/accumulate.hpp"
#include "ember/train/checkpoint_manager.hpp"
#include "child_process.hpp"
#include "test_util.hpp"

namespace ember::testing::resume {

struct Mlp : nn::ModuleBase<Mlp> {
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::Dropout> drop;
  Mlp() {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(6, 16));
    drop = register_module("drop", std::make_shared<nn::Dropout>(0.25));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 3));
  }
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    return (*fc2)(relu((*drop)((*fc1)(x))));
  }
};

inline constexpr int64_t kSamples = 36, kMicro = 3, kAccum = 2, kTotalSteps = 14;

// What differs between the CPU and the device run.
struct RunOptions {
  Device device = Device::cpu();
  bool save_async = false;  // save_async (then wait() at the end) instead of save
};

// Runs optimizer steps [first, last) of one training run on o.device, from scratch (first == 0)
// or from the newest checkpoint in dir; saves a checkpoint after step `save_after` (if in
// range); writes the losses of the steps it ran, the final parameters and optimizer state to
// `results`.
inline void training_run(const RunOptions& o, const std::filesystem::path& dir, int64_t last, int64_t save_after,
                         bool resume, const std::filesystem::path& results) {
  const Device d = o.device;
  manual_seed(1234);
  Mlp model;
  if (!d.is_cpu()) model.to(d);
  optim::AdamW opt(model.parameters(), {.lr = 3e-2, .weight_decay = 0.1});
  optim::WarmupCosineLR sched(opt, {.warmup_steps = 3, .total_steps = kTotalSteps, .min_lr = 1e-3});
  amp::GradScaler scaler({.init_scale = 1024.0, .growth_interval = 3});
  train::GradientAccumulator acc(kAccum);
  data::DistributedSampler sampler(kSamples, 1, 0, {.shuffle = true, .seed = 77});
  train::CheckpointManager ckpt(dir, {.keep_last = 2});
  train::CheckpointTargets targets{.model = &model, .optimizer = &opt, .scheduler = &sched, .scaler = &scaler};

  std::vector<float> X(kSamples * 6), Y(kSamples * 3);
  for (int64_t i = 0; i < kSamples * 6; ++i) X[i] = static_cast<float>(std::sin(0.37 * i));
  for (int64_t i = 0; i < kSamples * 3; ++i) Y[i] = static_cast<float>(std::cos(0.11 * i));

  int64_t step = 0, pos = 0;
  if (resume) {
    auto r = ckpt.load_latest(targets);
    REQUIRE(r.has_value());
    step = r->step;
    pos = train::sampler_position_from(r->data, &sampler).index;
  }
  std::vector<int64_t> order = sampler.indices();
  std::vector<float> losses;
  model.train();
  for (; step < last; ++step) {
    for (int m = 0; m < kAccum; ++m) {
      if (pos + kMicro > static_cast<int64_t>(order.size())) {
        sampler.set_epoch(sampler.epoch() + 1);
        order = sampler.indices();
        pos = 0;
      }
      std::vector<float> xb, yb;
      for (int64_t k = 0; k < kMicro; ++k) {
        const int64_t s = order[static_cast<size_t>(pos + k)];
        xb.insert(xb.end(), X.begin() + s * 6, X.begin() + s * 6 + 6);
        yb.insert(yb.end(), Y.begin() + s * 3, Y.begin() + s * 3 + 3);
      }
      pos += kMicro;
      // to(d) of a tensor already on d is the tensor itself: the CPU run copies nothing.
      auto x = Tensor<float>::from_vector(xb, {kMicro, 6}).to(d).to<half>();
      auto y = Tensor<float>::from_vector(yb, {kMicro, 3}).to(d);
      auto loss = acc.scale_loss(nn::functional::mse_loss(model(x), y));
      losses.push_back(loss.item());
      scaler.scale(loss).backward();
      if (acc.sync_step()) {
        scaler.step(opt);
        scaler.update();
        opt.zero_grad();
        sched.step();
      }
    }
    if (step + 1 == save_after) {
      const train::CheckpointExtras extra{.epoch = static_cast<int64_t>(sampler.epoch()),
                                          .data = train::sampler_position(sampler, pos)};
      if (o.save_async)
        ckpt.save_async(step + 1, targets, extra);
      else
        ckpt.save(step + 1, targets, extra);
    }
  }
  if (o.save_async) ckpt.wait();
  io::TensorList out;
  out.emplace_back("losses", Tensor<float>::from_vector(losses, {static_cast<int64_t>(losses.size())}));
  for (auto& [k, v] : model.state_dict()) out.emplace_back("model." + k, v);
  for (auto& [i, st] : opt.state_dict().state)
    for (auto& [k, v] : st) out.emplace_back("opt." + std::to_string(i) + "." + k, v);
  out.emplace_back("scale", Tensor<double>::scalar(scaler.get_scale()));
  out.emplace_back("lr", Tensor<double>::scalar(opt.param_groups()[0].lr()));
  out.emplace_back("gen", Tensor<int64_t>::from_vector({static_cast<int64_t>(default_generator().offset())}, {1}));
  io::save_file(results, out);
}

// training_run in a child process, its arguments from the variables the parent's run sets:
// EMBER_CKPT_DIR, _LAST, _SAVE, _RESUME (1 or 0) and _RESULTS.
inline void training_run_from_env(const RunOptions& o) {
  training_run(o, env("EMBER_CKPT_DIR"), std::stoll(env("EMBER_CKPT_LAST")), std::stoll(env("EMBER_CKPT_SAVE")),
               env("EMBER_CKPT_RESUME") == "1", env("EMBER_CKPT_RESULTS"));
}

// N steps straight, then k steps and a save, then a new process that resumes for N - k steps:
// every loss, parameter and optimizer state tensor bitwise equal. Each run is the hidden test case
// `child_test` of this executable (which calls training_run_from_env) in a child process, with
// `extra_vars` in its environment too, checkpoints in dir / "ck" and its results in dir;
// check_output(out) sees what the child printed, once its exit status is 0.
template <class CheckOutput>
void check_exact_resume(const std::filesystem::path& dir, const std::string& child_test,
                        const std::vector<std::string>& extra_vars, CheckOutput&& check_output) {
  const std::string d = (dir / "ck").string();
  const std::string log = (dir / "log.txt").string();
  std::string out;
  auto run = [&](int64_t last, int64_t save, bool resume, const std::string& results) {
    std::vector<std::string> vars{"EMBER_CKPT_DIR=" + d, "EMBER_CKPT_LAST=" + std::to_string(last),
                                  "EMBER_CKPT_SAVE=" + std::to_string(save),
                                  std::string("EMBER_CKPT_RESUME=") + (resume ? "1" : "0"),
                                  "EMBER_CKPT_RESULTS=" + (dir / results).string()};
    vars.insert(vars.end(), extra_vars.begin(), extra_vars.end());
    int rc = run_child(child_test, vars, log, &out);
    INFO(out);
    REQUIRE(rc == 0);
    check_output(out);
  };
  const int64_t k = 8;  // mid-epoch: 6 micro-batches of 3 per epoch of 36, 2 per step
  run(kTotalSteps, -1, false, "straight.safetensors");
  std::filesystem::remove_all(d);
  run(k, k, false, "first.safetensors");
  run(kTotalSteps, -1, true, "resumed.safetensors");
  io::TensorList straight = io::load_file(dir / "straight.safetensors");
  io::TensorList first = io::load_file(dir / "first.safetensors");
  io::TensorList resumed = io::load_file(dir / "resumed.safetensors");
  REQUIRE(straight.size() == resumed.size());
  // Every loss bitwise: the first k steps in the first run, the rest in the resumed one.
  std::vector<float> ls = Tensor<float>(straight[0].second).to_vector();
  std::vector<float> l1 = Tensor<float>(first[0].second).to_vector();
  std::vector<float> l2 = Tensor<float>(resumed[0].second).to_vector();
  REQUIRE(ls.size() == static_cast<size_t>(kTotalSteps * kAccum));
  REQUIRE(l1.size() + l2.size() == ls.size());
  l1.insert(l1.end(), l2.begin(), l2.end());
  CHECK(std::memcmp(l1.data(), ls.data(), ls.size() * sizeof(float)) == 0);
  for (size_t i = 1; i < straight.size(); ++i) {
    INFO(straight[i].first);
    CHECK(straight[i].first == resumed[i].first);
    CHECK(testing::same_bytes(straight[i].second, resumed[i].second));
  }
  // The run was not trivial: the scaler skipped or grew, and the lr moved.
  CHECK(Tensor<double>(io::SafetensorsFile(dir / "straight.safetensors").get("scale")).item() != 1024.0);
}

}  // namespace ember::testing::resume
