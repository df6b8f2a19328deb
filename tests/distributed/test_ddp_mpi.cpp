// DataParallel and ZeRO-1 across processes, under mpirun (2 and 3 ranks): the multi-process
// checks of the wrapper itself, on MpiProcessGroup. Each rank also keeps a
// single-process replica and computes, on the whole batch, what the data-parallel run must equal.
// Uneven last batches (DistributedSampler padded / drop_last, slices of different sizes, empty
// slices) must end with the same step count and bit-identical parameters on every rank.
//   mpirun -np 3 test_ddp_mpi
// Plain checks (mpi_harness.hpp); any failure makes the job exit non-zero ("FAILED" in the output).
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include <ember/dist/data_parallel.hpp>
#include <ember/dist/mpi.hpp>
#include <ember/dist/zero.hpp>
#include <ember/data/distributed_sampler.hpp>
#include <ember/ember.hpp>

#include "mpi_harness.hpp"

using namespace ember;
using testing::mpi::expect;
using testing::mpi::relative_error;

namespace {

// Every rank builds the same replica (DataParallel also broadcasts rank 0's).
std::shared_ptr<nn::Sequential> make_model() { return testing::mpi::seeded_mlp(8, 16, 3); }

// A fixed regression data set, the same on every rank.
std::pair<Tensor<float>, Tensor<float>> make_data() { return testing::mpi::regression_data(60, 8, 3); }

Tensor<float> loss_on(nn::Sequential& m, const Tensor<float>& x, const Tensor<float>& y, const std::vector<int64_t>& idx) {
  auto i = Tensor<int64_t>::from_vector(idx);
  return nn::functional::mse_loss(m(index_select(x, 0, i)), index_select(y, 0, i));
}

// This rank's replica under DataParallel (local) next to a single-process one that trains on
// the whole batch (whole), and the data set.
struct Replicas {
  Tensor<float> x, y;
  std::shared_ptr<nn::Sequential> local = make_model(), whole = make_model();
  dist::DataParallel dp;
  explicit Replicas(dist::ProcessGroup& pg) : dp(local, pg) { std::tie(x, y) = make_data(); }
};

// Rank r's share of a batch split by stride over R ranks: elements r, r + R, r + 2R, ...
std::vector<int64_t> slice_of(const std::vector<int64_t>& batch, int r, int R) {
  std::vector<int64_t> mine;
  for (size_t k = static_cast<size_t>(r); k < batch.size(); k += static_cast<size_t>(R)) mine.push_back(batch[k]);
  return mine;
}

// One data-parallel step (lossl: this rank's slice) next to the single-process one (lossw: the
// whole batch): the gradients must match to `tolerance`, then the same SGD step on both, so that
// later steps start from equal parameters.
void step_and_compare(nn::Sequential& local, nn::Sequential& whole, const Tensor<float>& lossl,
                      const Tensor<float>& lossw, double tolerance, const std::string& what) {
  local.zero_grad();
  whole.zero_grad();
  lossl.backward();
  lossw.backward();
  auto pl = local.parameters(), pw = whole.parameters();
  for (size_t p = 0; p < pl.size(); ++p) {
    const double e = relative_error(pl[p].grad(), pw[p].grad());
    expect(e <= tolerance,
           what + ": gradient of parameter " + std::to_string(p) + ": relative error " + std::to_string(e));
  }
  optim::SGD a(local.parameters(), {.lr = 0.1}), b(whole.parameters(), {.lr = 0.1});
  a.step();
  b.step();
}

// Gradients of DataParallel on each rank's slice equal single-process gradients on the whole
// batch, every iteration, with a new permutation every epoch.
void check_gradients(dist::ProcessGroup& pg) {
  const int R = pg.size(), r = pg.rank();
  Replicas m(pg);
  const int64_t per_rank = 6;  // batch of 6 * R per step
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    data::DistributedSampler all(60, 1, 0, {.seed = 3});
    all.set_epoch(epoch);
    auto order = all.indices();  // the global permutation every rank agrees on
    for (int64_t step = 0; step < 3; ++step) {
      std::vector<int64_t> batch(order.begin() + step * per_rank * R, order.begin() + (step + 1) * per_rank * R);
      step_and_compare(*m.local, *m.whole, loss_on(*m.local, m.x, m.y, slice_of(batch, r, R)),
                       loss_on(*m.whole, m.x, m.y, batch), 1e-6,
                       "epoch " + std::to_string(epoch) + " step " + std::to_string(step));
    }
  }
}

// no_sync: the accumulate-only backward leaves local gradients (different from the baseline on
// some rank), the next synchronised one reduces everything accumulated.
void check_no_sync(dist::ProcessGroup& pg) {
  const int R = pg.size(), r = pg.rank();
  Replicas m(pg);
  std::vector<int64_t> b1, b2;
  for (int64_t k = 0; k < 4 * R; ++k) {
    b1.push_back(k);
    b2.push_back(30 + k);
  }
  {
    auto guard = m.dp.no_sync();
    loss_on(*m.local, m.x, m.y, slice_of(b1, r, R)).backward();
  }
  loss_on(*m.whole, m.x, m.y, b1).backward();
  double diff = relative_error(m.local->parameters()[0].grad(), m.whole->parameters()[0].grad());
  AnyTensor d = Tensor<double>::scalar(diff);
  pg.all_reduce(d, dist::ReduceOp::Max);
  expect(d.item_double() > 1e-4, "no_sync: accumulate-only gradients should differ from the baseline on some rank");
  loss_on(*m.local, m.x, m.y, slice_of(b2, r, R)).backward();  // synchronised: reduces both micro-batches
  loss_on(*m.whole, m.x, m.y, b2).backward();
  auto pl = m.local->parameters(), pw = m.whole->parameters();
  for (size_t p = 0; p < pl.size(); ++p)
    expect(relative_error(pl[p].grad(), pw[p].grad()) <= 1e-6,
           "no_sync: synchronised gradient of parameter " + std::to_string(p));
}

// ZeRO-1 Adam (state sharded) ends with the parameters of plain data-parallel Adam.
void check_zero(dist::ProcessGroup& pg) {
  const int R = pg.size(), r = pg.rank();
  auto [x, y] = make_data();
  auto plain = make_model();
  auto sharded = make_model();
  dist::DataParallel dp_plain(plain, pg), dp_sharded(sharded, pg);
  optim::Adam adam(plain->parameters(), {.lr = 0.01, .weight_decay = 0.1});
  dist::ZeroRedundancyOptimizer zero(sharded->parameters(), pg, [](std::vector<AnyTensor> p) {
    return std::make_unique<optim::Adam>(std::move(p), optim::AdamOptions{.lr = 0.01, .weight_decay = 0.1});
  });
  for (int step = 0; step < 4; ++step) {
    std::vector<int64_t> mine;
    for (int64_t k = 0; k < 5; ++k) mine.push_back((step * 5 * R + k * R + r) % 60);
    plain->zero_grad();
    sharded->zero_grad();
    loss_on(*plain, x, y, mine).backward();
    loss_on(*sharded, x, y, mine).backward();
    adam.step();
    zero.step();
  }
  auto pp = plain->parameters(), ps = sharded->parameters();
  for (size_t p = 0; p < pp.size(); ++p)
    expect(relative_error(ps[p], pp[p]) <= 1e-5, "ZeRO-1 parameter " + std::to_string(p) + " after 4 Adam steps");
}

// ---- Uneven last batches: every rank finishes the same number of steps, no hang ----------------

// A run's steps and its parameters and gradients, in one float64 vector.
std::vector<double> state_of(nn::Module& m, int64_t steps) {
  std::vector<double> v{static_cast<double>(steps)};
  for (auto& p : m.parameters()) {
    auto w = p.to_double_vector(), g = p.grad().to_double_vector();
    v.insert(v.end(), w.begin(), w.end());
    v.insert(v.end(), g.begin(), g.end());
  }
  return v;
}

// Whether every rank holds v bit for bit: all-gathers it and compares with rank 0's.
bool same_on_every_rank(dist::ProcessGroup& pg, const std::vector<double>& v) {
  const int64_t n = static_cast<int64_t>(v.size());
  AnyTensor mine = Tensor<double>::from_vector(v);
  AnyTensor all = AnyTensor::zeros(Shape{n * pg.size()}, DType::Float64);
  pg.all_gather(all, mine);
  auto a = Tensor<double>(all).to_vector();
  for (int q = 1; q < pg.size(); ++q)
    for (int64_t i = 0; i < n; ++i)
      if (a[static_cast<size_t>(q * n + i)] != a[static_cast<size_t>(i)]) return false;
  return true;
}

// The gradients of the uneven runs: fp32, the slices' gradients summed against the whole batch's
// in another summation order (the GEMM library's blocking included: oneDNN's sgemm gave 1e-6
// where OpenBLAS gave less).
constexpr double kUnevenGradientTolerance = 3e-6;

// End of an uneven run: the same step count, parameters and gradients on every rank (bit for
// bit), and the parameters of the single-process run.
void check_end(dist::ProcessGroup& pg, nn::Sequential& local, nn::Sequential& whole, int64_t steps,
               int64_t expected_steps, const std::string& what) {
  expect(steps == expected_steps,
         what + ": " + std::to_string(steps) + " steps, expected " + std::to_string(expected_steps));
  expect(same_on_every_rank(pg, state_of(local, steps)),
         what + ": step count, parameters or gradients differ between ranks at the end");
  auto pl = local.parameters(), pw = whole.parameters();
  for (size_t p = 0; p < pl.size(); ++p)
    expect(relative_error(pl[p], pw[p]) <= 1e-5, what + ": parameter " + std::to_string(p) + " at the end");
}

// data::DistributedSampler over 23 samples (divides by neither 2 nor 3), 5 samples per rank and
// step: each rank's share ends in a short batch (padded: 12 = 5+5+2 on 2 ranks, 8 = 5+3 on 3;
// drop_last: 11 = 5+5+1 and 7 = 5+2). The sampler gives every rank the same count, so the slices
// are equal and the plain mean loss makes DataParallel equal the whole batch, padding duplicates
// included.
void check_uneven_sampler(dist::ProcessGroup& pg, bool drop_last) {
  const int R = pg.size(), r = pg.rank();
  const int64_t n = 23, per_rank = 5;
  const std::string what =
      std::string("uneven last batch, DistributedSampler drop_last=") + (drop_last ? "true" : "false");
  Replicas m(pg);
  std::vector<data::DistributedSampler> samplers;  // every rank's, for the single-process batch
  for (int q = 0; q < R; ++q)
    samplers.emplace_back(n, R, q, data::DistributedSamplerOptions{.seed = 5, .drop_last = drop_last});
  const int64_t count = samplers[static_cast<size_t>(r)].num_samples();
  expect(count == (drop_last ? n / R : (n + R - 1) / R), what + ": num_samples " + std::to_string(count));
  expect(samplers[0].total_size() == (drop_last ? n - n % R : n + (R - n % R) % R), what + ": total_size");
  int64_t steps = 0;
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<std::vector<int64_t>> share;
    for (auto& s : samplers) {
      s.set_epoch(epoch);
      share.push_back(s.indices());
    }
    for (int64_t at = 0; at < count; at += per_rank) {
      const int64_t end = std::min(at + per_rank, count);
      std::vector<int64_t> batch;
      for (auto& sh : share) batch.insert(batch.end(), sh.begin() + at, sh.begin() + end);
      const auto& sr = share[static_cast<size_t>(r)];
      std::vector<int64_t> mine(sr.begin() + at, sr.begin() + end);
      step_and_compare(*m.local, *m.whole, loss_on(*m.local, m.x, m.y, mine), loss_on(*m.whole, m.x, m.y, batch),
                       kUnevenGradientTolerance,
                       what + " epoch " + std::to_string(epoch) + " step " + std::to_string(steps));
      ++steps;
    }
  }
  check_end(pg, *m.local, *m.whole, steps, 2 * ((count + per_rank - 1) / per_rank), what);
}

// A loss that sums over this rank's slice, scaled so that DataParallel's average over the ranks is
// the mean over the whole batch: R / (batch * 3) * sum of squares = (the slice's mean loss) *
// slice size * R / batch. It equals the weighted mean loss but is also defined (0, gradients 0)
// on an empty slice, where a mean is an error (check_empty_slice).
Tensor<float> weighted_loss_on(nn::Sequential& m, const Tensor<float>& x, const Tensor<float>& y,
                               const std::vector<int64_t>& idx, int64_t batch, int R) {
  auto i = Tensor<int64_t>::from_vector(idx);
  auto sum = nn::functional::mse_loss(m(index_select(x, 0, i)), index_select(y, 0, i), "sum");
  return sum * (static_cast<double>(R) / static_cast<double>(batch * 3));
}

// Global batches of `batch` samples over the 23, split across the ranks by stride, so the slices
// of a batch differ in size (rank 0 gets the most samples over the epoch). batch 9: batches
// 9, 9, 5, slices 5/4 and 3/2 on 2 ranks, 3/3/3 and 2/2/1 on 3. batch 11: the last batch holds
// one sample and every rank but 0 has an EMPTY slice: it still runs forward (a [0, 8] input) and
// backward, so every rank takes part in the all-reduce.
void check_uneven_slices(dist::ProcessGroup& pg, int64_t batch_size) {
  const int R = pg.size(), r = pg.rank();
  const int64_t n = 23;
  const std::string what = "uneven slices, batch " + std::to_string(batch_size);
  Replicas m(pg);
  int64_t steps = 0, empty_steps = 0;
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    data::DistributedSampler all(n, 1, 0, {.seed = 11});
    all.set_epoch(epoch);
    auto order = all.indices();
    for (int64_t at = 0; at < n; at += batch_size) {
      std::vector<int64_t> batch(order.begin() + at, order.begin() + std::min(at + batch_size, n));
      const int64_t b = static_cast<int64_t>(batch.size());
      const std::vector<int64_t> mine = slice_of(batch, r, R);
      if (mine.empty()) ++empty_steps;
      step_and_compare(*m.local, *m.whole, weighted_loss_on(*m.local, m.x, m.y, mine, b, R),
                       loss_on(*m.whole, m.x, m.y, batch), kUnevenGradientTolerance,
                       what + " epoch " + std::to_string(epoch) + " step " + std::to_string(steps) + " (slice of " +
                           std::to_string(mine.size()) + ")");
      ++steps;
    }
  }
  check_end(pg, *m.local, *m.whole, steps, 2 * ((n + batch_size - 1) / batch_size), what);
  if (batch_size == 11)
    expect(empty_steps == (r == 0 ? 0 : 2),
           what + ": " + std::to_string(empty_steps) + " steps with an empty slice");
}

// The plain mean loss on an empty slice: DataParallel's forward takes the [0, 8] batch and the
// mean over zero samples is NaN, as in PyTorch (so the logged loss is NaN on that rank; the
// gradients, sums over nothing, are zero). A rank that skips its empty step instead would be worse:
// collectives are matched by order only, so its next all-reduce pairs with the others' current one
// (wrong gradients, no error) until the collectives differ in size and Open MPI aborts the job
// (MPI_ERR_TRUNCATE). So every rank runs every step, an empty slice with a weighted sum
// (weighted_loss_on). Only local work here, no collective.
void check_empty_slice(dist::ProcessGroup& pg) {
  auto [x, y] = make_data();
  auto local = make_model();
  dist::DataParallel dp(local, pg);
  auto i = Tensor<int64_t>::from_vector(std::vector<int64_t>{});
  auto out = dp(index_select(x, 0, i));
  expect(out.shape() == Shape{0, 3}, "empty slice: forward gives " + out.shape().str() + ", expected [0, 3]");
  const auto l = nn::functional::mse_loss(out, index_select(y, 0, i));
  expect(l.numel() == 1 && std::isnan(l.item()), "empty slice: the mean loss must be NaN (as in PyTorch)");
}

// A different model on one rank is a clear error on every rank.
void check_mismatch(dist::ProcessGroup& pg) {
  manual_seed(1);
  auto m = std::make_shared<nn::Sequential>();
  m->emplace<nn::Linear>(8, pg.rank() == pg.size() - 1 ? 17 : 16);
  bool thrown = false;
  try {
    dist::DataParallel dp(m, pg);
  } catch (const DistributedError& e) {
    thrown = std::string(e.what()).find("0.weight") != std::string::npos;
    if (!thrown) std::printf("rank %d: unexpected message: %s\n", pg.rank(), e.what());
  }
  expect(thrown, "mismatched replicas must raise a DistributedError naming 0.weight");
}

}  // namespace

int main() {
  return testing::mpi::run_job("ddp over mpi", {.timeout = std::chrono::seconds(30)}, [](dist::MpiProcessGroup& pg) {
    check_gradients(pg);
    check_no_sync(pg);
    check_zero(pg);
    check_uneven_sampler(pg, false);
    check_uneven_sampler(pg, true);
    check_uneven_slices(pg, 9);
    check_uneven_slices(pg, 11);
    check_empty_slice(pg);
    check_mismatch(pg);
  });
}
