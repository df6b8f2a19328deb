// Data parallelism with ThreadProcessGroup: N ranks as N threads of this process, each running
// the same training code on its slice of the batch. Catch2's assertions are not thread-safe, so
// the rank threads only record numbers; the test thread checks them after join.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <optional>
#include <random>
#include <thread>

#include "ember/data/distributed_sampler.hpp"
#include "ember/dist/data_parallel.hpp"
#include "ember/dist/same_settings.hpp"
#include "ember/dist/thread_group.hpp"
#include "ember/dist/zero.hpp"
#include "ember/ember.hpp"
#include "pretend_gpu.hpp"

using namespace ember;

namespace {

using Groups = std::vector<std::shared_ptr<dist::ThreadProcessGroup>>;

// Runs fn(rank, group) on `world` threads; returns each rank's exception (or null).
template <class Fn>
std::vector<std::exception_ptr> run_ranks(const Groups& groups, Fn fn) {
  std::vector<std::exception_ptr> errors(groups.size());
  std::vector<std::thread> ts;
  for (size_t r = 0; r < groups.size(); ++r)
    ts.emplace_back([&, r] {
      try {
        fn(static_cast<int>(r), *groups[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  return errors;
}

void rethrow_any(const std::vector<std::exception_ptr>& errors) {
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Parameters from an explicit generator (the default one is shared by the threads).
void init_params(nn::Module& m, uint64_t seed) {
  Generator gen(seed);
  NoGradGuard no_grad;
  for (auto& [n, p] : m.named_parameters()) {
    AnyTensor t = p;
    nn::init::uniform_(t, -0.5, 0.5, gen);
  }
}

std::shared_ptr<nn::Sequential> make_mlp(uint64_t seed, int64_t hidden = 8, DType dt = DType::Float32) {
  nn::LinearOptions o;
  o.dtype = dt;
  auto m = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(4, hidden, o), std::make_shared<nn::Tanh>(),
                                            std::make_shared<nn::Linear>(hidden, 3, o));
  init_params(*m, seed);
  return m;
}

struct Data {
  std::vector<float> x, y;  // N x 4, N x 3
  int64_t n;
};
Data make_data(int64_t n, uint64_t seed) {
  Data d{{}, {}, n};
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < n * 4; ++i) d.x.push_back(u(rng));
  for (int64_t i = 0; i < n * 3; ++i) d.y.push_back(u(rng));
  return d;
}
std::pair<FloatTensor, FloatTensor> rows(const Data& d, const std::vector<int64_t>& idx) {
  std::vector<float> x, y;
  for (int64_t i : idx) {
    x.insert(x.end(), d.x.begin() + i * 4, d.x.begin() + i * 4 + 4);
    y.insert(y.end(), d.y.begin() + i * 3, d.y.begin() + i * 3 + 3);
  }
  const int64_t b = static_cast<int64_t>(idx.size());
  return {FloatTensor::from_vector(x, {b, 4}), FloatTensor::from_vector(y, {b, 3})};
}
// The epoch's order: the same on every rank (seeded by the epoch, as DistributedSampler does).
std::vector<int64_t> permutation(int64_t n, int epoch) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  std::mt19937 rng(static_cast<uint32_t>(1000 + epoch));
  std::shuffle(p.begin(), p.end(), rng);
  return p;
}
// Rank r's contiguous slice of a global batch.
std::vector<int64_t> slice_of(const std::vector<int64_t>& batch, int r, int world) {
  const size_t b = batch.size(), w = static_cast<size_t>(world), rr = static_cast<size_t>(r);
  const size_t per = b / w, extra = b % w;
  const size_t begin = rr * per + std::min(rr, extra), end = begin + per + (rr < extra ? 1 : 0);
  return {batch.begin() + static_cast<std::ptrdiff_t>(begin), batch.begin() + static_cast<std::ptrdiff_t>(end)};
}

AnyTensor loss_of(nn::Module& m, const FloatTensor& x, const FloatTensor& y) {
  return nn::functional::mse_loss(FloatTensor(m.forward_any(x)), y);
}

// Largest max|a - b| / max|b| (per tensor) over all parameters' gradients (or values): fp32 sums
// in another order differ by a few ulps of the tensor's largest element, not of each element.
double max_rel(const std::vector<AnyTensor>& a, const std::vector<AnyTensor>& b, bool grads) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    AnyTensor ta = grads ? a[i].grad() : a[i], tb = grads ? b[i].grad() : b[i];
    if (!ta.defined() || !tb.defined()) return INFINITY;
    auto va = ta.to_double_vector(), vb = tb.to_double_vector();
    double scale = 0.0;
    for (double v : vb) scale = std::max(scale, std::fabs(v));
    double diff = 0.0;
    for (size_t k = 0; k < va.size(); ++k) diff = std::max(diff, std::fabs(va[k] - vb[k]));
    if (diff > 0.0) worst = std::max(worst, diff / std::max(scale, 1e-30));
  }
  return worst;
}

}  // namespace

TEST_CASE("ThreadProcessGroup collectives: all_reduce, broadcast, reduce_scatter, all_gather", "[dist]") {
  for (int world : {2, 3}) {
    auto groups = dist::ThreadProcessGroup::create(world);
    std::vector<std::vector<double>> sum(world), avg(world), mx(world), bc(world), rs(world), ag(world), ints(world);
    rethrow_any(run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
      AnyTensor a = FloatTensor::from_vector({float(r), float(r + 1), -float(r)});
      g.all_reduce(a, dist::ReduceOp::Sum);
      sum[r] = a.to_double_vector();
      AnyTensor b = DoubleTensor::from_vector({double(r), 1.0});
      g.all_reduce(b, dist::ReduceOp::Avg);
      avg[r] = b.to_double_vector();
      AnyTensor c = IntTensor::from_vector({r, -r});
      g.all_reduce(c, dist::ReduceOp::Max);
      mx[r] = c.to_double_vector();
      AnyTensor d = HalfTensor::from_vector({half(float(r + 10))});
      g.broadcast(d, 1);
      bc[r] = d.to_double_vector();
      std::vector<int64_t> in;
      for (int k = 0; k < 2 * g.size(); ++k) in.push_back(k + 100 * r);
      AnyTensor out = LongTensor::zeros({2});
      g.reduce_scatter(out, LongTensor::from_vector(in), dist::ReduceOp::Sum);
      rs[r] = out.to_double_vector();
      AnyTensor all = FloatTensor::zeros({g.size()});
      g.all_gather(all, FloatTensor::from_vector({float(r) * 2}));
      ag[r] = all.to_double_vector();
      g.barrier();
    }));
    const double s = world * (world - 1) / 2.0;
    for (int r = 0; r < world; ++r) {
      CHECK(sum[r] == std::vector<double>{s, s + world, -s});
      CHECK(avg[r] == std::vector<double>{s / world, 1.0});
      CHECK(mx[r] == std::vector<double>{double(world - 1), 0.0});
      CHECK(bc[r] == std::vector<double>{11.0});
      const double base = 100.0 * s;
      CHECK(rs[r] == std::vector<double>{world * (2.0 * r) + base, world * (2.0 * r + 1) + base});
      std::vector<double> want;
      for (int k = 0; k < world; ++k) want.push_back(2.0 * k);
      CHECK(ag[r] == want);
    }
  }
}

TEST_CASE("ThreadProcessGroup: a missing rank is a DistributedError after the timeout, a mismatch an error", "[dist]") {
  dist::ProcessGroupOptions opt;
  opt.timeout = std::chrono::milliseconds(200);
  {
    auto groups = dist::ThreadProcessGroup::create(3, opt);
    std::vector<double> elapsed(3, 0.0);
    auto errors = run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
      if (r == 2) return;  // never arrives
      auto t0 = std::chrono::steady_clock::now();
      AnyTensor a = FloatTensor::ones({4});
      auto work = g.all_reduce_async(a);
      if (work->is_completed()) throw std::logic_error("completed without rank 2");
      try {
        work->wait();
      } catch (...) {
        elapsed[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        throw;
      }
    });
    for (int r = 0; r < 2; ++r) {
      REQUIRE(errors[r]);
      CHECK_THROWS_AS(std::rethrow_exception(errors[r]), DistributedError);
      CHECK_THROWS_WITH(std::rethrow_exception(errors[r]), Catch::Contains("rank(s) 2"));
      CHECK(elapsed[r] >= 0.19);
      CHECK(elapsed[r] < 5.0);
    }
    CHECK_FALSE(errors[2]);
  }
  {
    auto groups = dist::ThreadProcessGroup::create(2, opt);
    auto errors = run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
      AnyTensor a = FloatTensor::ones({r == 0 ? 4 : 5});
      g.all_reduce(a);
    });
    for (auto& e : errors) {
      REQUIRE(e);
      CHECK_THROWS_AS(std::rethrow_exception(e), DistributedError);
    }
  }
}

TEST_CASE("DataParallel gradients equal single-process gradients of the whole batch, 2 and 3 ranks", "[dist]") {
  for (int world : {2, 3}) {
    INFO("world " << world);
    const Data data = make_data(36, 7);
    const int64_t global_batch = 6;
    const int iterations = 8;
    auto groups = dist::ThreadProcessGroup::create(world);
    std::vector<std::vector<double>> grad_err(world), param_err(world);
    std::vector<size_t> buckets(world);
    rethrow_any(run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
      auto base = make_mlp(1);
      auto replica = make_mlp(1 + static_cast<uint64_t>(r));  // differs: the broadcast fixes it
      // Tiny buckets: several all-reduces in flight during backward.
      dist::DataParallelOptions o;
      o.first_bucket_bytes = 64;
      o.bucket_cap_bytes = 128;
      dist::DataParallel dp(replica, g, o);
      buckets[r] = dp.bucket_count();
      param_err[r].push_back(max_rel(replica->parameters(), base->parameters(), false));
      optim::SGD base_opt(base->parameters(), {.lr = 0.1});
      optim::SGD opt(replica->parameters(), {.lr = 0.1});
      // Every rank's sampler (the baseline needs the whole batch: the union of the ranks' slices).
      const int64_t per_rank = global_batch / world;
      std::vector<data::DistributedSampler> samplers;
      for (int q = 0; q < world; ++q) samplers.emplace_back(data.n, world, q, data::DistributedSamplerOptions{.seed = 3});
      int it = 0;
      for (uint64_t epoch = 0; it < iterations; ++epoch) {
        std::vector<std::vector<int64_t>> idx;
        for (auto& smp : samplers) {
          smp.set_epoch(epoch);  // reshuffles
          idx.push_back(smp.indices());
        }
        for (int64_t s = 0; s + per_rank <= samplers[0].num_samples() && it < iterations; s += per_rank, ++it) {
          std::vector<int64_t> batch, mine;
          for (int q = 0; q < world; ++q)
            for (int64_t k = s; k < s + per_rank; ++k) {
              batch.push_back(idx[q][k]);
              if (q == r) mine.push_back(idx[q][k]);
            }
          auto [xb, yb] = rows(data, batch);
          base_opt.zero_grad();
          loss_of(*base, xb, yb).backward();
          auto [xs, ys] = rows(data, mine);
          opt.zero_grad();
          auto out = dp(xs);
          nn::functional::mse_loss(out, ys).backward();
          grad_err[r].push_back(max_rel(replica->parameters(), base->parameters(), true));
          base_opt.step();
          opt.step();
        }
      }
      param_err[r].push_back(max_rel(replica->parameters(), base->parameters(), false));
    }));
    for (int r = 0; r < world; ++r) {
      CHECK(buckets[r] >= 3);
      REQUIRE(grad_err[r].size() == static_cast<size_t>(iterations));
      for (double e : grad_err[r]) CHECK(e <= 1e-6);
      CHECK(param_err[r][0] == 0.0);
      CHECK(param_err[r][1] <= 1e-5);
    }
  }
}

TEST_CASE("DataParallel no_sync: local gradients while accumulating, the global ones at the sync step", "[dist]") {
  const int world = 2, k = 3;
  const Data data = make_data(24, 11);
  auto groups = dist::ThreadProcessGroup::create(world);
  std::vector<std::vector<double>> err(world);
  rethrow_any(run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
    auto base = make_mlp(3);
    auto replica = make_mlp(3);
    dist::DataParallel dp(replica, g);
    auto perm = permutation(data.n, 0);
    for (int m = 0; m < k; ++m) {
      std::vector<int64_t> batch(perm.begin() + m * 8, perm.begin() + m * 8 + 8);
      auto [xb, yb] = rows(data, batch);
      loss_of(*base, xb, yb).backward();
      auto [xs, ys] = rows(data, slice_of(batch, r, world));
      if (m < k - 1) {
        auto guard = dp.no_sync();
        if (dp.require_backward_grad_sync()) throw std::logic_error("no_sync guard not in effect");
        loss_of(dp.module(), xs, ys).backward();
      } else {
        loss_of(dp.module(), xs, ys).backward();
      }
      err[r].push_back(max_rel(replica->parameters(), base->parameters(), true));
    }
  }));
  for (int r = 0; r < world; ++r) {
    REQUIRE(err[r].size() == static_cast<size_t>(k));
    CHECK(err[r][0] > 1e-3);  // only this rank's half of the batch
    CHECK(err[r][1] > 1e-3);
    CHECK(err[r][2] <= 1e-6);  // the synchronising backward averaged the accumulated sums
  }
}

TEST_CASE("DataParallel with recomputation and an unused parameter", "[dist]") {
  // Recomputed first layer (its gradients arrive in a nested backward after the second
  // layer's), recomputed last layer (nested backward first), and an extra unused layer.
  struct Net : nn::Module {
    std::shared_ptr<nn::Linear> l1, l2, unused;
    bool recompute_first;
    explicit Net(bool first) : recompute_first(first) {
      l1 = register_module("l1", std::make_shared<nn::Linear>(4, 8));
      l2 = register_module("l2", std::make_shared<nn::Linear>(8, 3));
      unused = register_module("unused", std::make_shared<nn::Linear>(2, 2));
    }
    AnyTensor forward_any(const AnyTensor& x) override {
      auto a = l1, b = l2;
      if (recompute_first) {
        AnyTensor h = nn::recompute([a](const AnyTensor& v) { return op::tanh(a->forward_any(v)); }, x);
        return b->forward_any(h);
      }
      AnyTensor h = op::tanh(a->forward_any(x));
      return nn::recompute([b](const AnyTensor& v) { return b->forward_any(v); }, h);
    }
  };
  for (bool first : {true, false}) {
    INFO("recompute first layer " << first);
    const int world = 2;
    const Data data = make_data(16, 5);
    auto groups = dist::ThreadProcessGroup::create(world);
    std::vector<std::vector<double>> err(world);
    std::vector<double> unused_grad(world, -1.0);
    rethrow_any(run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
      auto base = std::make_shared<Net>(first);
      init_params(*base, 21);
      auto replica = std::make_shared<Net>(first);
      init_params(*replica, 21);
      dist::DataParallel dp(replica, g);
      for (int it = 0; it < 3; ++it) {
        auto perm = permutation(data.n, it);
        std::vector<int64_t> batch(perm.begin(), perm.begin() + 8);
        base->zero_grad();
        replica->zero_grad();
        auto [xb, yb] = rows(data, batch);
        loss_of(*base, xb, yb).backward();
        auto [xs, ys] = rows(data, slice_of(batch, r, world));
        loss_of(dp.module(), xs, ys).backward();
        std::vector<AnyTensor> used = {replica->l1->weight, replica->l1->bias, replica->l2->weight, replica->l2->bias};
        std::vector<AnyTensor> used_base = {base->l1->weight, base->l1->bias, base->l2->weight, base->l2->bias};
        err[r].push_back(max_rel(used, used_base, true));
      }
      AnyTensor ug = replica->unused->weight.grad();
      if (ug.defined()) {
        double mxv = 0.0;
        for (double v : ug.to_double_vector()) mxv = std::max(mxv, std::fabs(v));
        unused_grad[r] = mxv;
      }
    }));
    for (int r = 0; r < world; ++r) {
      REQUIRE(err[r].size() == 3);
      for (double e : err[r]) CHECK(e <= 1e-6);
      CHECK(unused_grad[r] == 0.0);  // treated as zero: a zero gradient
    }
  }
}

TEST_CASE("DataParallel: the uneven last batch finishes with identical gradients on every rank", "[dist]") {
  const int world = 3;
  const Data data = make_data(10, 13);  // batches of 6: the last has 4 samples (2, 1, 1 per rank)
  auto groups = dist::ThreadProcessGroup::create(world);
  std::vector<std::vector<std::vector<double>>> grads(world);
  std::vector<int> steps(world, 0);
  rethrow_any(run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
    auto replica = make_mlp(4);
    dist::DataParallel dp(replica, g);
    optim::SGD opt(replica->parameters(), {.lr = 0.05});
    auto perm = permutation(data.n, 0);
    for (int64_t s = 0; s < data.n; s += 6) {
      std::vector<int64_t> batch(perm.begin() + s, perm.begin() + std::min<int64_t>(s + 6, data.n));
      auto [xs, ys] = rows(data, slice_of(batch, r, world));
      opt.zero_grad();
      loss_of(dp.module(), xs, ys).backward();
      opt.step();
      ++steps[r];
    }
    for (auto& p : replica->parameters()) grads[r].push_back(p.grad().to_double_vector());
  }));
  for (int r = 0; r < world; ++r) {
    CHECK(steps[r] == 2);
    CHECK(grads[r] == grads[0]);
  }
  CHECK_FALSE(grads[0].empty());
}

TEST_CASE("DataParallel: a rank that stops makes the others throw DistributedError within the timeout", "[dist]") {
  const int world = 3;
  dist::ProcessGroupOptions opt;
  opt.timeout = std::chrono::milliseconds(300);
  auto groups = dist::ThreadProcessGroup::create(world, opt);
  const Data data = make_data(12, 17);
  std::vector<int> done(world, 0);
  std::vector<double> elapsed(world, 0.0);
  auto errors = run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
    auto replica = make_mlp(5);
    dist::DataParallel dp(replica, g);
    for (int it = 0; it < 3; ++it) {
      if (r == 2 && it == 1) return;  // this rank stops participating
      auto [xs, ys] = rows(data, {int64_t(r), int64_t(r + 3)});
      replica->zero_grad();
      auto t0 = std::chrono::steady_clock::now();
      try {
        loss_of(dp.module(), xs, ys).backward();
      } catch (...) {
        elapsed[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        throw;
      }
      ++done[r];
    }
  });
  CHECK_FALSE(errors[2]);
  CHECK(done[2] == 1);
  for (int r = 0; r < 2; ++r) {
    CHECK(done[r] == 1);
    REQUIRE(errors[r]);
    CHECK_THROWS_AS(std::rethrow_exception(errors[r]), DistributedError);
    CHECK(elapsed[r] >= 0.29);
    CHECK(elapsed[r] < 10.0);
  }
}

TEST_CASE("DataParallel: replicas with different models give a clear DistributedError", "[dist]") {
  SECTION("a different shape") {
    auto groups = dist::ThreadProcessGroup::create(2);
    auto errors = run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
      dist::DataParallel dp(make_mlp(1, r == 0 ? 8 : 9), g);
    });
    for (int r = 0; r < 2; ++r) {
      REQUIRE(errors[r]);
      CHECK_THROWS_AS(std::rethrow_exception(errors[r]), DistributedError);
      CHECK_THROWS_WITH(std::rethrow_exception(errors[r]),
                        Catch::Contains("parameter #0") && Catch::Contains("rank 1") && Catch::Contains("0.weight"));
    }
  }
  SECTION("an extra layer") {
    auto groups = dist::ThreadProcessGroup::create(3);
    auto errors = run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
      auto m = make_mlp(1);
      if (r == 2) m->push_back(std::make_shared<nn::Linear>(3, 3));
      dist::DataParallel dp(m, g);
    });
    for (int r = 0; r < 3; ++r) {
      REQUIRE(errors[r]);
      CHECK_THROWS_WITH(std::rethrow_exception(errors[r]),
                        Catch::Contains("rank 0 has 4 parameters, rank 2 has 6"));
    }
  }
}

TEST_CASE("ZeroRedundancyOptimizer: Adam on shards equals data-parallel Adam, with 1/world of the state", "[dist]") {
  for (int world : {2, 3}) {
    INFO("world " << world);
    const Data data = make_data(24, 19);
    auto groups = dist::ThreadProcessGroup::create(world);
    std::vector<double> err(world, INFINITY);
    std::vector<int64_t> zero_state(world), plain_state(world);
    int64_t mem_plain = 0, mem_zero = 0;
    rethrow_any(run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
      // Wide enough that the "step" scalars and the padding are small next to the moments.
      auto a = make_mlp(2, 64), b = make_mlp(2, 64);
      dist::DataParallel dp(a, g);
      // Weight decay (L2, coupled): without it Adam is blind to the scale of the gradients, and an
      // all-reduce that summed instead of averaging would go unnoticed.
      optim::Adam adam(a->parameters(), {.lr = 0.01, .weight_decay = 0.1});
      dist::ZeroRedundancyOptimizer zero(b->parameters(), g, [](std::vector<AnyTensor> ps) {
        return std::make_unique<optim::Adam>(std::move(ps), optim::AdamOptions{.lr = 0.01, .weight_decay = 0.1});
      });
      for (int it = 0; it < 5; ++it) {
        auto perm = permutation(data.n, it);
        std::vector<int64_t> batch(perm.begin(), perm.begin() + 6 * world);
        auto [xs, ys] = rows(data, slice_of(batch, r, world));
        adam.zero_grad();
        loss_of(dp.module(), xs, ys).backward();
        zero.zero_grad();
        loss_of(*b, xs, ys).backward();  // local gradients: zero.step() averages them
        // The first steps allocate the optimizer state: measure it with memory_stats (every
        // rank steps between two barriers, so the difference is all ranks' state).
        if (it == 0) {
          g.barrier();
          const int64_t m0 = memory_stats().current_bytes;
          g.barrier();
          adam.step();
          g.barrier();
          const int64_t m1 = memory_stats().current_bytes;
          g.barrier();
          zero.step();
          g.barrier();
          const int64_t m2 = memory_stats().current_bytes;
          g.barrier();
          if (r == 0) {
            mem_plain = m1 - m0;
            mem_zero = m2 - m1;
          }
        } else {
          adam.step();
          zero.step();
        }
      }
      err[r] = max_rel(b->parameters(), a->parameters(), false);
      zero_state[r] = zero.state_bytes();
      int64_t s = 0;
      for (auto& p : a->parameters())
        if (auto* st = adam.state(p))
          for (auto& [k, v] : *st) s += static_cast<int64_t>(v.nbytes());
      plain_state[r] = s;
    }));
    for (int r = 0; r < world; ++r) {
      CHECK(err[r] <= 1e-6);
      const double ratio = double(plain_state[r]) / double(zero_state[r]);
      CHECK(ratio > world * 0.95);
      CHECK(ratio < world * 1.05);
    }
    // memory_stats: all ranks' new state, plain vs sharded.
    const double mem_ratio = double(mem_plain) / double(mem_zero);
    INFO("memory_stats: plain Adam state " << mem_plain << " bytes, ZeRO-1 " << mem_zero);
    CHECK(mem_ratio > world * 0.9);
    CHECK(mem_ratio < world * 1.1);
  }
}

TEST_CASE("sync_found_inf: every rank skips the step when one rank found an inf", "[dist]") {
  const int world = 2;
  auto groups = dist::ThreadProcessGroup::create(world);
  const Data data = make_data(8, 23);
  std::vector<int> stepped(world, -1), found(world, -1);
  std::vector<double> scale(world), changed(world);
  rethrow_any(run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
    auto m = make_mlp(6);
    auto before = m->parameters()[0].to_double_vector();
    optim::SGD opt(m->parameters(), {.lr = 0.1});
    amp::GradScaler scaler;
    auto [xs, ys] = rows(data, {int64_t(r * 2), int64_t(r * 2 + 1)});
    scaler.scale(loss_of(*m, xs, ys)).backward();  // no DataParallel: the inf stays on rank 1
    if (r == 1) {
      AnyTensor gr = m->parameters()[0].grad();
      float inf = INFINITY;
      gr.backend().copy_from_host(gr.data_ptr(), &inf, sizeof(float));
    }
    found[r] = dist::sync_found_inf(scaler, opt, g) ? 1 : 0;
    stepped[r] = scaler.step(opt) ? 1 : 0;
    scaler.update();
    scale[r] = scaler.get_scale();
    changed[r] = m->parameters()[0].to_double_vector() == before ? 0.0 : 1.0;
  }));
  for (int r = 0; r < world; ++r) {
    CHECK(found[r] == 1);
    CHECK(stepped[r] == 0);
    CHECK(changed[r] == 0.0);
    CHECK(scale[r] == 32768.0);
  }
}

TEST_CASE("DataParallel with bfloat16 parameters: identical gradients on every rank, close to the whole batch", "[dist]") {
  const int world = 2;
  const Data data = make_data(8, 29);
  auto groups = dist::ThreadProcessGroup::create(world);
  std::vector<std::vector<double>> grads(world);
  std::vector<double> err(world);
  rethrow_any(run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
    auto base = make_mlp(8, 8, DType::BFloat16), replica = make_mlp(8, 8, DType::BFloat16);
    dist::DataParallel dp(replica, g);
    std::vector<int64_t> batch = {0, 1, 2, 3, 4, 5, 6, 7};
    auto [xb, yb] = rows(data, batch);
    auto bl = nn::functional::mse_loss(BFloat16Tensor(base->forward_any(xb.to<bfloat16>())), yb);
    bl.backward();
    auto [xs, ys] = rows(data, slice_of(batch, r, world));
    auto l = nn::functional::mse_loss(BFloat16Tensor(dp.forward_any(xs.to<bfloat16>())), ys);
    l.backward();
    for (auto& p : replica->parameters()) {
      REQUIRE(p.grad().dtype() == DType::BFloat16);
      auto v = p.grad().to_double_vector();
      grads[r].insert(grads[r].end(), v.begin(), v.end());
    }
    err[r] = max_rel(replica->parameters(), base->parameters(), true);
  }));
  CHECK(grads[0] == grads[1]);
  for (int r = 0; r < world; ++r) CHECK(err[r] <= 0.05);
}

namespace {
// A ProcessGroup that forwards to another and records, at each all_reduce_async, how many of the
// watched parameters already had a gradient and whether a backward pass was running.
class RecordingGroup : public dist::ProcessGroup {
 public:
  RecordingGroup(dist::ProcessGroup& inner, std::vector<AnyTensor> watched) : inner_(inner), watched_(std::move(watched)) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend_name() const override { return "recording"; }
  std::shared_ptr<dist::Work> all_reduce_async(AnyTensor& t, dist::ReduceOp op) override {
    int with_grad = 0;
    for (auto& p : watched_) with_grad += p.grad().defined() ? 1 : 0;
    grads_at_launch.push_back(with_grad);
    in_backward.push_back(autograd::detail::current_backward_callbacks() != nullptr);
    return inner_.all_reduce_async(t, op);
  }
  std::shared_ptr<dist::Work> broadcast_async(AnyTensor& t, int root) override { return inner_.broadcast_async(t, root); }
  std::shared_ptr<dist::Work> reduce_scatter_async(AnyTensor& o, const AnyTensor& i, dist::ReduceOp op) override {
    return inner_.reduce_scatter_async(o, i, op);
  }
  std::shared_ptr<dist::Work> all_gather_async(AnyTensor& o, const AnyTensor& i) override {
    return inner_.all_gather_async(o, i);
  }
  void barrier() override { inner_.barrier(); }
  std::vector<int> grads_at_launch;
  std::vector<bool> in_backward;

 private:
  dist::ProcessGroup& inner_;
  std::vector<AnyTensor> watched_;
};
}  // namespace

TEST_CASE("DataParallel buckets: reverse registration order, all-reduces start during backward", "[dist]") {
  const int world = 2;
  const Data data = make_data(8, 31);
  auto groups = dist::ThreadProcessGroup::create(world);
  std::vector<std::vector<int>> launches(world);
  std::vector<std::vector<bool>> during(world);
  std::vector<std::vector<std::string>> first_bucket(world);
  std::vector<size_t> nbuckets(world);
  rethrow_any(run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
    auto m = make_mlp(9);
    RecordingGroup rec(g, m->parameters());
    dist::DataParallelOptions o;
    o.first_bucket_bytes = 16;  // 2.bias (12 bytes) alone
    o.bucket_cap_bytes = 100;
    dist::DataParallel dp(m, rec, o);
    nbuckets[r] = dp.bucket_count();
    first_bucket[r] = dp.bucket_parameter_names(0);
    auto [xs, ys] = rows(data, {int64_t(r), int64_t(r + 2)});
    loss_of(dp.module(), xs, ys).backward();
    launches[r] = rec.grads_at_launch;
    during[r] = rec.in_backward;
  }));
  for (int r = 0; r < world; ++r) {
    CHECK(first_bucket[r] == std::vector<std::string>{"2.bias"});
    CHECK(nbuckets[r] == 4);  // 2.bias | 2.weight (96 B) | 0.bias (32 B) | 0.weight (128 B)
    REQUIRE(launches[r].size() == nbuckets[r]);
    // The first bucket went out while the first layer's gradients were still to come.
    CHECK(launches[r][0] < 4);
    for (bool b : during[r]) CHECK(b);
  }
}

TEST_CASE("DataParallel broadcasts rank 0's parameters and buffers at construction", "[dist]") {
  const int world = 3;
  auto groups = dist::ThreadProcessGroup::create(world);
  std::vector<std::vector<double>> mean(world), steps(world), weight(world), weight0(world);
  rethrow_any(run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
    auto m = make_mlp(40 + static_cast<uint64_t>(r));
    auto bn = m->push_back(std::make_shared<nn::BatchNorm1d>(3));
    {
      NoGradGuard no_grad;
      bn->running_mean.backend().fill(DType::Float32, bn->running_mean.data_ptr(), 3, double(r + 1));
      bn->num_batches_tracked.backend().fill(DType::Int64, bn->num_batches_tracked.data_ptr(), 1, double(10 * r + 5));
    }
    weight0[r] = make_mlp(40)->parameters()[0].to_double_vector();  // rank 0's initial weights
    dist::DataParallel dp(m, g);
    mean[r] = bn->running_mean.to_double_vector();
    steps[r] = bn->num_batches_tracked.to_double_vector();
    weight[r] = m->parameters()[0].to_double_vector();
  }));
  for (int r = 0; r < world; ++r) {
    CHECK(mean[r] == std::vector<double>{1.0, 1.0, 1.0});
    CHECK(steps[r] == std::vector<double>{5.0});
    CHECK(weight[r] == weight0[r]);
  }
}

TEST_CASE("DataParallel gradient_as_bucket_view: the same gradients and steps as copies, .grad aliases the bucket",
          "[dist]") {
  // Steps with zero_grad() (gradients dropped: backward writes the next ones into the buckets),
  // steps with zero_grad(false) (views zeroed in place) and no_sync accumulation; compared with a
  // replica wrapped without views, on every iteration. The forward of the viewed replica goes
  // through the module, not the wrapper: views do not depend on it.
  const int world = 2;
  const Data data = make_data(32, 8);
  auto groups = dist::ThreadProcessGroup::create(world);
  std::vector<std::vector<double>> err(world), perr(world);
  std::vector<int> aliased(world, 0);
  rethrow_any(run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
    auto plain = make_mlp(9);
    auto viewed = make_mlp(9);
    dist::DataParallel dp_plain(plain, g);
    dist::DataParallel dp_view(viewed, g, {.gradient_as_bucket_view = true});
    optim::SGD opt_plain(plain->parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::SGD opt_view(viewed->parameters(), {.lr = 0.1, .momentum = 0.9});
    for (int it = 0; it < 6; ++it) {
      auto perm = permutation(data.n, it);
      const bool set_to_none = it % 2 == 0;
      opt_plain.zero_grad(set_to_none);
      opt_view.zero_grad(set_to_none);
      for (int micro = 0; micro < 2; ++micro) {  // the first micro-batch under no_sync on odd steps
        std::vector<int64_t> batch(perm.begin() + micro * 8, perm.begin() + micro * 8 + 8);
        auto [xs, ys] = rows(data, slice_of(batch, r, world));
        if (micro == 0 && it % 2 == 1) {
          auto a = dp_plain.no_sync();
          auto b = dp_view.no_sync();
          nn::functional::mse_loss(dp_plain(xs), ys).backward();
          loss_of(*viewed, xs, ys).backward();
        } else if (micro == 1 || it % 2 == 1) {
          nn::functional::mse_loss(dp_plain(xs), ys).backward();
          loss_of(*viewed, xs, ys).backward();
        }
      }
      err[r].push_back(max_rel(viewed->parameters(), plain->parameters(), true));
      // Every .grad of the viewed replica lies in its bucket (the buffer the all_reduce used).
      int in_bucket = 0;
      auto params = viewed->parameters();
      for (auto& p : params) {
        const char* gp = static_cast<const char*>(p.grad().data_ptr());
        bool found = false;
        for (size_t b = 0; b < dp_view.bucket_count(); ++b) {
          const AnyTensor& flat = dp_view.bucket_buffer(b);
          const char* lo = static_cast<const char*>(flat.data_ptr());
          found = found || (gp >= lo && gp < lo + flat.nbytes());
        }
        in_bucket += found ? 1 : 0;
      }
      aliased[r] = in_bucket == static_cast<int>(params.size()) ? aliased[r] + 1 : aliased[r];
      opt_plain.step();
      opt_view.step();
      perr[r].push_back(max_rel(viewed->parameters(), plain->parameters(), false));
    }
  }));
  for (int r = 0; r < world; ++r) {
    REQUIRE(err[r].size() == 6);
    for (double e : err[r]) CHECK(e <= 1e-6);
    for (double e : perr[r]) CHECK(e <= 1e-6);
    CHECK(aliased[r] == 6);
  }
}

TEST_CASE("DataParallel gradient_as_bucket_view: a gradient arriving twice in one backward is a clear error", "[dist]") {
  // l1 is used inside a recomputed segment and outside it: its gradient arrives first from the
  // outer use (which completes its bucket and starts the all_reduce), then again in the nested
  // backward of the segment's recomputation. The error must come before that second gradient is
  // added into the bucket, which the other ranks are reducing: every rank's .grad ends as the
  // average of the first arrivals (the outer use's gradients), uncorrupted.
  struct Net : nn::Module {
    std::shared_ptr<nn::Linear> l1;
    Net() { l1 = register_module("l1", std::make_shared<nn::Linear>(4, 4)); }
    AnyTensor forward_any(const AnyTensor& x) override {
      auto a = l1;
      AnyTensor h = nn::recompute([a](const AnyTensor& v) { return op::tanh(a->forward_any(v)); }, x);
      return a->forward_any(h);
    }
  };
  const int world = 2;
  // Two runs with views: the ranks free-running, then ordered: rank 1 starts its backward only
  // once rank 0's has thrown, so rank 1's arrival reduces rank 0's bucket after rank 0's second
  // arrival (a gradient added into that bucket would show in both ranks' averages).
  const int runs = 2;
  auto groups = dist::ThreadProcessGroup::create(world);
  std::vector<std::string> messages(world * runs);
  std::vector<int> plain_ok(world, 0);
  std::vector<std::shared_ptr<Net>> nets(world * runs);  // outlive the ranks: their .grad views hold the averages
  std::vector<std::vector<double>> colsum(world * runs);  // the outer use's input, summed over the batch
  std::atomic<bool> rank0_thrown{false};
  rethrow_any(run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
    auto x = FloatTensor::full({2, 4}, 0.5 + r);
    {
      auto net = std::make_shared<Net>();
      dist::DataParallel dp(net, g);  // without views the second arrival is reduced again: fine
      op::sum(dp(x)).backward();
      plain_ok[r] = net->l1->weight.grad().defined() ? 1 : 0;
    }
    for (int run = 0; run < runs; ++run) {
      const size_t slot = static_cast<size_t>(run * world + r);
      auto net = nets[slot] = std::make_shared<Net>();
      dist::DataParallel dp(net, g, {.gradient_as_bucket_view = true});  // rank 0's weights everywhere
      {
        NoGradGuard no_grad;
        const auto h = op::tanh(net->l1->forward_any(x)).to_double_vector();
        colsum[slot].assign(4, 0.0);
        for (size_t i = 0; i < h.size(); ++i) colsum[slot][i % 4] += h[i];
      }
      if (run == 1 && r == 1) {  // bounded: a rank 0 that waited for rank 1 would fail the checks, not hang
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (!rank0_thrown.load() && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      try {
        op::sum(dp(x)).backward();
      } catch (const ValueError& e) {
        messages[slot] = e.what();
      }
      if (run == 1 && r == 0) rank0_thrown.store(true);
    }
  }));
  for (int r = 0; r < world; ++r) CHECK(plain_ok[r] == 1);
  for (int run = 0; run < runs; ++run) {
    // d sum(h W^T + b) / dW[o][j] = sum over the batch of h[.][j]; / db[o] = 2 (the batch's rows).
    std::vector<double> expect(4, 0.0);
    for (int r = 0; r < world; ++r)
      for (size_t j = 0; j < 4; ++j) expect[j] += colsum[static_cast<size_t>(run * world + r)][j] / world;
    for (int r = 0; r < world; ++r) {
      INFO("run " << run << ", rank " << r);
      const size_t slot = static_cast<size_t>(run * world + r);
      CHECK_THAT(messages[slot], Catch::Matchers::Contains("gradient_as_bucket_view") &&
                                     Catch::Matchers::Contains("l1.") &&
                                     Catch::Matchers::Contains("arrived a second time"));
      const AnyTensor gw = nets[slot]->l1->weight.grad(), gb = nets[slot]->l1->bias.grad();
      REQUIRE(gw.defined());
      REQUIRE(gb.defined());
      const auto w = gw.to_double_vector(), b = gb.to_double_vector();
      double werr = 0.0, berr = 0.0;
      for (size_t i = 0; i < w.size(); ++i) werr = std::max(werr, std::abs(w[i] - expect[i % 4]));
      for (double v : b) berr = std::max(berr, std::abs(v - 2.0));
      CHECK(werr <= 1e-5);
      CHECK(berr <= 1e-6);
    }
  }
}

namespace {
// A group whose collectives take tensors on its device only, as NcclProcessGroup does (a tensor
// elsewhere is a DeviceError naming both), run by a ThreadProcessGroup on host copies. With the
// pretend GPU it stands in for NCCL in CI.
class DeviceOnlyGroup : public dist::ProcessGroup {
 public:
  DeviceOnlyGroup(dist::ThreadProcessGroup& inner, Device dev) : inner_(inner), dev_(dev) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend_name() const override { return "device-only"; }
  Device device() const override { return dev_; }
  std::shared_ptr<dist::Work> all_reduce_async(AnyTensor& t, dist::ReduceOp op) override {
    return on_host(t, t, [&](AnyTensor& h) { inner_.all_reduce(h, op); });
  }
  std::shared_ptr<dist::Work> broadcast_async(AnyTensor& t, int root) override {
    return on_host(t, t, [&](AnyTensor& h) { inner_.broadcast(h, root); });
  }
  std::shared_ptr<dist::Work> reduce_scatter_async(AnyTensor& out, const AnyTensor& in, dist::ReduceOp op) override {
    return on_host(out, in, [&](AnyTensor& h) { inner_.reduce_scatter(h, in.to(Device::cpu()), op); });
  }
  std::shared_ptr<dist::Work> all_gather_async(AnyTensor& out, const AnyTensor& in) override {
    return on_host(out, in, [&](AnyTensor& h) { inner_.all_gather(h, in.to(Device::cpu())); });
  }
  void barrier() override { inner_.barrier(); }

 private:
  // Checks both tensors are on the group's device, runs `collective` on a host copy of `out`, and
  // copies the result back.
  template <class F>
  std::shared_ptr<dist::Work> on_host(AnyTensor& out, const AnyTensor& in, F collective) {
    for (const AnyTensor* t : {static_cast<const AnyTensor*>(&out), &in})
      EMBER_CHECK(t->device() == dev_, DeviceError, "DeviceOnlyGroup: ", t->desc(), " is not on ", dev_.str());
    AnyTensor h = out.to(Device::cpu());
    collective(h);
    out.copy_(h.to(dev_));
    return std::make_shared<dist::CompletedWork>();
  }
  dist::ThreadProcessGroup& inner_;
  Device dev_;
};
}  // namespace

TEST_CASE("DataParallel and sync_found_inf over a group that takes device tensors only (as NCCL)", "[dist]") {
  // DataParallel's replica check and sync_found_inf make their own small tensors to communicate:
  // they must put them on the group's device (ProcessGroup::device()), not on the CPU.
  testing::PretendGpu pretend;  // cuda:0 backed by the CPU when there is no GPU
  const Device gpu = Device::cuda(0);
  const int world = 2;
  // 60 s, not the 5-minute default: on the GPU machine a stuck rank must fail this test well
  // inside the GPU check's time (tools/gpu-check.sh), not use it all up.
  dist::ProcessGroupOptions opt;
  opt.timeout = std::chrono::seconds(60);
  auto groups = dist::ThreadProcessGroup::create(world, opt);
  const Data data = make_data(8, 31);
  std::vector<double> err(world, INFINITY);
  std::vector<int> found(world, -1);
  rethrow_any(run_ranks(groups, [&](int r, dist::ProcessGroup& inner) {
    DeviceOnlyGroup g(static_cast<dist::ThreadProcessGroup&>(inner), gpu);
    auto base = make_mlp(12);
    auto replica = make_mlp(12);
    replica->to(gpu);
    dist::DataParallel dp(replica, g);
    std::vector<int64_t> batch = {0, 1, 2, 3, 4, 5};
    auto [xb, yb] = rows(data, batch);
    loss_of(*base, xb, yb).backward();
    auto [xs, ys] = rows(data, slice_of(batch, r, world));
    nn::functional::mse_loss(FloatTensor(dp(xs.to(gpu))), ys.to(gpu)).backward();
    std::vector<AnyTensor> on_cpu;
    for (auto& p : replica->parameters()) {
      AnyTensor c = p.detach().to(Device::cpu()).set_requires_grad(true);
      c.set_grad(p.grad().to(Device::cpu()));
      on_cpu.push_back(c);
    }
    err[r] = max_rel(on_cpu, base->parameters(), true);
    // A GradScaler step on the device: the found-inf flags are all-reduced on the group's device.
    optim::SGD opt(replica->parameters(), {.lr = 0.1});
    amp::GradScaler scaler;
    opt.zero_grad();
    scaler.scale(nn::functional::mse_loss(FloatTensor(dp(xs.to(gpu))), ys.to(gpu))).backward();
    found[r] = dist::sync_found_inf(scaler, opt, g) ? 1 : 0;
  }));
  for (int r = 0; r < world; ++r) {
    // 1e-5, not 1e-6: on a real GPU the replica's fp32 GEMMs run in cuBLAS, whose blocking and
    // split-K order the sums differently from the CPU reference (a few ulp per product, which the
    // backward pass compounds); the bug this catches (control tensors on the wrong device) throws.
    CHECK(err[r] <= 1e-5);
    CHECK(found[r] == 0);
  }
}

// ---- Same settings on every rank (dist/same_settings.hpp) ----
// Thread ranks share one environment, so each rank's settings come from SameSettingsOptions::settings.

namespace {

dist::NumericSettings with_setting(dist::NumericSettings s, const std::string& name, std::optional<std::string> v) {
  for (auto& e : s)
    if (e.name == name) {
      e.value = std::move(v);
      return s;
    }
  s.push_back({name, std::move(v)});
  return s;
}

// The warnings of the settings check when each of `ranks` thread ranks builds a DataParallel with
// its options' same_settings set by configure(rank, same_settings); one list per rank.
template <class Configure>
std::vector<std::vector<std::string>> data_parallel_warnings(int ranks, Configure configure) {
  auto groups = dist::ThreadProcessGroup::create(ranks);
  std::vector<std::vector<std::string>> got(static_cast<size_t>(ranks));
  auto errors = run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
    dist::DataParallelOptions o;
    configure(r, o.same_settings);
    o.same_settings.warn = [&, r](const std::string& m) { got[static_cast<size_t>(r)].push_back(m); };
    dist::DataParallel dp(make_mlp(1), g, o);
  });
  rethrow_any(errors);
  return got;
}

// Counts the collectives a wrapped group runs.
class CountingGroup : public dist::ProcessGroup {
 public:
  explicit CountingGroup(dist::ProcessGroup& g) : g_(g) {}
  int rank() const override { return g_.rank(); }
  int size() const override { return g_.size(); }
  std::string backend_name() const override { return g_.backend_name(); }
  std::shared_ptr<dist::Work> all_reduce_async(AnyTensor& t, dist::ReduceOp op) override {
    ++calls;
    return g_.all_reduce_async(t, op);
  }
  std::shared_ptr<dist::Work> broadcast_async(AnyTensor& t, int root) override {
    ++calls;
    return g_.broadcast_async(t, root);
  }
  std::shared_ptr<dist::Work> reduce_scatter_async(AnyTensor& o, const AnyTensor& i, dist::ReduceOp op) override {
    ++calls;
    return g_.reduce_scatter_async(o, i, op);
  }
  std::shared_ptr<dist::Work> all_gather_async(AnyTensor& o, const AnyTensor& i) override {
    ++calls;
    ++gathers;
    gathered_bytes += o.nbytes();
    return g_.all_gather_async(o, i);
  }
  void barrier() override {
    ++calls;
    g_.barrier();
  }
  int calls = 0, gathers = 0;
  size_t gathered_bytes = 0;

 private:
  dist::ProcessGroup& g_;
};

}  // namespace

TEST_CASE("Same settings: agreeing ranks are silent, a disagreement is one warning from rank 0 naming each value",
          "[dist][settings]") {
  const dist::NumericSettings base = dist::local_numeric_settings();
  SECTION("the real settings of thread ranks agree: no warning, no error") {
    const auto got = data_parallel_warnings(3, [](int, dist::SameSettingsOptions& o) {
      o.mode = dist::SettingsCheck::Error;
    });
    for (auto& g : got) CHECK(g.empty());
  }
  SECTION("OPENBLAS_CORETYPE and the thread count differ on rank 1") {
    const auto got = data_parallel_warnings(2, [&](int r, dist::SameSettingsOptions& o) {
      o.mode = dist::SettingsCheck::Warn;
      auto s = with_setting(base, "OPENBLAS_CORETYPE", r == 0 ? std::optional<std::string>("ZEN") : std::nullopt);
      s = with_setting(s, "ember CPU threads", r == 0 ? "2" : "4");
      o.settings = s;
    });
    REQUIRE(got[0].size() == 1);
    CHECK(got[1].empty());
    const std::string& m = got[0][0];
    CHECK_THAT(m, Catch::StartsWith("ember DataParallel: ranks disagree on settings that change numerics: "));
    CHECK_THAT(m, Catch::Contains("OPENBLAS_CORETYPE rank0=ZEN rank1=(unset)"));
    CHECK_THAT(m, Catch::Contains("ember CPU threads rank0=2 rank1=4"));
    CHECK_THAT(m, Catch::Contains("results may differ in the last digits"));
    CHECK_THAT(m, Catch::Contains("mpirun -x OPENBLAS_CORETYPE (Slurm: srun --export=ALL)"));
    CHECK_THAT(m, Catch::Contains("ember::set_num_threads"));
    CHECK_THAT(m, Catch::Contains("EMBER_REQUIRE_SAME_SETTINGS=1"));
    // Only the differing settings are named.
    CHECK_THAT(m, !Catch::Contains("ember version") && !Catch::Contains("OMP_NUM_THREADS"));
  }
  SECTION("the default sink is std::cerr, one line from rank 0") {
    auto groups = dist::ThreadProcessGroup::create(2);
    std::ostringstream captured;
    std::streambuf* old = std::cerr.rdbuf(captured.rdbuf());
    auto errors = run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
      dist::SameSettingsOptions o;
      o.mode = dist::SettingsCheck::Warn;
      o.settings = with_setting(base, "MKL_CBWR", r == 1 ? std::optional<std::string>("AVX2") : std::nullopt);
      dist::check_same_settings(g, "DataParallel", o);
    });
    std::cerr.rdbuf(old);
    rethrow_any(errors);
    const std::string out = captured.str();
    CHECK_THAT(out, Catch::StartsWith("warning: ember DataParallel: ranks disagree") &&
                        Catch::Contains("MKL_CBWR rank0=(unset) rank1=AVX2") && Catch::Contains("mpirun -x MKL_CBWR"));
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);
  }
  SECTION("a version or build difference asks for the same build") {
    auto groups = dist::ThreadProcessGroup::create(2);
    std::vector<std::string> msgs(2);
    auto errors = run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
      dist::SameSettingsOptions o;
      o.mode = dist::SettingsCheck::Warn;
      o.settings = with_setting(base, "ember version", r == 0 ? "0.1.0" : "0.2.0");
      o.warn = [](const std::string&) {};
      msgs[static_cast<size_t>(r)] = dist::check_same_settings(g, "DataParallel", o);
    });
    rethrow_any(errors);
    CHECK(msgs[0] == msgs[1]);
    CHECK_THAT(msgs[0], Catch::Contains("ember version rank0=0.1.0 rank1=0.2.0") &&
                            Catch::Contains("same build of ember") && !Catch::Contains("mpirun -x"));
  }
}

TEST_CASE("Same settings: the error option throws the same DistributedError on every rank, without a hang",
          "[dist][settings]") {
  const dist::NumericSettings base = dist::local_numeric_settings();
  SECTION("DataParallel, Error asked on rank 2 only: all three ranks throw") {
    auto groups = dist::ThreadProcessGroup::create(3);
    std::atomic<int> warnings{0};
    auto errors = run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
      dist::DataParallelOptions o;
      o.same_settings.mode = r == 2 ? dist::SettingsCheck::Error : dist::SettingsCheck::Warn;
      o.same_settings.settings = with_setting(base, "OMP_NUM_THREADS", r == 1 ? "1" : "2");
      o.same_settings.warn = [&](const std::string&) { ++warnings; };
      dist::DataParallel dp(make_mlp(1), g, o);
    });
    CHECK(warnings == 0);
    for (int r = 0; r < 3; ++r) {
      REQUIRE(errors[static_cast<size_t>(r)]);
      CHECK_THROWS_AS(std::rethrow_exception(errors[static_cast<size_t>(r)]), DistributedError);
      CHECK_THROWS_WITH(std::rethrow_exception(errors[static_cast<size_t>(r)]),
                        Catch::Contains("OMP_NUM_THREADS rank0=2 rank1=1 rank2=2") &&
                            Catch::Contains("An error because SettingsCheck::Error or EMBER_REQUIRE_SAME_SETTINGS=1"));
    }
  }
  SECTION("ZeroRedundancyOptimizer checks too") {
    auto groups = dist::ThreadProcessGroup::create(2);
    std::vector<std::string> warned(2), thrown(2);
    auto errors = run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
      auto m = make_mlp(1);
      auto factory = [](std::vector<AnyTensor> ps) { return std::make_unique<optim::SGD>(std::move(ps)); };
      dist::SameSettingsOptions o;
      o.mode = dist::SettingsCheck::Warn;
      o.settings = with_setting(base, "OPENBLAS_NUM_THREADS", r == 0 ? "1" : "8");
      o.warn = [&, r](const std::string& s) { warned[static_cast<size_t>(r)] = s; };
      dist::ZeroRedundancyOptimizer warn_zero(m->parameters(), g, factory, o);
      o.mode = dist::SettingsCheck::Error;
      try {  // no Catch2 assertions on the rank threads
        dist::ZeroRedundancyOptimizer error_zero(m->parameters(), g, factory, o);
      } catch (const DistributedError& e) {
        thrown[static_cast<size_t>(r)] = e.what();
      }
    });
    rethrow_any(errors);
    CHECK_THAT(warned[0], Catch::StartsWith("ember ZeroRedundancyOptimizer: ranks disagree") &&
                              Catch::Contains("OPENBLAS_NUM_THREADS rank0=1 rank1=8"));
    CHECK(warned[1].empty());
    for (const std::string& t : thrown) CHECK_THAT(t, Catch::Contains("OPENBLAS_NUM_THREADS rank0=1 rank1=8"));
  }
}

TEST_CASE("Same settings: one small all_gather at construction, none for Off or one rank, many ranks grouped",
          "[dist][settings]") {
  SECTION("collective count") {
    auto groups = dist::ThreadProcessGroup::create(2);
    std::vector<int> off_calls(2), on_calls(2), on_gathers(2), off_gathers(2);
    std::vector<size_t> bytes(2);
    auto errors = run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
      CountingGroup off(g), on(g);
      dist::DataParallelOptions o;
      o.same_settings.mode = dist::SettingsCheck::Off;
      { dist::DataParallel dp(make_mlp(1), off, o); }
      o.same_settings.mode = dist::SettingsCheck::Error;
      { dist::DataParallel dp(make_mlp(1), on, o); }
      off_calls[static_cast<size_t>(r)] = off.calls;
      on_calls[static_cast<size_t>(r)] = on.calls;
      off_gathers[static_cast<size_t>(r)] = off.gathers;
      on_gathers[static_cast<size_t>(r)] = on.gathers;
      bytes[static_cast<size_t>(r)] = on.gathered_bytes - off.gathered_bytes;
    });
    rethrow_any(errors);
    for (size_t r = 0; r < 2; ++r) {
      CHECK(on_calls[r] == off_calls[r] + 1);
      CHECK(on_gathers[r] == off_gathers[r] + 1);
      CHECK(bytes[r] == 2 * dist::kSettingsBytes);
    }
    auto one = dist::ThreadProcessGroup::create(1);
    CountingGroup solo(*one[0]);
    dist::SameSettingsOptions o;
    o.mode = dist::SettingsCheck::Error;
    CHECK(dist::check_same_settings(solo, "DataParallel", o).empty());
    CHECK(solo.calls == 0);
  }
  SECTION("nine ranks: the values grouped by rank ranges") {
    const dist::NumericSettings base = dist::local_numeric_settings();
    auto groups = dist::ThreadProcessGroup::create(9);
    std::string msg;
    auto errors = run_ranks(groups, [&](int r, dist::ProcessGroup& g) {
      dist::SameSettingsOptions o;
      o.mode = dist::SettingsCheck::Warn;
      o.settings =
          with_setting(base, "OPENBLAS_CORETYPE", r == 4 || r >= 6 ? std::nullopt : std::optional<std::string>("ZEN"));
      o.warn = [&](const std::string& m) { msg = m; };  // rank 0 only
      dist::check_same_settings(g, "DataParallel", o);
    });
    rethrow_any(errors);
    CHECK_THAT(msg, Catch::Contains("OPENBLAS_CORETYPE: ZEN on ranks 0-3,5, (unset) on ranks 4,6-8"));
  }
}

TEST_CASE("Same settings: the exchanged bytes and EMBER_REQUIRE_SAME_SETTINGS", "[dist][settings]") {
  SECTION("encode/decode round trip; long and odd values; malformed bytes never crash") {
    dist::NumericSettings s = {{"A", std::string("x=y")}, {"B", std::nullopt}, {"C", std::string("")},
                               {"D", std::string("line\nbreak")}, {"E", std::string(5000, 'v')}};
    auto bytes = dist::settings_detail::encode(s, dist::SettingsCheck::Error);
    REQUIRE(bytes.size() == dist::kSettingsBytes);
    auto d = dist::settings_detail::decode(bytes.data(), bytes.size());
    CHECK(d.format == dist::kSettingsFormat);
    CHECK(d.mode == static_cast<uint8_t>(dist::SettingsCheck::Error));
    REQUIRE(d.settings.size() == 5);
    CHECK(d.settings[0].value == std::optional<std::string>("x=y"));
    CHECK(!d.settings[1].value);
    CHECK(d.settings[2].value == std::optional<std::string>(""));
    CHECK(d.settings[3].value == std::optional<std::string>("line?break"));
    CHECK(d.settings[4].value->size() == dist::kMaxSettingValue);
    // A setting that one rank did not send.
    auto d2 = d;
    d2.settings.pop_back();
    CHECK_THAT(dist::settings_detail::compare({d, d2}, "DataParallel"), Catch::Contains("rank1=(not sent)"));
    CHECK(dist::settings_detail::compare({d, d}, "DataParallel").empty());
    std::mt19937 rng(7);
    for (int i = 0; i < 200; ++i) {
      std::vector<uint8_t> junk(static_cast<size_t>(rng() % 64));
      for (auto& b : junk) b = static_cast<uint8_t>(rng() % 4 == 0 ? '\n' : rng() % 4 == 1 ? '=' : rng());
      auto j = dist::settings_detail::decode(junk.data(), junk.size());
      (void)dist::settings_detail::compare({d, j}, "DataParallel");
    }
    auto e = dist::settings_detail::decode(nullptr, 0);
    CHECK(e.settings.empty());
  }
  SECTION("the local settings name the BLAS and threading variables") {
    auto s = dist::local_numeric_settings();
    std::vector<std::string> names;
    for (auto& e : s) names.push_back(e.name);
    for (const char* n : {"ember version", "ember CPU threads", "OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS",
                          "OMP_NUM_THREADS", "MKL_CBWR", "compiled with OpenMP"})
      CHECK(std::find(names.begin(), names.end(), n) != names.end());
    CHECK(s[0].value == std::optional<std::string>(kVersionString));
    CHECK(s[1].value == std::optional<std::string>(std::to_string(get_num_threads())));
  }
  SECTION("EMBER_REQUIRE_SAME_SETTINGS") {
    // Restores the variable (set by nobody else in this process).
    const char* old = std::getenv("EMBER_REQUIRE_SAME_SETTINGS");
    const std::optional<std::string> saved = old ? std::optional<std::string>(old) : std::nullopt;
    ::unsetenv("EMBER_REQUIRE_SAME_SETTINGS");
    CHECK(dist::default_settings_check() == dist::SettingsCheck::Warn);
    ::setenv("EMBER_REQUIRE_SAME_SETTINGS", "1", 1);
    CHECK(dist::default_settings_check() == dist::SettingsCheck::Error);
    CHECK(dist::DataParallelOptions{}.same_settings.mode == dist::SettingsCheck::Error);
    ::setenv("EMBER_REQUIRE_SAME_SETTINGS", "0", 1);
    CHECK(dist::default_settings_check() == dist::SettingsCheck::Warn);
    ::setenv("EMBER_REQUIRE_SAME_SETTINGS", "yes", 1);
    CHECK_THROWS_AS(dist::default_settings_check(), ValueError);
    CHECK_THROWS_WITH(dist::default_settings_check(), Catch::Contains("EMBER_REQUIRE_SAME_SETTINGS='yes'"));
    if (saved)
      ::setenv("EMBER_REQUIRE_SAME_SETTINGS", saved->c_str(), 1);
    else
      ::unsetenv("EMBER_REQUIRE_SAME_SETTINGS");
  }
}
