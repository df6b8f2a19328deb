#pragma once
// The training run that the exact-resume tests of train::CheckpointManager stop and resume
// (test_checkpoint_manager.cpp on the CPU with save; test_checkpoint_manager_gpu.cpp on cuda:0 with
// save_async): dropout, AdamW, warmup-cosine, an fp16 GradScaler, gradient accumulation and a
// shuffled sampler, so that every piece of state a checkpoint holds changes the result.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ember/ember.hpp"
#include "ember/data/distributed_sampler.hpp"
#include "ember/train/accumulate.hpp"
#include "ember/train/checkpoint_manager.hpp"

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

}  // namespace ember::testing::resume
