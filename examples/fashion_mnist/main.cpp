// fashion_mnist: a CNN of conv-BN-ReLU blocks trained on Fashion-MNIST with train::Trainer (real
// data: Debian's dataset-fashion-mnist, IDX gzip files under /usr/share/datasets/fashion-mnist, or
// the folder in EMBER_FASHION_MNIST_DIR), fed by data::DataLoader with worker threads and
// augmentation (random flip by default; --augment 2 adds a random crop with 2 pixels of padding),
// on the GPU when there is one. The README's main example.
//
//   fashion_mnist [--device auto|cpu|cuda:N] [--epochs 5] [--batch-size 64] [--lr 0.003]
//                 [--workers 2] [--train-subset 0] [--test-subset 0] [--augment 1] [--width 16] [--blocks 2]
//                 [--seed 0]
//                 [--precision fp32|bf16|fp16] [--log-dir runs/fashion_mnist]
//                 [--checkpoint-dir runs/fashion_mnist/checkpoints] [--resume 1]
//                 [--save PATH] [--load PATH] [--profile trace.json]
//                 [--export model.onnx] [--int8 1] [--int8-observer percentile|max|mse] [--int8-outputs 0]
//                 [--calib-batches 16] [--mlflow mlruns]
//
// What a run shows and writes: a progress bar (plain lines when stdout is not a terminal) with
// the test accuracy after each epoch; TensorBoard logs in --log-dir (tensorboard --logdir
// runs/fashion_mnist; also metrics.jsonl and metrics.csv); a checkpoint after each epoch in
// --checkpoint-dir (the last two, and the best by test accuracy in its best/ folder); one JSON line
// last. Run the same command again and it resumes from the newest checkpoint (--resume 0 starts
// over; an empty --log-dir= or --checkpoint-dir= turns that part off). --profile profiles 20 steps
// after 5 of warm-up, prints the step report and the bottleneck verdict and writes the Chrome
// trace. --save writes the trained weights (safetensors); --load starts from such a file
// (--epochs 0: only evaluates it).
// --mlflow DIR also tracks the run in MLflow's file store DIR (experiment "fashion_mnist": the
// metrics, the flags as params, the checkpoints and the exported models as artifacts; a resumed
// run continues the same MLflow run; MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri DIR).
// --export writes the trained model as ONNX (batch norm folded into the convolutions; opset 21,
// symbolic batch), with its test accuracy in the metadata; --int8 1 also writes
// <name>_int8.onnx: the folded model calibrated on --calib-batches training batches (the
// observer: --int8-observer), evaluated in ember as INT8 computes it (fake quantization), and
// exported with QuantizeLinear/DequantizeLinear pairs for TensorRT's explicit quantization (on
// every Conv2d/Linear input; --int8-outputs 1 on their outputs too, which onnxruntime's CPU
// kernels need to run the convolutions in integers).
//
// Model: conv3x3(c) BN ReLU maxpool -> conv3x3(2c) BN ReLU maxpool -> linear(49*2c -> 10); with
// --blocks 3 a third block conv3x3(4c) BN ReLU maxpool (7x7 -> 3x3) before linear(9*4c -> 10);
// Adam with a one-cycle learning rate stepped every step, cross-entropy. The test set serves as
// the validation set (Fashion-MNIST has no other; no choice is made on it but the best checkpoint).
#include <chrono>
#include <cstdio>
#include <fstream>

#include <ember/data/dataloader.hpp>
#include <ember/data/idx.hpp>
#include <ember/data/transforms.hpp>
#include <ember/ember.hpp>
#include <ember/train/trainer.hpp>

#include <ember/deploy/onnx.hpp>
#include <ember/logging/mlflow.hpp>
#include <ember/quant/quantize.hpp>

#include "../common/args.hpp"
#include "../common/observe.hpp"
#include "../common/progress.hpp"

using namespace ember;

namespace {

std::shared_ptr<nn::Sequential> make_model(int64_t c, int64_t blocks) {
  EMBER_CHECK(blocks == 2 || blocks == 3, ValueError, "fashion_mnist: --blocks must be 2 or 3, got ", blocks);
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
  if (blocks == 3) {
    block(2 * c, 4 * c);
    m->emplace<nn::MaxPool2d>(2);  // 7 -> 3
  }
  m->emplace<nn::Flatten>();
  m->emplace<nn::Linear>(blocks == 3 ? 4 * c * 3 * 3 : 2 * c * 7 * 7, 10);
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

train::Precision precision_of(const std::string& s) {
  if (s == "fp32") return train::Precision::Fp32;
  if (s == "bf16") return train::Precision::Bf16;
  if (s == "fp16") return train::Precision::Fp16;
  throw std::invalid_argument("--precision must be fp32, bf16 or fp16, got " + s);
}

}  // namespace

int main(int argc, char** argv) try {
  const auto start = std::chrono::steady_clock::now();
  examples::Args args(argc, argv, examples::with_observe_flags(
                      {{"device", "auto"}, {"epochs", "5"}, {"batch-size", "64"}, {"lr", "0.003"}, {"workers", "2"},
                       {"train-subset", "0"}, {"test-subset", "0"}, {"augment", "1"}, {"width", "16"}, {"blocks", "2"}, {"seed", "0"},
                       {"precision", "fp32"}, {"log-dir", "runs/fashion_mnist"},
                       {"checkpoint-dir", "runs/fashion_mnist/checkpoints"}, {"resume", "1"}, {"load", ""},
                       {"export", ""}, {"int8", "0"}, {"int8-observer", "percentile"}, {"int8-outputs", "0"},
                       {"calib-batches", "16"}, {"mlflow", ""}}));
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
  Prefix train_set(train_all, args.integer("train-subset")), test_set(test_all, args.integer("test-subset"));

  // Fashion-MNIST's pixel mean and standard deviation (over the training set, in [0, 1]).
  const data::Normalize normalize{{0.2860f}, {0.3530f}};
  // --augment 0: none; 1: horizontal flip; 2: flip and a random 28x28 crop of the image padded by 2.
  const int64_t augment = args.integer("augment");
  data::Transform train_tf = data::Compose({data::ToFloat{}, normalize});
  if (augment == 1) train_tf = data::Compose({data::ToFloat{}, data::RandomHorizontalFlip{0.5}, normalize});
  if (augment >= 2)
    train_tf = data::Compose({data::ToFloat{}, data::RandomCrop{28, 28, 2}, data::RandomHorizontalFlip{0.5}, normalize});
  data::DataLoader train_loader(train_set, {.batch_size = batch, .shuffle = true, .seed = seed, .drop_last = true,
                                            .num_workers = workers, .device = dev, .transform = train_tf});
  data::DataLoader test_loader(test_set, {.batch_size = 500, .num_workers = workers, .device = dev,
                                          .transform = data::Compose({data::ToFloat{}, normalize})});

  manual_seed(seed);
  auto model = make_model(args.integer("width"), args.integer("blocks"));
  if (!args.str("load").empty()) model->load(args.str("load"));
  model->to(dev);
  optim::Adam opt(model->parameters(), {.lr = args.real("lr")});
  optim::OneCycleLR schedule(opt, {.max_lr = args.real("lr"),
                                   .total_steps = std::max<int64_t>(1, epochs * train_loader.num_batches()),
                                   .pct_start = 0.2, .cycle_momentum = false});

  train::TrainerOptions to;
  to.epochs = std::max<int64_t>(1, epochs);  // the Trainer wants a budget even when --epochs 0 only evaluates
  to.precision = precision_of(args.str("precision"));
  to.scheduler = &schedule;
  to.validation = {.loader = &test_loader};  // val/loss and val/accuracy after every epoch
  if (!args.str("checkpoint-dir").empty())
    to.checkpoint = {.dir = args.str("checkpoint-dir"), .every_epochs = 1, .keep_last = 2,
                     .resume = args.integer("resume") != 0, .best_metric = "val/accuracy"};
  to.log_dir = args.str("log-dir");
  to.hparams = args.hparams();  // every flag, in hparams.json beside the logs
  if (!args.str("mlflow").empty()) to.mlflow = {.tracking_dir = args.str("mlflow"), .experiment = "fashion_mnist"};
  if (!args.str("profile").empty()) to.profile = {.steps = 20, .start_step = 5, .trace_path = args.str("profile")};
  train::Trainer trainer(to);

  train::FitResult r;
  if (epochs > 0) r = trainer.fit(*model, train_loader, opt, train::cross_entropy_loss());
  // --epochs 0 (only --load), or a resumed run that had already finished: evaluate here.
  train::Metrics m = r.final_metrics.count("val/accuracy")
                         ? r.final_metrics
                         : trainer.evaluate(*model, test_loader, train::cross_entropy_loss());
  args.save_model(*model);

  // --export, --int8: the deployed forms, and their accuracy on the same test set.
  std::vector<std::pair<std::string, std::string>> exported;
  std::vector<std::filesystem::path> exported_files;
  if (!args.str("export").empty()) {
    const std::filesystem::path path = args.str("export");
    auto folded = nn::fold_batch_norm(*model);
    folded->eval();
    const AnyTensor example = AnyTensor::zeros({1, 1, 28, 28}, DType::Float32, dev);
    const double acc = m.at("val/accuracy");
    const auto er = io::onnx::export_model(*folded, {example}, path,
                                           {.training_step = r.steps, .metadata = {{"test_accuracy", examples::num(acc, 4)}}});
    std::printf("exported %s (%zu nodes)\n", path.string().c_str(), er.nodes);
    exported.emplace_back("export", examples::quoted(path.string()));
    exported_files.push_back(path);
    if (args.integer("int8") != 0) {
      const std::string kind = args.str("int8-observer");
      const quant::ObserverKind ok = kind == "max"   ? quant::ObserverKind::Max
                                     : kind == "mse" ? quant::ObserverKind::Mse
                                                     : quant::ObserverKind::Percentile;
      EMBER_CHECK(kind == "max" || kind == "mse" || kind == "percentile", ValueError,
                  "fashion_mnist: --int8-observer must be max, percentile or mse, got ", kind);
      auto q = quant::prepare(*folded, {.observer = {.kind = ok, .percentile = 99.99},
                                          .quantize_outputs = args.integer("int8-outputs") != 0});
      // Calibration batches: training images without augmentation.
      data::DataLoader calib(train_set, {.batch_size = batch, .shuffle = true, .seed = seed + 1, .num_workers = workers,
                                         .device = dev, .transform = data::Compose({data::ToFloat{}, normalize})});
      quant::calibrate(*q, calib, [](const data::Batch& b) { return b["image"]; }, args.integer("calib-batches"));
      const double acc8 = trainer.evaluate(*q, test_loader, train::cross_entropy_loss()).at("val/accuracy");
      std::filesystem::path p8 = path;
      p8.replace_filename(path.stem().string() + "_int8" + path.extension().string());
      io::onnx::export_model(*q, {example}, p8,
                             {.training_step = r.steps, .metadata = {{"test_accuracy", examples::num(acc8, 4)},
                                                                     {"int8_observer", kind}}});
      std::printf("exported %s (INT8, %s observer)\n", p8.string().c_str(), kind.c_str());
      exported.emplace_back("export_int8", examples::quoted(p8.string()));
      exported_files.push_back(p8);
      exported.emplace_back("int8_test_accuracy", examples::num(acc8, 4));
      exported.emplace_back("int8_accuracy_drop_points", examples::num(100.0 * (acc - acc8), 3));
    }
  }
  // The MLflow run the Trainer logged into (its id is in <log-dir>/mlflow_run_id) gets the exported
  // models as artifacts under model/.
  if (!args.str("mlflow").empty() && !exported_files.empty() && !to.log_dir.empty()) {
    logging::MlflowRun run({.tracking_dir = args.str("mlflow"), .experiment = "fashion_mnist", .resume = true},
                           to.log_dir / "mlflow_run_id");
    for (const auto& f : exported_files) run.log_artifact(f, "model");
    run.end();
    std::printf("MLflow run %s: the exported models are its artifacts under model/\n", run.run_id().c_str());
  }
  if (!to.log_dir.empty() && epochs > 0) std::printf("TensorBoard logs: %s (tensorboard --logdir %s)\n",
                                                     to.log_dir.string().c_str(), to.log_dir.string().c_str());
  if (!r.resumed_from.empty())
    std::printf("resumed from %s (step %lld; --resume 0 starts over)\n", r.resumed_from.string().c_str(),
                static_cast<long long>(r.start_step));
  if (!r.last_checkpoint.empty()) std::printf("checkpoint: %s\n", r.last_checkpoint.string().c_str());
  if (!r.best_checkpoint.empty()) std::printf("best checkpoint: %s\n", r.best_checkpoint.string().c_str());

  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::map<std::string, std::string> fields{{"example", examples::quoted("fashion_mnist")},
                                           {"device", examples::quoted(dev.str())},
                                           {"precision", examples::quoted(args.str("precision"))},
                                           {"epochs", std::to_string(epochs)},
                                           {"steps", std::to_string(r.steps)},
                                           {"resumed_from_step", std::to_string(r.start_step)},
                                           {"train_samples", std::to_string(train_set.size())},
                                           {"test_samples", std::to_string(test_set.size())},
                                           {"workers", std::to_string(workers)},
                                           {"parameters", std::to_string(model->parameter_count())},
                                           {"final_train_loss", examples::num(r.final_loss)},
                                           {"test_loss", examples::num(m.count("val/loss") ? m.at("val/loss") : 0.0, 4)},
                                           {"test_accuracy", examples::num(m.at("val/accuracy"), 4)},
                                           {"train_seconds", examples::num(r.seconds, 4)},
                                           {"wall_seconds", examples::num(wall, 4)},
                                           {"data_wait_seconds", examples::num(train_loader.total_wait_seconds(), 4)},
                                           {"samples_per_second", examples::num(r.samples_per_second, 6)}};
  fields.insert(exported.begin(), exported.end());
  std::printf("%s\n", examples::json_line(fields).c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
  return 1;
}
