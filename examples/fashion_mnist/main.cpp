// fashion_mnist: a CNN of conv-BN-ReLU blocks trained on Fashion-MNIST (real data: Debian's
// dataset-fashion-mnist, IDX gzip files under /usr/share/datasets/fashion-mnist, or the folder in
// EMBER_FASHION_MNIST_DIR) through data::DataLoader with worker threads and augmentation (random
// flip by default; --augment 2 adds a random crop with 2 pixels of padding), on the GPU when there is one.
//
//   fashion_mnist [--device auto|cpu|cuda:N] [--epochs 5] [--batch-size 64] [--lr 0.003]
//                 [--workers 2] [--train-subset 0] [--test-subset 0] [--augment 1] [--width 16] [--seed 0]
//                 [--save PATH] [--load PATH] [--profile trace.json] [--log-dir runs/fashion_mnist]
//                 (the last two: examples/common/observe.hpp, docs/profiling.md)
//
// --save writes the trained weights (safetensors); --load starts from such a file (--epochs 0:
// only evaluates it).
//
// Model: conv3x3(c) BN ReLU maxpool -> conv3x3(2c) BN ReLU maxpool -> linear(49*2c -> 10);
// Adam with a one-cycle learning rate per step, cross-entropy. Prints progress, then one JSON line
// with the test accuracy, the wall time and the loader's total data wait.
#include <cstdio>
#include <fstream>

#include <ember/data/dataloader.hpp>
#include <ember/data/idx.hpp>
#include <ember/data/transforms.hpp>
#include <ember/ember.hpp>

#include "../common/args.hpp"
#include "../common/observe.hpp"
#include "../common/progress.hpp"

using namespace ember;

namespace {

std::shared_ptr<nn::Sequential> make_model(int64_t c) {
  auto m = std::make_shared<nn::Sequential>();
  auto block = [&](int64_t in, int64_t out) {
    m->emplace<nn::Conv2d>(in, out, 3, nn::Conv2dOptions{.padding = {1, 1}, .bias = false});
    m->emplace<nn::BatchNorm2d>(out);
    m->emplace<nn::ReLU>();
  };
  block(1, c);
  m->emplace<nn::MaxPool2d>(2);  // 28 -> 14
  block(c, 2 * c);
  m->emplace<nn::MaxPool2d>(2);  // 14 -> 7
  m->emplace<nn::Flatten>();
  m->emplace<nn::Linear>(2 * c * 7 * 7, 10);
  return m;
}

// The first n examples of a dataset (n = 0: all).
class Prefix : public data::Dataset {
 public:
  Prefix(const data::Dataset& base, int64_t n) : base_(base), n_(n > 0 && n < base.size() ? n : base.size()) {}
  int64_t size() const override { return n_; }
  data::Example get(int64_t i) const override {
    check_index(i);
    return base_.get(i);
  }
  std::string name() const override { return base_.name(); }

 private:
  const data::Dataset& base_;
  int64_t n_;
};

}  // namespace

int main(int argc, char** argv) try {
  examples::Args args(argc, argv, examples::with_observe_flags(
                      {{"device", "auto"}, {"epochs", "5"}, {"batch-size", "64"}, {"lr", "0.003"}, {"workers", "2"},
                       {"train-subset", "0"}, {"test-subset", "0"}, {"augment", "1"}, {"width", "16"}, {"seed", "0"},
                       {"load", ""}}));
  const Device dev = args.device();
  const int64_t epochs = args.integer("epochs"), batch = args.integer("batch-size");
  const uint64_t seed = static_cast<uint64_t>(args.integer("seed"));
  const int workers = static_cast<int>(args.integer("workers"));

  if (!std::ifstream(data::fashion_mnist_dir() + "/train-images-idx3-ubyte.gz")) {
    std::fprintf(stderr, "fashion_mnist: Fashion-MNIST not found in %s (install dataset-fashion-mnist, or set "
                 "EMBER_FASHION_MNIST_DIR)\n", data::fashion_mnist_dir().c_str());
    return 1;
  }
  data::IdxDataset train_all = data::fashion_mnist("train"), test_all = data::fashion_mnist("test");
  Prefix train(train_all, args.integer("train-subset")), test(test_all, args.integer("test-subset"));

  // Fashion-MNIST's pixel mean and standard deviation (over the training set, in [0, 1]).
  const data::Normalize normalize{{0.2860f}, {0.3530f}};
  // --augment 0: none; 1: horizontal flip; 2: flip and a random 28x28 crop of the image padded by 2.
  const int64_t augment = args.integer("augment");
  data::Transform train_tf = data::Compose({data::ToFloat{}, normalize});
  if (augment == 1) train_tf = data::Compose({data::ToFloat{}, data::RandomHorizontalFlip{0.5}, normalize});
  if (augment >= 2)
    train_tf = data::Compose({data::ToFloat{}, data::RandomCrop{28, 28, 2}, data::RandomHorizontalFlip{0.5}, normalize});
  data::DataLoader train_loader(train, {.batch_size = batch, .shuffle = true, .seed = seed, .drop_last = true,
                                        .num_workers = workers, .device = dev, .transform = train_tf});
  data::DataLoader test_loader(test, {.batch_size = 500, .num_workers = workers, .device = dev,
                                      .transform = data::Compose({data::ToFloat{}, normalize})});

  manual_seed(seed);
  auto model = make_model(args.integer("width"));
  if (!args.str("load").empty()) model->load(args.str("load"));
  model->to(dev);
  optim::Adam opt(model->parameters(), {.lr = args.real("lr")});
  optim::OneCycleLR schedule(opt, {.max_lr = args.real("lr"), .total_steps = std::max<int64_t>(1, epochs * train_loader.num_batches()),
                                   .pct_start = 0.2, .cycle_momentum = false});

  examples::Observe observe(args, {{"example", std::string("fashion_mnist")}, {"device", dev.str()},
                                   {"epochs", static_cast<double>(epochs)}, {"batch_size", static_cast<double>(batch)},
                                   {"lr", args.real("lr")}, {"workers", static_cast<double>(workers)},
                                   {"augment", static_cast<double>(augment)}, {"seed", static_cast<double>(seed)}});
  examples::Progress progress;
  double last_loss = 0;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    double epoch_loss = 0;
    int64_t batches = 0;
    for (data::Batch& b : train_loader) {
      auto loss = nn::functional::cross_entropy((*model)(b.get<float>("image")), b.get<int64_t>("label"));
      opt.zero_grad();
      loss.backward();
      opt.step();
      schedule.step();
      last_loss = loss.item();
      epoch_loss += last_loss;
      ++batches;
      progress.step(epoch, epochs, ++step, last_loss, static_cast<int64_t>(b.indices.size()));
      observe.step(step, last_loss, static_cast<int64_t>(b.indices.size()), opt.param_groups()[0].lr());
    }
    progress.epoch(epoch, epochs, "loss " + examples::num(epoch_loss / static_cast<double>(std::max<int64_t>(1, batches)), 4));
  }
  progress.finish();
  observe.finish(step);
  const double seconds = progress.seconds();
  args.save_model(*model);

  int64_t correct = 0, seen = 0;
  {
    NoGradGuard no_grad;
    model->eval();
    for (data::Batch& b : test_loader) {
      auto pred = argmax((*model)(b.get<float>("image")), {1});
      correct += sum(eq(pred, b.get<int64_t>("label")).to<int64_t>()).item();
      seen += static_cast<int64_t>(b.indices.size());
    }
  }
  const double acc = static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(1, seen));
  std::printf("%s\n", examples::json_line({{"example", examples::quoted("fashion_mnist")},
                                           {"device", examples::quoted(dev.str())},
                                           {"epochs", std::to_string(epochs)},
                                           {"train_samples", std::to_string(train.size())},
                                           {"test_samples", std::to_string(seen)},
                                           {"workers", std::to_string(workers)},
                                           {"parameters", std::to_string(model->parameter_count())},
                                           {"final_train_loss", examples::num(last_loss)},
                                           {"test_accuracy", examples::num(acc, 4)},
                                           {"train_seconds", examples::num(seconds, 4)},
                                           {"data_wait_seconds", examples::num(train_loader.total_wait_seconds(), 4)},
                                           {"samples_per_second", examples::num(progress.samples_per_second(), 6)}})
                          .c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
  return 1;
}
