// Threads (docs/api.md, "Threads"): the random-state model (core/random.hpp: a process-wide
// generator whose draws never race or repeat, GeneratorScope for a thread's own), recomputation
// (nn::recompute) replaying without rewinding a shared generator, the generator saved and replayed
// through CheckpointManager on a thread, grad mode and anomaly mode per thread, and two models
// trained on two threads at once bitwise equal to the same trainings one after the other (also
// with a profiler session recording both), and convolution, pooling and GEMM on threads released
// at once (oneDNN's process-wide primitive cache, the host allocator's cache) equal to one
// thread's bits. Run under ThreadSanitizer too (docs/architecture.md, "Threads and oneDNN").
#include <catch2/catch.hpp>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <filesystem>
#include <set>
#include <thread>
#include <vector>

#include <ember/backend/cpu/conv.hpp>
#include <ember/ember.hpp>
#include <ember/profile/profiler.hpp>
#include <ember/train/checkpoint_manager.hpp>

#include "temp_dir.hpp"

using namespace ember;

namespace {

std::vector<float> draw_floats(int draws, int64_t n) {
  std::vector<float> out;
  for (int i = 0; i < draws; ++i) {
    auto v = FloatTensor::rand({n}).to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// Runs f on a thread and rethrows what it threw.
template <class F>
std::thread spawn(F f, std::exception_ptr& error) {
  return std::thread([f, &error]() mutable {
    try {
      f();
    } catch (...) {
      error = std::current_exception();
    }
  });
}

struct Mlp : nn::ModuleBase<Mlp> {
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::Dropout> drop;
  Mlp() {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(6, 32));  // default init: default_generator()
    drop = register_module("drop", std::make_shared<nn::Dropout>(0.25));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(32, 3));
  }
  std::string type_name() const override { return "Mlp"; }
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    return (*fc2)((*drop)(tanh((*fc1)(x))));
  }
};

struct TrainResult {
  std::vector<float> losses;
  std::vector<float> params;  // every parameter, flattened
};

// A whole training on the calling thread, every random draw (init, data, dropout, the
// recomputed segment's replay) from the thread's own generator.
TrainResult run_training(uint64_t seed, bool recomputed, bool anomaly) {
  Generator gen(seed);
  GeneratorScope own(gen);
  std::optional<autograd::detect_anomaly> guard;
  if (anomaly) guard.emplace();
  Mlp m;
  m.train();
  optim::Adam opt(m.parameters(), {.lr = 1e-2});
  TrainResult r;
  for (int step = 0; step < 12; ++step) {
    FloatTensor x = FloatTensor::randn({16, 6});
    FloatTensor y = FloatTensor::randn({16, 3});
    FloatTensor out = recomputed ? FloatTensor(nn::recompute([&](const FloatTensor& in) { return m(in); }, x)) : m(x);
    FloatTensor loss = nn::functional::mse_loss(out, y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    r.losses.push_back(loss.item());
    {
      NoGradGuard no_grad;  // an evaluation pass: grad mode is per thread
      FloatTensor e = m(x);
      if (e.requires_grad()) throw std::logic_error("NoGradGuard leaked: output requires grad");
    }
  }
  for (auto& [n, p] : m.named_parameters()) {
    auto v = FloatTensor(p).to_vector();
    r.params.insert(r.params.end(), v.begin(), v.end());
  }
  return r;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One step of a small CNN on the calling thread: conv2d (+ bias) -> relu -> max-pool -> flatten
// -> matmul, then backward, so that all three convolution directions, the pooling's backward and
// GEMMs with either operand transposed run. Returns the output and every gradient, appended. Each
// `shape` is a problem no other shape shares (its own channels and size), so that the first
// thread to ask for it makes oneDNN's primitives while the others ask for the same ones.
std::vector<float> cnn_step(int shape) {
  Generator gen(1000 + static_cast<uint64_t>(shape));
  GeneratorScope own(gen);
  const int64_t n = 2, c = 2 + shape % 3, h = 8 + 2 * shape, k = 4 + shape % 4;
  FloatTensor x = FloatTensor::randn({n, c, h, h}).set_requires_grad();
  FloatTensor w = FloatTensor::randn({k, c, 3, 3}).set_requires_grad();
  FloatTensor b = FloatTensor::randn({k}).set_requires_grad();
  const int64_t features = k * (h / 2) * (h / 2);
  FloatTensor fc = FloatTensor::randn({features, 5}).set_requires_grad();
  FloatTensor y = relu(conv2d(x, w, b, {{1, 1}, {1, 1}, {1, 1}, 1}));
  FloatTensor out = matmul(max_pool2d(y).reshape({n, features}), fc);
  sum(square(out)).backward();
  std::vector<float> bits = out.to_vector();
  for (const FloatTensor* t : {&x, &w, &b, &fc}) {
    const auto g = FloatTensor(t->grad()).to_vector();
    bits.insert(bits.end(), g.begin(), g.end());
  }
  return bits;
}

// Lets `count` threads wait until all have arrived, then go at once (C++20's std::barrier is not
// in every standard library ember builds with).
class StartLine {
 public:
  explicit StartLine(int count) : waiting_(count) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (--waiting_ == 0) cv_.notify_all();
    else cv_.wait(lock, [&] { return waiting_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_;
};

// Sets ember's thread count for a scope (the convolutions go to oneDNN only above one thread).
struct ThreadCountForTest {
  int before = get_num_threads();
  explicit ThreadCountForTest(int n) { set_num_threads(n); }
  ~ThreadCountForTest() { set_num_threads(before); }
};

}  // namespace

TEST_CASE("random: the shared generator gives two threads disjoint draws, never the same numbers", "[threads][random]") {
  Generator& shared = default_generator();
  REQUIRE(&shared == &detail::process_generator());
  const GeneratorState before = shared.state();
  constexpr int kDraws = 300;
  std::vector<float> a, b;
  std::exception_ptr ea, eb;
  std::thread ta = spawn([&] { a = draw_floats(kDraws, 8); }, ea);
  std::thread tb = spawn([&] { b = draw_floats(kDraws, 8); }, eb);
  ta.join();
  tb.join();
  if (ea) std::rethrow_exception(ea);
  if (eb) std::rethrow_exception(eb);
  // Every draw of 8 reserved 2 blocks of its own.
  const GeneratorState after = shared.state();
  CHECK(after.seed == before.seed);
  CHECK(after.offset == before.offset + 2 * 2 * kDraws);
  // The two threads' numbers, taken 8 at a time, are all different draws: the union is exactly
  // what one thread drawing 2 * kDraws times from `before` would have got, in some order.
  std::set<std::vector<float>> seen;
  for (const auto* v : {&a, &b})
    for (size_t i = 0; i < v->size(); i += 8) seen.insert(std::vector<float>(v->begin() + i, v->begin() + i + 8));
  CHECK(seen.size() == 2 * kDraws);
  Generator replay(before);
  std::set<std::vector<float>> expected;
  for (int i = 0; i < 2 * kDraws; ++i) expected.insert(FloatTensor::rand({8}, Device::cpu(), 0.0, 1.0, replay).to_vector());
  CHECK(seen == expected);
}

TEST_CASE("random: a GeneratorScope gives a thread its own stream, others unaffected", "[threads][random]") {
  const GeneratorState before = default_generator().state();
  std::vector<float> a, b, reference;
  bool a_installed = false;
  std::exception_ptr ea, eb;
  std::thread ta = spawn(
      [&] {
        Generator mine(42);
        GeneratorScope scope(mine);
        a_installed = &default_generator() == &mine;  // (no Catch assertions off the main thread)
        a = draw_floats(200, 4);
      },
      ea);
  std::thread tb = spawn(
      [&] {
        Generator mine(42);  // the same seed on purpose: the streams are the threads' own
        GeneratorScope scope(mine);
        manual_seed(42);     // seeds this thread's generator only
        b = draw_floats(200, 4);
      },
      eb);
  ta.join();
  tb.join();
  if (ea) std::rethrow_exception(ea);
  if (eb) std::rethrow_exception(eb);
  {
    Generator g(42);
    GeneratorScope scope(g);
    reference = draw_floats(200, 4);
    {
      Generator inner(7);
      GeneratorScope nested(inner);
      CHECK(&default_generator() == &inner);
    }
    CHECK(&default_generator() == &g);  // nested scopes restore
  }
  CHECK(&default_generator() == &detail::process_generator());
  CHECK(a_installed);
  CHECK(bitwise_equal(a, reference));
  CHECK(bitwise_equal(b, reference));
  CHECK(default_generator().state() == before);  // the process-wide generator was not touched
}

TEST_CASE("random: a recomputing backward on one thread never rewinds another thread's stream", "[threads][random]") {
  // One thread runs recomputing forward/backward passes with dropout (a backward that rewound and
  // restored the shared generator would repeat draws) while another draws from the same shared
  // generator: no draw may repeat an earlier one.
  std::vector<float> drawn;
  std::atomic<bool> stop{false};
  std::exception_ptr ea, eb;
  std::thread worker = spawn(
      [&] {
        nn::Linear fc(8, 8);
        while (!stop.load()) {
          FloatTensor x = FloatTensor::ones({4, 8});
          auto y = nn::recompute(
              [&](const FloatTensor& in) { return nn::functional::dropout(FloatTensor(fc(in)), 0.5, true); }, x);
          sum(FloatTensor(y)).backward();
        }
      },
      ea);
  std::thread drawer = spawn(
      [&] {
        drawn = draw_floats(3000, 4);
        stop.store(true);
      },
      eb);
  drawer.join();
  worker.join();
  if (ea) std::rethrow_exception(ea);
  if (eb) std::rethrow_exception(eb);
  std::set<std::vector<float>> seen;
  for (size_t i = 0; i < drawn.size(); i += 4) seen.insert(std::vector<float>(drawn.begin() + i, drawn.begin() + i + 4));
  CHECK(seen.size() == drawn.size() / 4);
}

TEST_CASE("random: recomputation replays the forward's stream on a thread with its own generator", "[threads][random]") {
  // Bitwise the same gradients with and without recomputation (dropout inside), while another
  // thread hammers the shared generator.
  std::atomic<bool> stop{false};
  std::exception_ptr e_noise;
  std::thread noise = spawn(
      [&] {
        while (!stop.load()) (void)FloatTensor::rand({64});
      },
      e_noise);
  auto grads = [](bool recomputed) {
    Generator gen(5);
    GeneratorScope scope(gen);
    nn::Linear fc(8, 8);
    FloatTensor x = FloatTensor::randn({4, 8});
    auto f = [&](const FloatTensor& in) { return nn::functional::dropout(FloatTensor(fc(in)), 0.5, true); };
    FloatTensor y = recomputed ? FloatTensor(nn::recompute(f, x)) : f(x);
    sum(y * y).backward();
    std::vector<float> g = FloatTensor(fc.weight.grad()).to_vector();
    const GeneratorState end = gen.state();
    g.push_back(static_cast<float>(end.offset));  // the replay did not advance the thread's generator
    return g;
  };
  std::vector<float> plain = grads(false), rec = grads(true);
  stop.store(true);
  noise.join();
  if (e_noise) std::rethrow_exception(e_noise);
  CHECK(bitwise_equal(plain, rec));
}

TEST_CASE("random: a thread's generator is saved and replayed through CheckpointManager", "[threads][random]") {
  testing::TempDir dir("ember-threads-ckpt");
  std::vector<float> after_save, after_load;
  std::optional<int64_t> loaded_step;
  uint64_t loaded_seed = 0;
  std::exception_ptr ea, eb;
  // Thread A: its own generator; saves a checkpoint mid-stream, then draws.
  std::thread ta = spawn(
      [&] {
        Generator gen(11);
        GeneratorScope scope(gen);
        (void)draw_floats(5, 6);
        nn::Linear fc(2, 2);
        train::CheckpointManager mgr(dir.path);
        mgr.save(1, {.model = &fc});  // "default" is this thread's generator
        after_save = draw_floats(10, 6);
      },
      ea);
  ta.join();
  if (ea) std::rethrow_exception(ea);
  const GeneratorState shared_before = default_generator().state();
  // Thread B: a fresh generator restored from the checkpoint draws the same numbers.
  std::thread tb = spawn(
      [&] {
        Generator gen(999);
        GeneratorScope scope(gen);
        nn::Linear fc(2, 2);
        train::CheckpointManager mgr(dir.path);
        auto r = mgr.load_latest({.model = &fc});
        if (r) loaded_step = r->step;
        loaded_seed = gen.seed();
        after_load = draw_floats(10, 6);
      },
      eb);
  tb.join();
  if (eb) std::rethrow_exception(eb);
  REQUIRE(loaded_step.has_value());
  CHECK(*loaded_step == 1);
  CHECK(loaded_seed == 11);
  CHECK(bitwise_equal(after_save, after_load));
  CHECK(default_generator().state() == shared_before);  // neither save nor load touched it
}

TEST_CASE("threads: grad mode and anomaly mode are per thread", "[threads]") {
  FloatTensor w = FloatTensor::ones({3});
  w.set_requires_grad();
  std::exception_ptr e;
  bool other_requires = false, other_anomaly = true;
  {
    NoGradGuard off;
    autograd::detect_anomaly anomaly;
    REQUIRE_FALSE((w * 2.0).requires_grad());
    std::thread t = spawn(
        [&] {
          other_requires = (w * 2.0).requires_grad();
          other_anomaly = autograd::is_anomaly_enabled();
        },
        e);
    t.join();
  }
  if (e) std::rethrow_exception(e);
  CHECK(other_requires);
  CHECK_FALSE(other_anomaly);
}

TEST_CASE("threads: two models trained on two threads at once equal the same trainings one after the other",
          "[threads]") {
  // Bitwise: each training owns its generator (init, data, dropout, recomputation's replay); one
  // uses nn::recompute, the other anomaly detection; both evaluate under NoGradGuard.
  const TrainResult seq1 = run_training(1, /*recomputed=*/true, /*anomaly=*/false);
  const TrainResult seq2 = run_training(2, /*recomputed=*/false, /*anomaly=*/true);
  REQUIRE(seq1.losses.size() == 12);
  CHECK_FALSE(bitwise_equal(seq1.params, seq2.params));  // different seeds: a meaningful comparison

  // At once, with a profiler session recording both threads' ops.
  profile::Profiler prof;
  prof.start();
  TrainResult par1, par2;
  std::exception_ptr e1, e2;
  std::thread t1 = spawn([&] { par1 = run_training(1, true, false); }, e1);
  std::thread t2 = spawn([&] { par2 = run_training(2, false, true); }, e2);
  t1.join();
  t2.join();
  prof.stop();
  if (e1) std::rethrow_exception(e1);
  if (e2) std::rethrow_exception(e2);
  CHECK(bitwise_equal(par1.losses, seq1.losses));
  CHECK(bitwise_equal(par1.params, seq1.params));
  CHECK(bitwise_equal(par2.losses, seq2.losses));
  CHECK(bitwise_equal(par2.params, seq2.params));
  std::set<int> threads_with_linear;
  for (const auto& ev : prof.events())
    if (ev.name == "linear") threads_with_linear.insert(ev.thread);
  CHECK(threads_with_linear.size() == 2);
}

TEST_CASE("threads: convolution, pooling and GEMM on threads released at once equal one thread's bits",
          "[threads][onednn]") {
  // Three threads start every round together on a shape none has seen, so that oneDNN's
  // process-wide primitive cache hands the primitives one thread makes to the others while they
  // ask, and the host allocator's cache hands blocks freed on one thread to another (the
  // activations here are above its 64 KiB threshold). With oneDNN built in and more than one
  // thread, the fp32 convolutions and GEMMs run through it (backend/cpu/conv.hpp, gemm.hpp).
  const ThreadCountForTest two(std::max(2, get_num_threads()));
  INFO("convolutions through oneDNN: " << (cpu::conv_prefers_onednn() ? "yes" : "no (im2col + GEMM)"));
  constexpr int kShapes = 8, kThreads = 3;
  std::vector<std::vector<std::vector<float>>> got(kThreads, std::vector<std::vector<float>>(kShapes));
  std::vector<std::exception_ptr> errors(kThreads);
  std::vector<std::unique_ptr<StartLine>> lines;
  for (int shape = 0; shape < kShapes; ++shape) lines.push_back(std::make_unique<StartLine>(kThreads));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.push_back(spawn(
        [&, t] {
          for (int shape = 0; shape < kShapes; ++shape) {
            lines[static_cast<size_t>(shape)]->arrive_and_wait();
            got[static_cast<size_t>(t)][static_cast<size_t>(shape)] = cnn_step(shape);
          }
        },
        errors[static_cast<size_t>(t)]));
  for (auto& th : threads) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  // The reference: the same shapes on this thread alone, after the threads (its own cache of
  // prepared problems is empty for them; oneDNN's process-wide one now holds them).
  for (int shape = 0; shape < kShapes; ++shape) {
    const std::vector<float> alone = cnn_step(shape);
    REQUIRE(alone.size() > 100);
    for (int t = 0; t < kThreads; ++t) {
      INFO("shape " << shape << ", thread " << t);
      CHECK(bitwise_equal(got[static_cast<size_t>(t)][static_cast<size_t>(shape)], alone));
    }
  }
}
