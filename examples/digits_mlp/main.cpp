// digits_mlp: a two-layer perceptron trained on the scikit-learn handwritten digits (real data
// shipped by Debian's python3-sklearn), on the GPU when there is one, else on the CPU.
//
//   digits_mlp [--device auto|cpu|cuda:N] [--epochs 30] [--batch-size 64] [--lr 0.05] [--seed 0]
//              [--save weights.safetensors] [--profile trace.json] [--log-dir runs/digits_mlp]
//              (the last two: examples/common/observe.hpp, docs/profiling.md)
//
// Written with ember's tensors and autograd alone (parameters, forward, loss, an SGD-with-momentum
// update), to show the core API. It prints a progress line and, last, one JSON line of metrics.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include <ember/ember.hpp>
#include <ember/data/distributed_sampler.hpp>

#include "../common/args.hpp"
#include "../common/digits_on_device.hpp"
#include "../common/observe.hpp"

using namespace ember;

namespace {

struct Linear {
  Tensor<float> weight, bias;  // [out, in], [out] as in PyTorch
  Linear(int64_t in, int64_t out, Device dev, Generator& gen) {
    // PyTorch's default nn.Linear init: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    weight = Tensor<float>::rand({out, in}, dev, -bound, bound, gen).set_requires_grad();
    bias = Tensor<float>::rand({out}, dev, -bound, bound, gen).set_requires_grad();
  }
  Tensor<float> operator()(const Tensor<float>& x) const { return matmul(x, weight, false, true) + bias; }
};

// Mean cross-entropy of logits [B, C] against class indices [B].
Tensor<float> cross_entropy(const Tensor<float>& logits, const Tensor<int64_t>& labels) {
  auto logp = log_softmax(logits, 1);
  auto picked = gather(logp, 1, labels.reshape({labels.numel(), 1}));
  return -mean(picked);
}

}  // namespace

int main(int argc, char** argv) try {
  examples::Args args(argc, argv,
                      examples::with_observe_flags({{"device", "auto"}, {"epochs", "30"}, {"batch-size", "64"},
                                                    {"lr", "0.05"}, {"seed", "0"}, {"hidden", "128"}}));
  const Device dev = args.device();
  const int64_t epochs = args.integer("epochs"), batch = args.integer("batch-size"), hidden = args.integer("hidden");
  const double lr = args.real("lr"), momentum = 0.9;
  const uint64_t seed = static_cast<uint64_t>(args.integer("seed"));
  const bool tty = isatty(STDOUT_FILENO);

  // The whole data set lives on the device; batches are gathered there.
  auto [x_train, x_test, y_train, y_test] = examples::digits_on_device(0.2, seed, dev);
  const int64_t n_train = x_train.size(0), n_test = x_test.size(0);

  Generator gen(seed);
  Linear fc1(64, hidden, dev, gen), fc2(hidden, 10, dev, gen);
  std::vector<Tensor<float>> params = {fc1.weight, fc1.bias, fc2.weight, fc2.bias};
  std::vector<Tensor<float>> velocity;
  for (auto& p : params) velocity.push_back(Tensor<float>::zeros(p.shape(), dev));

  examples::Observe observe(args, {{"example", std::string("digits_mlp")}, {"device", dev.str()},
                                   {"epochs", static_cast<double>(epochs)}, {"batch_size", static_cast<double>(batch)},
                                   {"hidden", static_cast<double>(hidden)}, {"lr", lr}, {"momentum", momentum},
                                   {"seed", static_cast<double>(seed)}});
  auto start = std::chrono::steady_clock::now();
  double last_loss = 0;
  int64_t step = 0, seen = 0;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    // A fresh permutation each epoch, from (seed, epoch).
    // A fresh permutation of the training set each epoch, from (seed, epoch).
    data::DistributedSampler sampler(n_train, 1, 0, {.seed = seed});
    sampler.set_epoch(static_cast<uint64_t>(epoch));
    std::vector<int64_t> order = sampler.indices();
    auto perm = Tensor<int64_t>::from_vector(order, dev);
    double epoch_loss = 0;
    int64_t batches = 0;
    for (int64_t b0 = 0; b0 < n_train; b0 += batch) {
      auto idx = perm.slice(b0, std::min(n_train, b0 + batch));
      Tensor<float> xb;
      Tensor<int64_t> yb;
      {
        trace::PhaseScope data(trace::Phase::DataWait);  // the batch's gather is this example's data loading
        xb = index_select(x_train, 0, idx);
        yb = index_select(y_train, 0, idx);
      }
      Tensor<float> loss;
      {
        trace::PhaseScope forward(trace::Phase::Forward);  // no nn::Module here to mark it
        loss = cross_entropy(fc2(relu(fc1(xb))), yb);
      }
      for (auto& p : params) p.zero_grad();
      loss.backward();
      {
        trace::PhaseScope update(trace::Phase::Optimizer);  // a hand-written update, marked by hand
        NoGradGuard no_grad;  // SGD with momentum, as torch.optim.SGD: v = mu v + g; p -= lr v
        for (size_t i = 0; i < params.size(); ++i) {
          velocity[i].copy_(velocity[i] * momentum + params[i].grad());
          params[i].copy_(params[i] - velocity[i] * lr);
        }
      }
      last_loss = loss.item();
      epoch_loss += last_loss;
      ++batches;
      ++step;
      seen += idx.numel();
      observe.step(step, last_loss, idx.numel(), lr);
      if (tty) {
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("\repoch %3lld/%lld  step %5lld  loss %.4f  %.0f samples/s   ", static_cast<long long>(epoch + 1),
                    static_cast<long long>(epochs), static_cast<long long>(step), last_loss, seen / std::max(secs, 1e-9));
        std::fflush(stdout);
      }
    }
    if (!tty && (epoch + 1 == epochs || (epoch + 1) % 10 == 0))
      std::printf("epoch %lld/%lld  loss %.4f\n", static_cast<long long>(epoch + 1), static_cast<long long>(epochs),
                  epoch_loss / static_cast<double>(batches));
  }
  if (tty) std::printf("\n");
  observe.finish(step);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  NoGradGuard no_grad;
  auto pred = argmax(fc2(relu(fc1(x_test))), {1});
  auto correct = sum(eq(pred, y_test).to<int64_t>()).item();
  const double accuracy = static_cast<double>(correct) / static_cast<double>(n_test);
  std::printf(
      "{\"example\": \"digits_mlp\", \"device\": \"%s\", \"epochs\": %lld, \"train_samples\": %lld, "
      "\"test_samples\": %lld, \"final_train_loss\": %.6f, \"test_accuracy\": %.4f, \"seconds\": %.3f, "
      "\"samples_per_second\": %.1f}\n",
      dev.str().c_str(), static_cast<long long>(epochs), static_cast<long long>(n_train),
      static_cast<long long>(n_test), last_loss, accuracy, seconds, static_cast<double>(seen) / seconds);
  args.save_tensors({{"fc1.weight", fc1.weight}, {"fc1.bias", fc1.bias}, {"fc2.weight", fc2.weight}, {"fc2.bias", fc2.bias}});
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "digits_mlp: %s\n", e.what());
  return 1;
}
