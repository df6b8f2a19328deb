// amp_recompute: the features that let a model train faster and fit in memory on one GPU,
// on a real task (the scikit-learn digits shipped by Debian's python3-sklearn): mixed precision
// (fp16 with dynamic loss scaling, or bf16), gradient accumulation, recomputation of activations
// (nn::recompute), and the batch-size finder. On the GPU when there is one, else on the CPU
// (16-bit types emulated).
//
//   amp_recompute [--device auto|cpu|cuda:N] [--precision fp32|fp16|bf16] [--accumulate 2]
//                 [--recompute 4] [--width 256] [--depth 4] [--epochs 15] [--batch-size 32]
//                 [--lr 0.003] [--seed 0] [--find-batch-size 0] [--memory-limit-mb 64]
//                 [--profile trace.json] [--log-dir runs/amp]   (examples/common/observe.hpp)
//
// --recompute N runs the hidden stack with nn::recompute_sequential in N segments (0: off).
// --find-batch-size 1 first searches the largest batch whose training step fits under
// --memory-limit-mb (an allocator limit, so the search also works on the CPU), and reports it.
// Prints a progress line, then one JSON line: accuracy, loss-scaler statistics, peak memory.
#include <algorithm>
#include <cstdio>
#include <numeric>

#include <ember/ember.hpp>
#include <ember/data/distributed_sampler.hpp>
#include <ember/train/accumulate.hpp>
#include <ember/train/batch_size_finder.hpp>

#include "../common/args.hpp"
#include "../common/digits_on_device.hpp"
#include "../common/observe.hpp"
#include "../common/progress.hpp"

using namespace ember;

namespace {

struct Net {
  std::shared_ptr<nn::Linear> input, output;
  std::shared_ptr<nn::Sequential> hidden;  // recomputed as a whole when asked
  std::vector<AnyTensor> parameters() const {
    std::vector<AnyTensor> p = input->parameters();
    for (auto& t : hidden->parameters()) p.push_back(t);
    for (auto& t : output->parameters()) p.push_back(t);
    return p;
  }
  void to(Device d) {
    input->to(d);
    hidden->to(d);
    output->to(d);
  }
};

Net make_net(int64_t width, int64_t depth) {
  Net n;
  n.input = std::make_shared<nn::Linear>(64, width);
  n.hidden = std::make_shared<nn::Sequential>();
  for (int64_t i = 0; i < depth; ++i) {
    n.hidden->emplace<nn::Linear>(width, width);
    n.hidden->emplace<nn::GELU>(std::string("tanh"));
  }
  n.output = std::make_shared<nn::Linear>(width, 10);
  return n;
}

// Logits in fp32 for input x (fp32), computed in activation type T.
template <Element T>
Tensor<float> forward(Net& net, const Tensor<float>& x, int segments) {
  Tensor<T> h = gelu((*net.input)(x.to<T>()), true);
  h = segments > 0 ? nn::recompute_sequential(*net.hidden, segments, h) : (*net.hidden)(h);
  return (*net.output)(h).template to<float>();
}

Tensor<float> forward(Net& net, const Tensor<float>& x, int segments, const std::string& precision) {
  if (precision == "fp16") return forward<half>(net, x, segments);
  if (precision == "bf16") return forward<bfloat16>(net, x, segments);
  return forward<float>(net, x, segments);
}

}  // namespace

int main(int argc, char** argv) try {
  examples::Args args(argc, argv,
                      examples::with_observe_flags({{"device", "auto"}, {"precision", "fp16"}, {"accumulate", "2"},
                                                    {"recompute", "4"}, {"width", "256"}, {"depth", "4"},
                                                    {"epochs", "15"}, {"batch-size", "32"}, {"lr", "0.003"},
                                                    {"seed", "0"}, {"find-batch-size", "0"},
                                                    {"memory-limit-mb", "64"}}));
  const Device dev = args.device();
  const std::string precision = args.str("precision");
  if (precision != "fp32" && precision != "fp16" && precision != "bf16")
    throw ValueError("--precision must be fp32, fp16 or bf16, got " + precision);
  const int64_t epochs = args.integer("epochs"), accumulate = args.integer("accumulate");
  const int segments = static_cast<int>(args.integer("recompute"));
  int64_t batch = args.integer("batch-size");
  const uint64_t seed = static_cast<uint64_t>(args.integer("seed"));

  auto [x_train, x_test, y_train, y_test] = examples::digits_on_device(0.2, seed, dev);
  const int64_t n_train = x_train.size(0), n_test = x_test.size(0);

  manual_seed(seed);
  Net net = make_net(args.integer("width"), args.integer("depth"));
  net.to(dev);
  optim::AdamW opt(net.parameters(), {.lr = args.real("lr"), .weight_decay = 0.01});
  // fp16 needs loss scaling; fp32 and bf16 run the same loop with the scaler disabled.
  amp::GradScaler scaler({.enabled = precision == "fp16"});
  train::GradientAccumulator acc(accumulate);

  // Forward and backward of one micro-batch (the loss scaled by 1/k and by the loss scale).
  auto train_step = [&](const Tensor<int64_t>& idx, amp::GradScaler& scaler) {
    Tensor<float> loss;
    {
      amp::CastCacheGuard cache;
      loss = nn::functional::cross_entropy(forward(net, index_select(x_train, 0, idx), segments, precision),
                                           index_select(y_train, 0, idx));
      scaler.scale(acc.scale_loss(loss)).backward();
    }
    return loss;
  };

  std::string finder_json = "null";
  if (args.integer("find-batch-size")) {
    amp::GradScaler search_scaler({.enabled = precision == "fp16"});  // the search's steps do not count
    const int64_t limit = args.integer("memory-limit-mb") << 20;
    set_memory_limit(dev, memory_stats(dev).current_bytes + limit);
    auto found = train::find_max_batch_size(
        [&](int64_t b) {
          // Repeat the training set as needed so any batch size is possible.
          std::vector<int64_t> ids(static_cast<size_t>(b));
          for (int64_t i = 0; i < b; ++i) ids[static_cast<size_t>(i)] = i % n_train;
          train_step(Tensor<int64_t>::from_vector(ids, dev), search_scaler);
          search_scaler.step(opt);
          search_scaler.update();
          opt.zero_grad();
        },
        *net.hidden, opt, {.initial_batch_size = 16, .max_batch_size = 1 << 16, .margin = 0.9, .device = dev});
    set_memory_limit(dev, -1);
    finder_json = "{\"memory_limit_mb\": " + std::to_string(args.integer("memory-limit-mb")) +
                  ", \"max_batch_size\": " + std::to_string(found.max_batch_size) +
                  ", \"batch_size\": " + std::to_string(found.batch_size) + "}";
    std::printf("batch-size finder: %lld fits under %lld MiB (using %lld with the margin)\n",
                static_cast<long long>(found.max_batch_size), static_cast<long long>(args.integer("memory-limit-mb")),
                static_cast<long long>(found.batch_size));
  }

  reset_peak_memory(dev);
  const int64_t base_bytes = memory_stats(dev).current_bytes;
  // Created after the batch-size finder, so that the profile and the log hold training steps only.
  examples::Observe observe(args, {{"example", std::string("amp_recompute")}, {"device", dev.str()},
                                   {"precision", precision}, {"accumulate", static_cast<double>(accumulate)},
                                   {"recompute_segments", static_cast<double>(segments)},
                                   {"epochs", static_cast<double>(epochs)}, {"batch_size", static_cast<double>(batch)},
                                   {"lr", args.real("lr")}, {"seed", static_cast<double>(seed)}});
  examples::Progress progress;
  double last_loss = 0;
  int64_t step = 0, skipped = 0, step_samples = 0;
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    // A fresh permutation of the training set each epoch, from (seed, epoch).
    data::DistributedSampler sampler(n_train, 1, 0, {.seed = seed});
    sampler.set_epoch(static_cast<uint64_t>(epoch));
    std::vector<int64_t> order = sampler.indices();
    auto perm = Tensor<int64_t>::from_vector(order, dev);
    for (int64_t b0 = 0; b0 < n_train; b0 += batch) {
      auto idx = perm.slice(b0, std::min(n_train, b0 + batch));
      auto loss = train_step(idx, scaler);
      step_samples += idx.numel();
      if (acc.sync_step()) {
        scaler.unscale_(opt);
        optim::clip_grad_norm_(net.parameters(), 1.0);
        if (!scaler.step(opt)) ++skipped;
        scaler.update();
        opt.zero_grad();
        ++step;
        // One profiler step per optimizer step (all its micro-batches).
        observe.step(step, loss.item(), step_samples, opt.param_groups()[0].lr());
        step_samples = 0;
      }
      last_loss = loss.item();
      progress.step(epoch, epochs, step, last_loss, idx.numel());
    }
    progress.epoch(epoch, epochs, "loss " + examples::num(last_loss, 4), 4);
  }
  progress.finish();
  observe.finish(step);
  const double seconds = progress.seconds();
  const int64_t peak = memory_stats(dev).peak_bytes - base_bytes;

  NoGradGuard no_grad;
  auto pred = argmax(forward(net, x_test, 0, precision), {1});
  const double accuracy =
      static_cast<double>(sum(eq(pred, y_test).to<int64_t>()).item()) / static_cast<double>(n_test);
  std::printf("%s\n",
              examples::json_line({{"example", examples::quoted("amp_recompute")},
                                   {"device", examples::quoted(dev.str())},
                                   {"precision", examples::quoted(precision)},
                                   {"accumulate", std::to_string(accumulate)},
                                   {"recompute_segments", std::to_string(segments)},
                                   {"optimizer_steps", std::to_string(step)},
                                   {"skipped_steps", std::to_string(skipped)},
                                   {"final_loss_scale", examples::num(scaler.get_scale())},
                                   {"final_train_loss", examples::num(last_loss)},
                                   {"test_accuracy", examples::num(accuracy, 4)},
                                   {"peak_training_memory_mb", examples::num(static_cast<double>(peak) / 1048576.0, 4)},
                                   {"batch_size_finder", finder_json},
                                   {"seconds", examples::num(seconds, 4)}})
                  .c_str());
  {
    io::TensorList weights;  // the three parts under prefixes, as one torch module would name them
    for (auto& [k, v] : net.input->state_dict()) weights.emplace_back("input." + k, v);
    for (auto& [k, v] : net.hidden->state_dict()) weights.emplace_back("hidden." + k, v);
    for (auto& [k, v] : net.output->state_dict()) weights.emplace_back("output." + k, v);
    args.save_tensors(weights);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "amp_recompute: %s\n", e.what());
  return 1;
}
