// digits_cnn: a small convolutional network trained with train::Trainer on the scikit-learn
// handwritten digits (real data shipped by Debian's python3-sklearn), on the GPU when there is
// one, else on the CPU.
//
//   digits_cnn [--device auto|cpu|cuda:N] [--epochs 20] [--batch-size 32] [--lr 0.002] [--seed 0]
//              [--save model.safetensors] [--checkpoint-dir DIR [--checkpoint-every 5] [--resume 1]]
//              [--profile trace.json] [--log-dir runs/digits_cnn]
//
// --checkpoint-dir: a checkpoint (model, Adam state, schedule, generators, loader position) every
// --checkpoint-every epochs, written in the background (CheckpointPolicy::save_async);
// --resume 1 continues from the newest complete checkpoint there, exactly where it stopped.
// --profile profiles 20 steps after 5 of warm-up (step report, verdict, Chrome trace); --log-dir
// writes TensorBoard logs, metrics.jsonl and metrics.csv (the Trainer's logging).
//
// Conv(1->32, 3x3) ReLU MaxPool -> Conv(32->64, 3x3) ReLU MaxPool -> Linear(256 -> 10), Adam,
// cross-entropy, cosine learning-rate decay per step, an 80/20 split with a fixed seed; the batches
// come from a data::DataLoader over the in-memory tensors. Prints a progress bar, then one JSON line.
#include <cstdio>

#include <ember/ember.hpp>
#include <ember/train/trainer.hpp>

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
  data::TensorDataset train_set({{"image", Tensor<float>::from_vector(train.pixels, {train.n, 1, 8, 8})},
                                 {"label", Tensor<int64_t>::from_vector(train.labels, {train.n})}},
                                "digits_train");
  // A fresh permutation of the training set each epoch, from (seed, epoch); the last batch is partial.
  data::DataLoader train_loader(train_set, {.batch_size = batch, .shuffle = true, .seed = seed, .device = dev});
  auto x_test = Tensor<float>::from_vector(test.pixels, {test.n, 1, 8, 8}, dev);
  auto y_test = Tensor<int64_t>::from_vector(test.labels, {test.n}, dev);

  manual_seed(seed);
  auto model = examples::make_digits_cnn();
  model->to(dev);
  optim::Adam opt(model->parameters(), {.lr = args.real("lr")});
  optim::CosineAnnealingLR schedule(opt, std::max<int64_t>(1, epochs * train_loader.num_batches()));  // per step, down to 0

  train::TrainerOptions to{.epochs = epochs, .scheduler = &schedule, .log_dir = args.str("log-dir"),
                           .hparams = args.hparams()};  // every flag, in hparams.json beside the logs
  if (!args.str("checkpoint-dir").empty())
    to.checkpoint = {.dir = args.str("checkpoint-dir"), .every_epochs = std::max<int64_t>(1, args.integer("checkpoint-every")),
                     .keep_last = 2, .resume = args.integer("resume") != 0, .save_async = true};  // training goes on while it writes
  if (!args.str("profile").empty()) to.profile = {.steps = 20, .start_step = 5, .trace_path = args.str("profile")};
  train::FitResult r = train::Trainer(to).fit(*model, train_loader, opt, train::cross_entropy_loss());
  if (!r.resumed_from.empty())
    std::fprintf(stderr, "resumed from %s: epoch %lld, step %lld\n", r.resumed_from.c_str(),
                 static_cast<long long>(r.start_step / train_loader.num_batches()), static_cast<long long>(r.start_step));

  const double acc = examples::accuracy(*model, x_test, y_test);
  std::printf("%s\n", examples::json_line({{"example", examples::quoted("digits_cnn")},
                                           {"device", examples::quoted(dev.str())},
                                           {"epochs", std::to_string(epochs)},
                                           {"parameters", std::to_string(model->parameter_count())},
                                           {"final_train_loss", examples::num(r.final_loss)},
                                           {"test_accuracy", examples::num(acc, 4)},
                                           {"seconds", examples::num(r.seconds, 4)},
                                           {"samples_per_second", examples::num(r.samples_per_second, 6)}})
                          .c_str());
  args.save_model(*model);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "digits_cnn: %s\n", e.what());
  return 1;
}
