// digits_cnn: a small convolutional network trained on the scikit-learn handwritten digits (real
// data shipped by Debian's python3-sklearn), on the GPU when there is one, else on the CPU.
//
//   digits_cnn [--device auto|cpu|cuda:N] [--epochs 20] [--batch-size 32] [--lr 0.002] [--seed 0]
//              [--save model.safetensors] [--checkpoint-dir DIR [--checkpoint-every 5] [--resume 1]]
//              [--profile trace.json] [--log-dir runs/digits_cnn]   (examples/common/observe.hpp)
//
// --checkpoint-dir: a checkpoint (model, Adam state, schedule, generator, epoch) every
// --checkpoint-every epochs, written in the background (train::CheckpointManager::save_async);
// --resume 1 continues from the newest complete checkpoint there, exactly where it stopped.
//
// Conv(1->32, 3x3) ReLU MaxPool -> Conv(32->64, 3x3) ReLU MaxPool -> Linear(256 -> 10), Adam,
// cross-entropy, cosine learning-rate decay per step, an 80/20 split with a fixed seed. Prints a progress line, then one JSON line.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <optional>

#include <ember/ember.hpp>

#include "../common/args.hpp"
#include "../common/digits.hpp"
#include "../common/digits_cnn_model.hpp"
#include "../common/observe.hpp"
#include "../common/progress.hpp"

using namespace ember;

int main(int argc, char** argv) try {
  examples::Args args(argc, argv,
                      examples::with_observe_flags({{"device", "auto"}, {"epochs", "20"}, {"batch-size", "32"},
                                                    {"lr", "0.002"}, {"seed", "0"}, {"checkpoint-dir", ""},
                                                    {"checkpoint-every", "5"}, {"resume", "0"}}));
  const Device dev = args.device();
  const int64_t epochs = args.integer("epochs"), batch = args.integer("batch-size");
  const uint64_t seed = static_cast<uint64_t>(args.integer("seed"));

  examples::Digits all = examples::load_digits(), train, test;
  examples::split_digits(all, 0.2, seed, train, test);
  auto x_train = Tensor<float>::from_vector(train.pixels, {train.n, 1, 8, 8}, dev);
  auto y_train = Tensor<int64_t>::from_vector(train.labels, {train.n}, dev);
  auto x_test = Tensor<float>::from_vector(test.pixels, {test.n, 1, 8, 8}, dev);
  auto y_test = Tensor<int64_t>::from_vector(test.labels, {test.n}, dev);

  manual_seed(seed);
  auto model = examples::make_digits_cnn();
  model->to(dev);
  optim::Adam opt(model->parameters(), {.lr = args.real("lr")});
  const int64_t steps_per_epoch = (train.n + batch - 1) / batch;
  optim::CosineAnnealingLR schedule(opt, epochs * steps_per_epoch);  // per step, down to 0

  examples::Observe observe(args, {{"example", std::string("digits_cnn")}, {"device", dev.str()},
                                   {"epochs", static_cast<double>(epochs)}, {"batch_size", static_cast<double>(batch)},
                                   {"lr", args.real("lr")}, {"seed", static_cast<double>(seed)}});
  examples::Progress progress;
  double last_loss = 0;
  int64_t step = 0, first_epoch = 0;
  std::optional<train::CheckpointManager> ckpt;
  const train::CheckpointTargets targets{.model = model.get(), .optimizer = &opt, .scheduler = &schedule};
  if (!args.str("checkpoint-dir").empty()) {
    ckpt.emplace(args.str("checkpoint-dir"), train::CheckpointOptions{.keep_last = 2});
    if (args.integer("resume") != 0) {
      if (auto r = ckpt->load_latest(targets)) {
        step = r->step;
        first_epoch = r->epoch;
        std::fprintf(stderr, "resumed from %s: epoch %lld, step %lld\n", r->path.c_str(),
                     static_cast<long long>(first_epoch), static_cast<long long>(step));
      }
    }
  }
  for (int64_t epoch = first_epoch; epoch < epochs; ++epoch) {
    // A fresh permutation of the training set each epoch, from (seed, epoch).
    data::DistributedSampler sampler(train.n, 1, 0, {.seed = seed});
    sampler.set_epoch(static_cast<uint64_t>(epoch));
    std::vector<int64_t> order = sampler.indices();
    auto perm = Tensor<int64_t>::from_vector(order, dev);
    double epoch_loss = 0;
    int64_t batches = 0;
    for (int64_t b0 = 0; b0 < train.n; b0 += batch) {
      auto idx = perm.slice(b0, std::min(train.n, b0 + batch));
      Tensor<float> xb;
      Tensor<int64_t> yb;
      {
        trace::PhaseScope data(trace::Phase::DataWait);  // the batch's gather is this example's data loading
        xb = index_select(x_train, 0, idx);
        yb = index_select(y_train, 0, idx);
      }
      auto loss = nn::functional::cross_entropy((*model)(xb), yb);
      opt.zero_grad();
      loss.backward();
      opt.step();
      schedule.step();
      last_loss = loss.item();
      epoch_loss += last_loss;
      ++batches;
      progress.step(epoch, epochs, ++step, last_loss, idx.numel());
      observe.step(step, last_loss, idx.numel(), opt.param_groups()[0].lr());
    }
    progress.epoch(epoch, epochs, "loss " + examples::num(epoch_loss / static_cast<double>(batches), 4), 5);
    if (ckpt && (epoch + 1) % std::max<int64_t>(1, args.integer("checkpoint-every")) == 0)
      ckpt->save_async(step, targets, {.epoch = epoch + 1});  // training goes on while it writes
  }
  if (ckpt) ckpt->wait();
  progress.finish();
  observe.finish(step);
  const double seconds = progress.seconds();
  const double acc = examples::accuracy(*model, x_test, y_test);
  std::printf("%s\n", examples::json_line({{"example", examples::quoted("digits_cnn")},
                                           {"device", examples::quoted(dev.str())},
                                           {"epochs", std::to_string(epochs)},
                                           {"parameters", std::to_string(model->parameter_count())},
                                           {"final_train_loss", examples::num(last_loss)},
                                           {"test_accuracy", examples::num(acc, 4)},
                                           {"seconds", examples::num(seconds, 4)},
                                           {"samples_per_second", examples::num(progress.samples_per_second(), 6)}})
                          .c_str());
  args.save_model(*model);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "digits_cnn: %s\n", e.what());
  return 1;
}
