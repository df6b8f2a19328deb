// train::find_max_batch_size on the CPU under a memory limit (set_memory_limit makes allocations
// beyond it throw OutOfMemory): the exact largest batch against a brute-force scan, the search from
// above, the cap, the margin, bitwise restoration of parameters, Adam state and the generator,
// exceptions other than OutOfMemory, and the same search for real on cuda:0 when there is a GPU.
#include <catch2/catch.hpp>

#include <cstring>
#include <stdexcept>

#include "gpu_skip.hpp"
#include "gradcheck.hpp"
#include "ember/train/batch_size_finder.hpp"

using namespace ember;
using Catch::Contains;

namespace {

// Sets a memory limit of (bytes in use now + budget) on a device and removes it when the scope
// ends, also when a check fails or an exception leaves.
class MemoryLimit {
 public:
  MemoryLimit(Device d, int64_t budget) : d_(d) { set_memory_limit(d_, memory_stats(d_).current_bytes + budget); }
  ~MemoryLimit() { set_memory_limit(d_, -1); }
  MemoryLimit(const MemoryLimit&) = delete;
  MemoryLimit& operator=(const MemoryLimit&) = delete;

 private:
  Device d_;
};

// A model, an Adam optimizer and a training step whose memory grows linearly with the batch.
struct Rig {
  Device dev;
  nn::Sequential model;
  std::unique_ptr<optim::Adam> opt;
  explicit Rig(int pre_steps, Device d = Device::cpu(), int64_t in = 32, int64_t hidden = 64)
      : dev(d) {
    manual_seed(123);
    model.emplace<nn::Linear>(in, hidden);
    model.emplace<nn::ReLU>();
    model.emplace<nn::Linear>(hidden, 8);
    model.to(dev);
    opt = std::make_unique<optim::Adam>(model.parameters(), optim::AdamOptions{.lr = 1e-2});
    for (int i = 0; i < pre_steps; ++i) step(4);
  }
  void step(int64_t b) {
    auto x = Tensor<float>::randn({b, model.layers()[0]->parameters()[0].shape()[1]}, dev);
    auto target = Tensor<float>::randn({b, 8}, dev);
    auto loss = nn::functional::mse_loss(model(x), target);
    loss.backward();
    opt->step();
    opt->zero_grad();
  }
};

// True when one step at batch b fits a fresh rig (built as the finder's, from rig_args: Rig's
// constructor arguments) under the budget.
template <class... RigArgs>
bool fits_fresh(int64_t budget, int64_t b, RigArgs... rig_args) {
  Rig r(rig_args...);
  MemoryLimit limit(r.dev, budget);
  try {
    r.step(b);
    synchronize(r.dev);
    return true;
  } catch (const OutOfMemory&) {
    return false;
  }
}

// The largest batch that fits, scanning 1, 2, 3, ... (0 when even 1 does not fit).
int64_t brute_force_max(int pre_steps, int64_t budget, int64_t upto) {
  for (int64_t b = 1; b <= upto; ++b)
    if (!fits_fresh(budget, b, pre_steps)) return b - 1;
  return upto;
}

bool same_bits(const AnyTensor& a, const AnyTensor& b) {
  if (!(a.shape() == b.shape()) || a.dtype() != b.dtype()) return false;
  AnyTensor ha = a.detach().to(Device::cpu()), hb = b.detach().to(Device::cpu());
  return std::memcmp(ha.data_ptr(), hb.data_ptr(), ha.nbytes()) == 0;
}

// Everything a trial must leave as it was: parameter values, optimizer state, generator.
struct StateCopy {
  std::vector<AnyTensor> params;
  optim::OptimizerStateDict opt;
  uint64_t seed = 0, offset = 0;
  explicit StateCopy(const Rig& r) : opt(r.opt->state_dict()) {
    for (auto& p : r.model.parameters()) params.push_back(p.detach().clone());
    seed = default_generator().seed();
    offset = default_generator().offset();
  }
};

void check_restored(const StateCopy& before, const Rig& r) {
  auto params = r.model.parameters();
  REQUIRE(params.size() == before.params.size());
  int differing = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    differing += !same_bits(params[i], before.params[i]);
    CHECK_FALSE(params[i].grad().defined());  // gradients dropped
  }
  CHECK(differing == 0);
  const auto now = r.opt->state_dict();
  REQUIRE(now.state.size() == before.opt.state.size());
  for (const auto& [index, st] : before.opt.state) {
    REQUIRE(now.state.count(index) == 1);
    const auto& cur = now.state.at(index);
    REQUIRE(cur.size() == st.size());
    for (size_t k = 0; k < st.size(); ++k) {
      CHECK(cur[k].first == st[k].first);
      CHECK(same_bits(cur[k].second, st[k].second));
    }
  }
  REQUIRE(now.param_groups.size() == before.opt.param_groups.size());
  for (size_t g = 0; g < now.param_groups.size(); ++g)
    CHECK(now.param_groups[g].options == before.opt.param_groups[g].options);
  CHECK(default_generator().seed() == before.seed);
  CHECK(default_generator().offset() == before.offset);
}

constexpr int64_t kBudget = 256 * 1024;  // bytes above the rig's own memory

}  // namespace

TEST_CASE("batch-size finder: the exact largest batch of a brute-force scan, Adam state restored bitwise",
          "[train][batch_size_finder]") {
  const int64_t expected = brute_force_max(/*pre_steps=*/2, kBudget, 2000);
  INFO("brute force: largest batch " << expected);
  REQUIRE(expected > 8);
  REQUIRE(expected < 2000);
  CHECK_FALSE(fits_fresh(kBudget, expected + 5, 2));  // memory keeps growing past it

  Rig r(2);
  // The step should change what the finder must restore.
  r.opt->param_groups()[0]["lr"] = 0.05;
  const StateCopy before(r);
  REQUIRE_FALSE(before.opt.state.empty());
  train::BatchSizeResult found;
  {
    MemoryLimit limit(Device::cpu(), kBudget);
    found = train::find_max_batch_size([&](int64_t b) { r.step(b); }, r.model, *r.opt, {.margin = 0.9});
  }
  CHECK(found.max_batch_size == expected);
  CHECK(found.batch_size == static_cast<int64_t>(expected * 9 / 10));
  CHECK_FALSE(found.reached_cap);
  check_restored(before, r);
  // Doubling from 1, then bisection: the first failure is the first power of two above the answer.
  REQUIRE(found.trials.size() >= 3);
  CHECK(found.trials[0].batch_size == 1);
  CHECK(found.trials[1].batch_size == 2);
  int failures = 0;
  for (const auto& t : found.trials) {
    failures += !t.fit;
    CHECK(t.fit == (t.batch_size <= expected));
    CHECK(t.peak_bytes > 0);
  }
  CHECK(failures >= 1);
  WARN("batch-size finder, cpu, budget " << kBudget / 1024 << " KiB: largest batch " << found.max_batch_size
       << " after " << found.trials.size() << " trials, result with margin 0.9: " << found.batch_size);
}

TEST_CASE("batch-size finder: a fresh Adam gets no state, and a too-large initial size bisects downward",
          "[train][batch_size_finder]") {
  const int64_t expected = brute_force_max(/*pre_steps=*/0, kBudget, 2000);
  REQUIRE(expected > 8);
  Rig r(0);
  const StateCopy before(r);
  REQUIRE(before.opt.state.empty());
  train::BatchSizeResult found;
  {
    MemoryLimit limit(Device::cpu(), kBudget);
    found = train::find_max_batch_size([&](int64_t b) { r.step(b); }, r.model, *r.opt,
                                       {.initial_batch_size = 4 * expected + 3, .max_batch_size = 100000});
  }
  CHECK(found.max_batch_size == expected);
  CHECK_FALSE(found.trials.front().fit);
  for (auto& p : r.model.parameters()) CHECK(r.opt->state(p) == nullptr);
  check_restored(before, r);
}

TEST_CASE("batch-size finder: the cap is honoured and steps_per_trial runs each size that often",
          "[train][batch_size_finder]") {
  Rig r(1);
  const StateCopy before(r);
  std::vector<int64_t> calls;
  auto found = train::find_max_batch_size(
      [&](int64_t b) {
        calls.push_back(b);
        r.step(b);
      },
      r.model, *r.opt, {.initial_batch_size = 3, .max_batch_size = 40, .steps_per_trial = 2});
  CHECK(calls == std::vector<int64_t>{3, 3, 6, 6, 12, 12, 24, 24, 40, 40});
  CHECK(found.max_batch_size == 40);
  CHECK(found.reached_cap);
  CHECK(found.batch_size == 36);
  check_restored(before, r);

  calls.clear();
  found = train::find_max_batch_size([&](int64_t b) { calls.push_back(b); }, {.max_batch_size = 32, .margin = 1.0});
  CHECK(calls == std::vector<int64_t>{1, 2, 4, 8, 16, 32});
  CHECK(found.batch_size == 32);
}

TEST_CASE("batch-size finder: the margin rounds down and never goes below 1", "[train][batch_size_finder]") {
  // A step that "fits" up to 37 by throwing OutOfMemory above it.
  auto step = [](int64_t b) {
    if (b > 37) throw OutOfMemory("pretend: out of memory", b, 0, 37);
  };
  CHECK(train::find_max_batch_size(step, {.margin = 0.9}).batch_size == 33);
  CHECK(train::find_max_batch_size(step, {.margin = 0.75}).batch_size == 27);
  CHECK(train::find_max_batch_size(step, {.margin = 1.0}).batch_size == 37);
  CHECK(train::find_max_batch_size(step, {.margin = 0.01}).batch_size == 1);
  auto found = train::find_max_batch_size(step, {.initial_batch_size = 5, .margin = 0.5});
  CHECK(found.max_batch_size == 37);
  CHECK(found.batch_size == 18);
  // 5, 10, 20, 40 (fails), then bisection between 20 and 40: 30, 35, 37, 38 (fails).
  CHECK(found.trials.size() == 8);

  CHECK_THROWS_AS(train::find_max_batch_size(step, {.margin = 0.0}), ValueError);
  CHECK_THROWS_AS(train::find_max_batch_size(step, {.margin = 1.5}), ValueError);
  CHECK_THROWS_AS(train::find_max_batch_size(step, {.initial_batch_size = 0}), ValueError);
  CHECK_THROWS_WITH(train::find_max_batch_size(step, {.initial_batch_size = 64, .max_batch_size = 32}),
                    Contains("max_batch_size (32) must be >= initial_batch_size (64)"));
}

TEST_CASE("batch-size finder: exceptions other than OutOfMemory propagate, with the state restored",
          "[train][batch_size_finder]") {
  Rig r(2);
  const StateCopy before(r);
  std::vector<int64_t> calls;
  auto failing = [&](int64_t b) {
    calls.push_back(b);
    r.step(b);  // the update happens first: the finder must undo it
    if (b >= 8) throw ShapeError("pretend: a batch of " + std::to_string(b) + " does not match the data");
  };
  {
    MemoryLimit limit(Device::cpu(), kBudget);
    CHECK_THROWS_AS(train::find_max_batch_size(failing, r.model, *r.opt), ShapeError);
  }
  CHECK(calls == std::vector<int64_t>{1, 2, 4, 8});  // stopped at the first ShapeError
  check_restored(before, r);

  CHECK_THROWS_WITH(train::find_max_batch_size(
                        [&](int64_t b) {
                          r.step(b);
                          throw std::runtime_error("not an ember error");
                        },
                        r.model, *r.opt),
                    "not an ember error");
  check_restored(before, r);
}

TEST_CASE("batch-size finder: when not even a batch of 1 fits it throws OutOfMemory", "[train][batch_size_finder]") {
  Rig r(2);
  const StateCopy before(r);
  {
    MemoryLimit limit(Device::cpu(), 1024);  // less than one set of gradients
    CHECK_THROWS_AS(train::find_max_batch_size([&](int64_t b) { r.step(b); }, r.model, *r.opt), OutOfMemory);
    CHECK_THROWS_WITH(train::find_max_batch_size([&](int64_t b) { r.step(b); }, r.model, *r.opt,
                                                 {.initial_batch_size = 4}),
                      Contains("not even a batch of 1 fits on cpu"));
  }
  CHECK(memory_stats().limit_bytes == -1);
  check_restored(before, r);
}

TEST_CASE("batch-size finder: a module-only search restores parameters updated by the step",
          "[train][batch_size_finder]") {
  Rig r(0);
  const StateCopy before(r);
  auto sgd_step = [&](int64_t b) {
    auto x = Tensor<float>::randn({b, 32});
    sum(r.model(x)).backward();
    NoGradGuard no_grad;
    for (auto& p : r.model.parameters()) p.copy_(op::sub(p, op::mul(p.grad(), 0.1)));
  };
  train::BatchSizeResult found;
  {
    MemoryLimit limit(Device::cpu(), kBudget);
    found = train::find_max_batch_size(sgd_step, r.model);
  }
  CHECK(found.max_batch_size > 1);
  check_restored(before, r);
}

TEST_CASE("batch-size finder: a real search on cuda:0 under a memory limit", "[train][batch_size_finder][cuda]") {
  EMBER_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const int64_t budget = 16 << 20;  // 16 MiB above the rig
  Rig r(2, gpu, 256, 1024);
  const StateCopy before(r);
  train::BatchSizeResult found;
  {
    MemoryLimit limit(gpu, budget);
    found = train::find_max_batch_size([&](int64_t b) { r.step(b); }, r.model, *r.opt, {.device = gpu});
  }
  CHECK(memory_stats(gpu).limit_bytes == -1);
  REQUIRE(found.max_batch_size >= 1);
  check_restored(before, r);
  // Exact: the answer fits a fresh rig and one more does not.
  CHECK(fits_fresh(budget, found.max_batch_size, 2, gpu, 256, 1024));
  CHECK_FALSE(fits_fresh(budget, found.max_batch_size + 1, 2, gpu, 256, 1024));
  WARN("batch-size finder, cuda:0, budget 16 MiB: largest batch " << found.max_batch_size << " after "
       << found.trials.size() << " trials");
}
