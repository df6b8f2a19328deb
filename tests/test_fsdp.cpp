// Fully sharded data parallelism (dist/fsdp.hpp) with ThreadProcessGroup: ZeRO-2 and ZeRO-3
// against DataParallel on the same data, step by step. The rank threads record numbers; the test
// thread checks them after join (Catch2's assertions are not thread-safe).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <thread>

#include "ember/dist/data_parallel.hpp"
#include "ember/dist/fsdp.hpp"
#include "ember/dist/thread_group.hpp"
#include "thread_ranks.hpp"
#include "ember/ember.hpp"
#include "ember/nn/gpt.hpp"
#include "ember/nn/recompute.hpp"
#include "ember/train/trainer.hpp"
#include "temp_dir.hpp"

using namespace ember;

namespace {


template <class Fn>
void run_ranks(int world, Fn fn) {
  testing::run_thread_ranks(world, std::move(fn));
}

void init_params(nn::Module& m, uint64_t seed) {
  Generator gen(seed);
  NoGradGuard no_grad;
  for (auto& [n, p] : m.named_parameters()) {
    AnyTensor t = p;
    nn::init::uniform_(t, -0.5, 0.5, gen);
  }
}

// Four Linear layers: four units (the root has nothing).
std::shared_ptr<nn::Sequential> make_mlp(uint64_t seed) {
  auto m = std::make_shared<nn::Sequential>(
      std::make_shared<nn::Linear>(6, 16), std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(16, 15),
      std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(15, 7), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(7, 3));
  init_params(*m, seed);
  return m;
}

// Rows [r*b, (r+1)*b) of a deterministic batch for step s.
Tensor<float> rows(int64_t step, int64_t rank, int64_t b, int64_t width, uint64_t salt) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * step + 7 * salt + 1));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> all;
  for (int64_t i = 0; i < 64 * width; ++i) all.push_back(u(rng));
  std::vector<float> mine(all.begin() + rank * b * width, all.begin() + (rank + 1) * b * width);
  return Tensor<float>::from_vector(mine, {b, width});
}

enum class Mode { Ddp, Zero2, Zero3 };

struct RunResult {
  std::vector<std::vector<double>> losses;  // [rank][step]
  nn::StateDict final_state;                // rank 0's unsharded parameters after the last step
  std::vector<double> norms;                // rank 0's gradient norms (clipping runs)
};

struct RunOptions {
  int steps = 50;
  int64_t per_rank = 4;
  int accumulation = 1;        // micro-batches per step (no_sync on all but the last)
  double clip = 0;             // > 0: clip the global gradient norm
  bool recompute = false;      // nn::recompute around each layer call (custom net)
  std::optional<DType> param_dtype;
  bool sgd = false;
};

// A net whose forward recomputes each Linear (nn::recompute around a unit's call).
struct RecomputedNet : nn::ModuleBase<RecomputedNet> {
  std::shared_ptr<nn::Linear> a, b, c;
  RecomputedNet() {
    a = register_module("a", std::make_shared<nn::Linear>(6, 12));
    b = register_module("b", std::make_shared<nn::Linear>(12, 12));
    c = register_module("c", std::make_shared<nn::Linear>(12, 3));
  }
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    Tensor<T> h = nn::recompute([this](const Tensor<T>& v) { return Tensor<T>(tanh((*a)(v))); }, x);
    h = nn::recompute([this](const Tensor<T>& v) { return Tensor<T>(tanh((*b)(v))); }, h);
    return (*c)(h);
  }
};

RunResult train_run(Mode mode, int world, const RunOptions& o) {
  RunResult res;
  res.losses.assign(static_cast<size_t>(world), {});
  run_ranks(world, [&](int r, dist::ProcessGroup& g) {
    std::shared_ptr<nn::Module> model;
    if (o.recompute) {
      auto net = std::make_shared<RecomputedNet>();
      init_params(*net, 3);
      model = net;
    } else {
      model = make_mlp(3);
    }
    std::unique_ptr<dist::DataParallel> dp;
    std::unique_ptr<dist::FullyShardedDataParallel> fsdp;
    std::vector<AnyTensor> params;
    if (mode == Mode::Ddp) {
      dp = std::make_unique<dist::DataParallel>(model, g);
      params = model->parameters();
    } else {
      dist::FullyShardedOptions fo{.stage = mode == Mode::Zero2 ? 2 : 3, .param_dtype = o.param_dtype};
      if (o.recompute) fo.units = {"a", "b", "c"};
      fsdp = std::make_unique<dist::FullyShardedDataParallel>(model, g, fo);
      params = fsdp->parameters();
    }
    std::unique_ptr<optim::Optimizer> opt;
    if (o.sgd)
      opt = std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
    else
      opt = std::make_unique<optim::AdamW>(params, optim::AdamOptions{.lr = 1e-2, .weight_decay = 0.01});
    for (int s = 0; s < o.steps; ++s) {
      opt->zero_grad();
      double loss_sum = 0;
      for (int m = 0; m < o.accumulation; ++m) {
        const int64_t id = s * o.accumulation + m;
        Tensor<float> x = rows(id, r, o.per_rank, 6, 1), y = rows(id, r, o.per_rank, 3, 2);
        auto run = [&] {
          AnyTensor out = fsdp ? (*fsdp)(AnyTensor(x)) : (*dp)(AnyTensor(x));
          auto loss = nn::functional::mse_loss(Tensor<float>(out.dtype() == DType::Float32 ? out : out.to(DType::Float32)), y);
          loss_sum += loss.item();
          loss.backward();
        };
        if (m + 1 < o.accumulation) {
          if (fsdp) {
            auto guard = fsdp->no_sync();
            run();
          } else {
            auto guard = dp->no_sync();
            run();
          }
        } else {
          run();
        }
      }
      if (o.clip > 0) {
        const double n = fsdp ? fsdp->clip_grad_norm_(o.clip) : optim::clip_grad_norm_(params, o.clip);
        if (r == 0) res.norms.push_back(n);
      }
      opt->step();
      res.losses[static_cast<size_t>(r)].push_back(loss_sum / o.accumulation);
    }
    nn::StateDict sd;
    if (fsdp) {
      sd = fsdp->full_state_dict();
    } else {
      for (auto& [n, t] : model->state_dict()) sd.emplace_back(n, t.detach().clone());
    }
    if (r == 0) res.final_state = sd;
  });
  return res;
}

double rel_diff(double a, double b) { return std::abs(a - b) / std::max(1.0, std::max(std::abs(a), std::abs(b))); }

double max_state_diff(const nn::StateDict& a, const nn::StateDict& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].first == b[i].first);
    REQUIRE(a[i].second.shape() == b[i].second.shape());
    auto va = a[i].second.to_double_vector(), vb = b[i].second.to_double_vector();
    for (size_t k = 0; k < va.size(); ++k) worst = std::max(worst, rel_diff(va[k], vb[k]));
  }
  return worst;
}

double max_loss_diff(const RunResult& a, const RunResult& b) {
  double worst = 0;
  for (size_t r = 0; r < a.losses.size(); ++r)
    for (size_t s = 0; s < a.losses[r].size(); ++s) worst = std::max(worst, rel_diff(a.losses[r][s], b.losses[r][s]));
  return worst;
}

}  // namespace

TEST_CASE("FSDP: ZeRO-2 and ZeRO-3 give DataParallel's losses and parameters over 50 AdamW steps", "[fsdp]") {
  for (int world : {2, 3, 4}) {
    const RunResult ddp = train_run(Mode::Ddp, world, {});
    const RunResult z2 = train_run(Mode::Zero2, world, {});
    const RunResult z3 = train_run(Mode::Zero3, world, {});
    INFO("world " << world);
    REQUIRE(z3.losses[0].size() == 50);
    // The bound is 1e-6; here it is bitwise: ThreadProcessGroup sums every element in double
    // in rank order for DataParallel's all_reduce and for the reduce_scatter alike, and AdamW is
    // elementwise, so flattening into shards changes no rounding.
    CHECK(max_loss_diff(ddp, z2) == 0);
    CHECK(max_loss_diff(ddp, z3) == 0);
    CHECK(max_state_diff(ddp.final_state, z2.final_state) == 0);
    CHECK(max_state_diff(ddp.final_state, z3.final_state) == 0);
    CHECK(ddp.losses[0].back() < 0.8 * ddp.losses[0].front());  // it trains
  }
}

TEST_CASE("FSDP: gradient accumulation with no_sync, clipping by the global norm, SGD momentum", "[fsdp]") {
  RunOptions o{.steps = 12, .accumulation = 3, .clip = 0.05, .sgd = true};
  const RunResult ddp = train_run(Mode::Ddp, 3, o);
  const RunResult z3 = train_run(Mode::Zero3, 3, o);
  const RunResult z2 = train_run(Mode::Zero2, 3, o);
  CHECK(max_loss_diff(ddp, z3) <= 1e-6);
  CHECK(max_loss_diff(ddp, z2) <= 1e-6);
  CHECK(max_state_diff(ddp.final_state, z3.final_state) <= 1e-6);
  REQUIRE(ddp.norms.size() == 12);
  for (size_t i = 0; i < ddp.norms.size(); ++i) CHECK(rel_diff(ddp.norms[i], z3.norms[i]) <= 1e-6);
  CHECK(ddp.norms[0] > 0.05);  // the clipping did something
}

TEST_CASE("FSDP: units inside nn::recompute (gradient checkpointing)", "[fsdp]") {
  RunOptions o{.steps = 10, .recompute = true};
  const RunResult ddp = train_run(Mode::Ddp, 2, o);
  const RunResult z3 = train_run(Mode::Zero3, 2, o);
  const RunResult z2 = train_run(Mode::Zero2, 2, o);
  CHECK(max_loss_diff(ddp, z3) <= 1e-6);
  CHECK(max_loss_diff(ddp, z2) <= 1e-6);
  CHECK(max_state_diff(ddp.final_state, z3.final_state) <= 1e-6);
}

TEST_CASE("FSDP: bf16 gathered parameters keep fp32 master shards and train close to fp32", "[fsdp]") {
  RunOptions o{.steps = 20, .param_dtype = DType::BFloat16};
  const RunResult ddp = train_run(Mode::Ddp, 2, RunOptions{.steps = 20});
  const RunResult z3 = train_run(Mode::Zero3, 2, o);
  CHECK(max_loss_diff(ddp, z3) <= 0.05);
  CHECK(max_loss_diff(ddp, z3) > 0);  // bf16 does change the numbers
  for (auto& [n, t] : z3.final_state) CHECK(t.dtype() == DType::Float32);
}

TEST_CASE("FSDP: a GPT (blocks as units, the tied embeddings in the root) matches DataParallel", "[fsdp][gpt]") {
  const nn::GPTConfig cfg{.vocab_size = 24, .block_size = 8, .n_layer = 3, .n_head = 2, .n_embd = 16, .dropout = 0.0};
  auto ids = [](int64_t step, int64_t rank, uint64_t salt) {
    std::mt19937 rng(static_cast<uint32_t>(step * 31 + rank * 7 + salt));
    std::vector<int64_t> v;
    for (int i = 0; i < 2 * 8; ++i) v.push_back(static_cast<int64_t>(rng() % 24));
    return Tensor<int64_t>::from_vector(v, {2, 8});
  };
  auto run = [&](Mode mode, int world, int steps, std::vector<std::string>* units, std::vector<bool>* freed) {
    std::vector<std::vector<double>> losses(static_cast<size_t>(world));
    run_ranks(world, [&](int r, dist::ProcessGroup& g) {
      auto gpt = std::make_shared<nn::GPT>(cfg);
      init_params(*gpt, 9);
      std::unique_ptr<dist::DataParallel> dp;
      std::unique_ptr<dist::FullyShardedDataParallel> fsdp;
      std::vector<AnyTensor> params;
      if (mode == Mode::Ddp) {
        dp = std::make_unique<dist::DataParallel>(gpt, g);
        params = gpt->parameters();
      } else {
        fsdp = std::make_unique<dist::FullyShardedDataParallel>(gpt, g,
                                                                dist::FullyShardedOptions{.stage = mode == Mode::Zero2 ? 2 : 3});
        params = fsdp->parameters();
        if (r == 0 && units)
          for (size_t i = 0; i < fsdp->unit_count(); ++i) units->push_back(fsdp->unit_info(i).name);
      }
      optim::AdamW opt(params, {.lr = 3e-3});
      for (int s = 0; s < steps; ++s) {
        opt.zero_grad();
        Tensor<float> logits = (*gpt)(ids(s, r, 1));
        auto loss = nn::functional::cross_entropy(logits.reshape({-1, 24}), ids(s, r, 2).reshape({-1}));
        loss.backward();
        opt.step();
        losses[static_cast<size_t>(r)].push_back(loss.item());
      }
      if (r == 0 && freed && fsdp)
        for (size_t i = 0; i < fsdp->unit_count(); ++i) freed->push_back(!fsdp->is_gathered(i));
    });
    return losses;
  };
  std::vector<std::string> units;
  std::vector<bool> freed;
  auto ddp = run(Mode::Ddp, 2, 8, nullptr, nullptr);
  auto z3 = run(Mode::Zero3, 2, 8, &units, &freed);
  auto z2 = run(Mode::Zero2, 2, 8, nullptr, nullptr);
  CHECK(units == std::vector<std::string>{"h.0", "h.1", "h.2", ""});
  CHECK(freed == std::vector<bool>{true, true, true, true});  // stage 3 holds no gathered unit between steps
  for (size_t r = 0; r < 2; ++r)
    for (size_t s = 0; s < 8; ++s) {
      CHECK(rel_diff(ddp[r][s], z3[r][s]) <= 1e-6);
      CHECK(rel_diff(ddp[r][s], z2[r][s]) <= 1e-6);
    }
}

TEST_CASE("FSDP: full_state_dict has Module::state_dict's names, load_full_state_dict round-trips", "[fsdp]") {
  run_ranks(2, [&](int r, dist::ProcessGroup& g) {
    auto model = make_mlp(5);
    const nn::StateDict before = [&] {
      nn::StateDict sd;
      for (auto& [n, t] : model->state_dict()) sd.emplace_back(n, t.detach().clone());
      return sd;
    }();
    dist::FullyShardedDataParallel fsdp(model, g);
    const nn::StateDict full = fsdp.full_state_dict();
    if (max_state_diff(before, full) != 0) throw std::runtime_error("full_state_dict differs from the model's");
    // Load other values, check the forward uses them.
    auto other = make_mlp(6);
    nn::StateDict osd;
    for (auto& [n, t] : other->state_dict()) osd.emplace_back(n, t.detach().clone());
    fsdp.load_full_state_dict(osd);
    Tensor<float> x = rows(0, 0, 4, 6, 1);
    const auto want = (*other)(x).to_vector();
    const auto got = Tensor<float>(fsdp(AnyTensor(x))).to_vector();
    for (size_t i = 0; i < want.size(); ++i)
      if (std::abs(want[i] - got[i]) > 1e-6) throw std::runtime_error("forward after load_full_state_dict differs");
    (void)r;
  });
}

TEST_CASE("FSDP: persistent memory per rank is the shards' (ZeRO-3), measured with memory_stats", "[fsdp][memory]") {
  // 4 thread ranks in one process: memory_stats counts all four. Per-rank DDP holds a model,
  // gradients and AdamW's two moments (4 copies); ZeRO-3 holds a quarter of each.
  auto measure = [](Mode mode) {
    const int64_t base = memory_stats().current_bytes;
    int64_t held = 0;
    std::mutex mu;
    int64_t param_bytes = 0;
    run_ranks(4, [&](int r, dist::ProcessGroup& g) {
      auto m = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(64, 256), std::make_shared<nn::Tanh>(),
                                                std::make_shared<nn::Linear>(256, 256), std::make_shared<nn::Tanh>(),
                                                std::make_shared<nn::Linear>(256, 64));
      {
        std::lock_guard<std::mutex> lock(mu);
        if (r == 0) param_bytes = m->parameter_count() * 4;
      }
      std::unique_ptr<dist::DataParallel> dp;
      std::unique_ptr<dist::FullyShardedDataParallel> fsdp;
      std::vector<AnyTensor> params;
      if (mode == Mode::Ddp) {
        dp = std::make_unique<dist::DataParallel>(m, g, dist::DataParallelOptions{.gradient_as_bucket_view = true});
        params = m->parameters();
      } else {
        fsdp = std::make_unique<dist::FullyShardedDataParallel>(m, g);
        params = fsdp->parameters();
      }
      optim::AdamW opt(params, {.lr = 1e-3});
      for (int s = 0; s < 2; ++s) {
        Tensor<float> x = rows(s, r, 4, 64, 1);
        AnyTensor out = dp ? (*dp)(AnyTensor(x)) : (*fsdp)(AnyTensor(x));
        auto loss = op::mean(op::square(out));
        loss.backward();
        opt.step();
      }
      g.barrier();
      {
        std::lock_guard<std::mutex> lock(mu);
        if (r == 0) held = memory_stats().current_bytes - base;
      }
      g.barrier();
    });
    return std::pair<int64_t, int64_t>(held, param_bytes);
  };
  const auto [ddp, p] = measure(Mode::Ddp);
  const auto [z3, p3] = measure(Mode::Zero3);
  INFO("DDP " << ddp << " bytes, ZeRO-3 " << z3 << " bytes, one model " << p << " bytes");
  CHECK(ddp >= 4 * 4 * p);        // params + grads + 2 moments, on each of 4 ranks
  CHECK(z3 <= ddp / 4 + p / 8);   // a quarter, plus padding and small state
}

TEST_CASE("FSDP: bad options and models raise errors naming the problem", "[fsdp][errors]") {
  run_ranks(1, [&](int, dist::ProcessGroup& g) {
    auto model = make_mlp(1);
    auto expect = [](auto fn, const std::string& what) {
      try {
        fn();
      } catch (const Error& e) {
        if (std::string(e.what()).find(what) == std::string::npos)
          throw std::runtime_error("error '" + std::string(e.what()) + "' lacks '" + what + "'");
        return;
      }
      throw std::runtime_error("no error; expected one containing '" + what + "'");
    };
    expect([&] { dist::FullyShardedDataParallel f(model, g, {.stage = 1}); }, "stage must be 2 or 3");
    expect([&] { dist::FullyShardedDataParallel f(model, g, {.units = {"7"}}); }, "no module named '7'");
    auto nested = std::make_shared<nn::Sequential>(make_mlp(1), make_mlp(2));
    expect([&] { dist::FullyShardedDataParallel f(nested, g, {.units = {"0", "0.2"}}); },
           "unit '0.2' lies inside unit '0'");
    expect([&] { dist::FullyShardedDataParallel f(model, g, {.param_dtype = DType::Int32}); },
           "param_dtype must be floating");
    auto frozen = make_mlp(1);
    frozen->named_parameters()[0].second.set_requires_grad(false);
    expect([&] { dist::FullyShardedDataParallel f(frozen, g); }, "0.weight does not require grad");
    {
      dist::FullyShardedDataParallel f(model, g);
      expect([&] { dist::FullyShardedDataParallel f2(model, g); }, "already has a forward hook");
    }
  });
}

namespace {

// A classification set for the Trainer: 48 samples of 6 features, 3 classes.
std::shared_ptr<data::TensorDataset> class_data() {
  const int64_t n = 48;
  std::vector<float> x(static_cast<size_t>(n * 6));
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < 6; ++j) x[static_cast<size_t>(i * 6 + j)] = static_cast<float>(std::sin(0.37 * (i * 6 + j)));
    y[static_cast<size_t>(i)] = (i * 7) % 3;
  }
  return std::make_shared<data::TensorDataset>(std::vector<std::pair<std::string, AnyTensor>>{
      {"image", Tensor<float>::from_vector(x, {n, 6})}, {"label", Tensor<int64_t>::from_vector(y, {n})}});
}

struct TrainerRun {
  std::vector<std::vector<double>> losses;  // [rank][step]
  std::vector<double> val_loss;            // rank 0's validations
};

TrainerRun trainer_run(Mode mode, int world, train::Precision precision, int64_t accumulation) {
  TrainerRun out;
  out.losses.assign(static_cast<size_t>(world), {});
  auto ds = class_data();
  run_ranks(world, [&](int r, dist::ProcessGroup& g) {
    auto model = make_mlp(11);
    data::DataLoader loader(ds, {.batch_size = 4, .drop_last = true,
                                 .sampler = data::DistributedSampler(48, world, r, {.shuffle = true, .seed = 3})});
    data::DataLoader val(ds, {.batch_size = 8, .sampler = data::DistributedSampler(48, world, r, {.shuffle = false})});
    train::TrainerOptions o{.epochs = 2, .precision = precision,
                            .grad_scaler = {.init_scale = 1024.0, .growth_interval = 3},
                            .accumulation = accumulation, .clip_grad_norm = 0.5,
                            .validation = {.loader = &val}, .progress = {.enabled = false}};
    train::Trainer t(o);
    train::FitResult res;
    if (mode == Mode::Ddp) {
      dist::DataParallel dp(model, g);
      optim::AdamW opt(model->parameters(), {.lr = 1e-2});
      res = t.fit(dp, loader, opt, train::cross_entropy_loss());
    } else {
      dist::FullyShardedDataParallel fsdp(model, g, {.stage = mode == Mode::Zero2 ? 2 : 3});
      optim::AdamW opt(fsdp.parameters(), {.lr = 1e-2});
      res = t.fit(fsdp, loader, opt, train::cross_entropy_loss());
    }
    out.losses[static_cast<size_t>(r)] = res.train_losses;
    if (r == 0)
      for (const auto& e : res.history) out.val_loss.push_back(e.metrics.at("val/loss"));
  });
  return out;
}

}  // namespace

TEST_CASE("FSDP: the Trainer trains fully sharded as it trains DataParallel (accumulation, clipping, fp16, bf16)",
          "[fsdp][trainer]") {
  for (auto precision : {train::Precision::Fp32, train::Precision::Fp16, train::Precision::Bf16}) {
    INFO("precision " << train::precision_name(precision));
    const TrainerRun ddp = trainer_run(Mode::Ddp, 2, precision, 2);
    for (Mode mode : {Mode::Zero2, Mode::Zero3}) {
      const TrainerRun z = trainer_run(mode, 2, precision, 2);
      REQUIRE(z.losses[0].size() == ddp.losses[0].size());
      REQUIRE(z.losses[0].size() == 6);  // 2 epochs x 24 samples per rank / (4 x 2)
      const double tol = precision == train::Precision::Fp32 ? 1e-6 : 1e-3;
      for (size_t r = 0; r < 2; ++r)
        for (size_t s = 0; s < z.losses[r].size(); ++s) CHECK(rel_diff(z.losses[r][s], ddp.losses[r][s]) <= tol);
      REQUIRE(z.val_loss.size() == 2);
      for (size_t i = 0; i < 2; ++i) CHECK(rel_diff(z.val_loss[i], ddp.val_loss[i]) <= tol);
    }
  }
}

TEST_CASE("FSDP: forward without grad, gather_full_parameters serves GPT generation, a bypassed root hook is an "
          "error after a step", "[fsdp][gpt]") {
  const nn::GPTConfig cfg{.vocab_size = 16, .block_size = 12, .n_layer = 2, .n_head = 2, .n_embd = 8, .dropout = 0.0};
  std::vector<int> failures(2, 0);
  std::vector<std::string> errors(2), released(2);
  run_ranks(2, [&](int r, dist::ProcessGroup& g) {
    {  // Stage 3 frees the root after the step: a forward past the hooks meets released memory.
      auto gpt = std::make_shared<nn::GPT>(cfg);
      dist::FullyShardedDataParallel fsdp(gpt, g);
      optim::SGD opt(fsdp.parameters(), {.lr = 0.1});
      const auto ids = Tensor<int64_t>::from_vector({1, 2, 3}, {1, 3});
      op::mean(op::square(AnyTensor((*gpt)(ids)))).backward();
      opt.step();
      try {
        (void)gpt->forward(ids);
      } catch (const ValueError& e) {
        released[static_cast<size_t>(r)] = e.what();
      }
    }
    auto gpt = std::make_shared<nn::GPT>(cfg);
    init_params(*gpt, 4);
    auto reference = std::make_shared<nn::GPT>(cfg);
    init_params(*reference, 4);
    int& bad = failures[static_cast<size_t>(r)];
    dist::FullyShardedDataParallel fsdp(gpt, g, {.stage = 2});  // (stage 3 is the same up to the bypass)
    const auto ids = Tensor<int64_t>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
    {
      NoGradGuard no_grad;
      const auto got = Tensor<float>(fsdp(AnyTensor(ids))).to_vector();
      const auto want = (*reference)(ids).to_vector();
      for (size_t i = 0; i < want.size(); ++i) bad += std::abs(got[i] - want[i]) > 1e-6;
    }
    {
      // Generation calls the blocks' forward() with a cache, past their hooks: gather everything.
      auto full = fsdp.gather_full_parameters();
      for (size_t i = 0; i < fsdp.unit_count(); ++i) bad += !fsdp.is_gathered(i);
      const auto a = gpt->generate(ids, {.max_new_tokens = 4, .temperature = 0.0});
      const auto b = reference->generate(ids, {.max_new_tokens = 4, .temperature = 0.0});
      bad += a.to_vector() != b.to_vector();
    }
    // One step through the hooks, then a typed forward() that skips the root's hook.
    optim::SGD opt(fsdp.parameters(), {.lr = 0.1});
    auto loss = op::mean(op::square(AnyTensor((*gpt)(ids))));
    loss.backward();
    opt.step();
    try {
      (void)gpt->forward(ids);
    } catch (const DistributedError& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
  });
  CHECK(failures == std::vector<int>{0, 0});
  for (const std::string& e : errors) {
    CHECK_THAT(e, Catch::Contains("the root module's own parameters (wte.weight, ...) were not gathered"));
    CHECK_THAT(e, Catch::Contains("model->forward(x)"));
  }
  for (const std::string& e : released) CHECK_THAT(e, Catch::Contains("a tensor's memory is released"));
}

TEST_CASE("FSDP: stage 3 frees every unit after a forward without grad and between steps", "[fsdp]") {
  run_ranks(2, [&](int r, dist::ProcessGroup& g) {
    auto model = make_mlp(2);
    dist::FullyShardedDataParallel fsdp(model, g);
    auto gathered = [&] {
      int n = 0;
      for (size_t i = 0; i < fsdp.unit_count(); ++i) n += fsdp.is_gathered(i);
      return n;
    };
    if (fsdp.unit_count() != 4) throw std::runtime_error("expected 4 units (the four Linear layers)");
    if (gathered() != 0) throw std::runtime_error("gathered after construction");
    {
      NoGradGuard no_grad;
      (void)fsdp(AnyTensor(rows(0, r, 2, 6, 1)));
    }
    if (gathered() != 0) throw std::runtime_error("gathered after a forward without grad");
    AnyTensor loss = op::mean(op::square(fsdp(AnyTensor(rows(0, r, 2, 6, 1)))));
    if (gathered() != 0) throw std::runtime_error("gathered after a forward with grad (each unit frees after its forward)");
    loss.backward();
    if (gathered() != 0) throw std::runtime_error("gathered after backward");
    for (const AnyTensor& p : model->parameters())
      if (p.grad().defined()) throw std::runtime_error("a module parameter kept a .grad (the shards hold them)");
    for (const AnyTensor& s : fsdp.parameters())
      if (!s.grad().defined()) throw std::runtime_error("a shard without .grad after backward");
  });
}

namespace {
// Unit "body" holds a Linear the forward never uses: its gradient counts as zero (DataParallel's rule).
struct WithUnused : nn::ModuleBase<WithUnused> {
  struct Body : nn::ModuleBase<Body> {
    std::shared_ptr<nn::Linear> used, unused;
    Body() {
      used = register_module("used", std::make_shared<nn::Linear>(6, 5));
      unused = register_module("unused", std::make_shared<nn::Linear>(5, 5));
    }
    template <Element T>
    Tensor<T> forward(const Tensor<T>& x) {
      return tanh((*used)(x));
    }
    std::string type_name() const override { return "Body"; }
  };
  std::shared_ptr<Body> body;
  std::shared_ptr<nn::Linear> head;
  WithUnused() {
    body = register_module("body", std::make_shared<Body>());
    head = register_module("head", std::make_shared<nn::Linear>(5, 3));
  }
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    return (*head)((*body)(x));
  }
};
}  // namespace

TEST_CASE("FSDP: a parameter no rank uses gets a zero gradient, as under DataParallel", "[fsdp]") {
  auto run = [](Mode mode) {
    std::vector<std::vector<double>> params(2);
    run_ranks(2, [&](int r, dist::ProcessGroup& g) {
      auto model = std::make_shared<WithUnused>();
      init_params(*model, 8);
      std::unique_ptr<dist::DataParallel> dp;
      std::unique_ptr<dist::FullyShardedDataParallel> fsdp;
      std::vector<AnyTensor> ps;
      if (mode == Mode::Ddp) {
        dp = std::make_unique<dist::DataParallel>(model, g);
        ps = model->parameters();
      } else {
        fsdp = std::make_unique<dist::FullyShardedDataParallel>(model, g, dist::FullyShardedOptions{.stage = 3, .units = {"body"}});
        ps = fsdp->parameters();
      }
      optim::SGD opt(ps, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});  // decay moves unused weights too
      for (int s = 0; s < 4; ++s) {
        opt.zero_grad();
        AnyTensor x = rows(s, r, 3, 6, 1);
        AnyTensor out = fsdp ? (*fsdp)(x) : (*dp)(x);
        op::mean(op::square(out)).backward();
        opt.step();
      }
      nn::StateDict sd = fsdp ? fsdp->full_state_dict() : model->state_dict();
      for (auto& [n, t] : sd)
        for (double v : t.to_double_vector()) params[static_cast<size_t>(r)].push_back(v);
    });
    return params;
  };
  const auto ddp = run(Mode::Ddp);
  const auto z3 = run(Mode::Zero3);
  REQUIRE(ddp[0].size() == z3[0].size());
  for (size_t i = 0; i < ddp[0].size(); ++i) CHECK(z3[0][i] == ddp[0][i]);
  CHECK(z3[0] == z3[1]);
}

TEST_CASE("FSDP: the Trainer writes sharded checkpoints and resumes 4 ranks' run on 2 (resharded)", "[fsdp][trainer]") {
  testing::TempDir tmp("ember-fsdp-trainer-");
  auto ds = class_data();
  // Per step, the mean of the ranks' losses: the global batch's loss (equal shares).
  auto fit = [&](int world, int64_t batch, int64_t epochs, const std::filesystem::path& dir, int stage) {
    std::vector<std::vector<double>> losses(static_cast<size_t>(world));
    std::vector<int64_t> start(static_cast<size_t>(world));
    run_ranks(world, [&](int r, dist::ProcessGroup& g) {
      auto model = make_mlp(11);
      data::DataLoader loader(ds, {.batch_size = batch, .drop_last = true,
                                   .sampler = data::DistributedSampler(48, world, r, {.shuffle = true, .seed = 3})});
      train::Trainer t({.epochs = epochs, .checkpoint = {.dir = dir, .every_epochs = 1}, .progress = {.enabled = false}});
      dist::FullyShardedDataParallel fsdp(model, g, {.stage = stage});
      optim::AdamW opt(fsdp.parameters(), {.lr = 1e-2});
      train::FitResult res = t.fit(fsdp, loader, opt, train::cross_entropy_loss());
      losses[static_cast<size_t>(r)] = res.train_losses;
      start[static_cast<size_t>(r)] = res.start_step;
    });
    std::vector<double> mean(losses[0].size(), 0.0);
    for (auto& l : losses)
      for (size_t s = 0; s < l.size(); ++s) mean[s] += l[s] / world;
    return std::pair(mean, start);
  };
  for (int stage : {3, 2}) {
    INFO("stage " << stage);
    const auto [full, s0] = fit(4, 4, 3, tmp.path / ("full" + std::to_string(stage)), stage);
    REQUIRE(full.size() == 9);
    const std::filesystem::path dir = tmp.path / ("run" + std::to_string(stage));
    const auto [first, s1] = fit(4, 4, 2, dir, stage);
    REQUIRE(first.size() == 6);
    REQUIRE(std::filesystem::exists(dir / "step-6" / "params.rank3.safetensors"));
    const auto [second, s2] = fit(2, 8, 3, dir, stage);  // the same global batch on half the ranks
    CHECK(s2 == std::vector<int64_t>{6, 6});
    REQUIRE(second.size() == 3);
    for (size_t i = 0; i < 6; ++i) CHECK(first[i] == full[i]);
    // Steps 7-9 on 2 ranks: the same global batches; the loss and gradient means are taken in
    // another order (2 ranks' means of 8 against 4 ranks' means of 4), hence the tolerance.
    for (size_t i = 0; i < 3; ++i) CHECK(rel_diff(second[i], full[6 + i]) <= 1e-6);
    REQUIRE(std::filesystem::exists(dir / "step-9" / "params.rank1.safetensors"));
    CHECK_FALSE(std::filesystem::exists(dir / "step-9" / "params.rank2.safetensors"));
  }
}
