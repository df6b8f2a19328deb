// DataParallel and ZeRO-1 across processes, under mpirun (2 and 3 ranks): the issue's
// multi-process checks of the wrapper itself, on MpiProcessGroup. Each rank also keeps a
// single-process replica and computes, on the whole batch, what the data-parallel run must equal.
// Uneven last batches (DistributedSampler padded / drop_last, slices of different sizes, empty
// slices) must end with the same step count and bit-identical parameters on every rank.
//   mpirun -np 3 test_ddp_mpi
// Plain checks with messages; any failure makes the job exit non-zero ("FAILED" in the output).
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <ember/dist/data_parallel.hpp>
#include <ember/dist/mpi.hpp>
#include <ember/dist/zero.hpp>
#include <ember/data/distributed_sampler.hpp>
#include <ember/ember.hpp>

using namespace ember;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what, int rank) {
  if (!ok) {
    ++failures;
    std::printf("rank %d: FAILED %s\n", rank, what.c_str());
  }
}

// max |a - b| / max |b| over a tensor (summation order differs between the two runs).
double relative_error(const AnyTensor& a, const AnyTensor& b) {
  auto x = a.to_double_vector(), y = b.to_double_vector();
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < x.size(); ++i) {
    num = std::max(num, std::fabs(x[i] - y[i]));
    den = std::max(den, std::fabs(y[i]));
  }
  return num / den;
}

std::shared_ptr<nn::Sequential> make_model() {
  manual_seed(42);  // every rank builds the same replica (DataParallel also broadcasts rank 0's)
  auto m = std::make_shared<nn::Sequential>();
  m->emplace<nn::Linear>(8, 16);
  m->emplace<nn::Tanh>();
  m->emplace<nn::Linear>(16, 3);
  return m;
}

// A fixed regression data set, the same on every rank.
void make_data(Tensor<float>& x, Tensor<float>& y) {
  Generator g(7);
  x = Tensor<float>::randn({60, 8}, Device::cpu(), 0.0, 1.0, g);
  y = Tensor<float>::randn({60, 3}, Device::cpu(), 0.0, 1.0, g);
}

Tensor<float> loss_on(nn::Sequential& m, const Tensor<float>& x, const Tensor<float>& y, const std::vector<int64_t>& idx) {
  auto i = Tensor<int64_t>::from_vector(idx);
  return nn::functional::mse_loss(m(index_select(x, 0, i)), index_select(y, 0, i));
}

// Gradients of DataParallel on each rank's slice equal single-process gradients on the whole
// batch, every iteration, with a new permutation every epoch.
void check_gradients(dist::ProcessGroup& pg) {
  const int R = pg.size(), r = pg.rank();
  Tensor<float> x, y;
  make_data(x, y);
  auto local = make_model();
  auto whole = make_model();
  dist::DataParallel dp(local, pg);
  const int64_t per_rank = 6;  // batch of 6 * R per step
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    data::DistributedSampler all(60, 1, 0, {.seed = 3});
    all.set_epoch(epoch);
    auto order = all.indices();  // the global permutation every rank agrees on
    for (int64_t step = 0; step < 3; ++step) {
      std::vector<int64_t> batch(order.begin() + step * per_rank * R, order.begin() + (step + 1) * per_rank * R);
      std::vector<int64_t> mine;
      for (int64_t k = r; k < static_cast<int64_t>(batch.size()); k += R) mine.push_back(batch[static_cast<size_t>(k)]);
      local->zero_grad();
      whole->zero_grad();
      loss_on(*local, x, y, mine).backward();
      loss_on(*whole, x, y, batch).backward();
      auto pl = local->parameters(), pw = whole->parameters();
      for (size_t p = 0; p < pl.size(); ++p) {
        const double e = relative_error(pl[p].grad(), pw[p].grad());
        expect(e <= 1e-6, "gradient of parameter " + std::to_string(p) + " epoch " + std::to_string(epoch) +
                              " step " + std::to_string(step) + ": relative error " + std::to_string(e), r);
      }
      // Same SGD step on both, so later iterations start from equal parameters.
      optim::SGD a(local->parameters(), {.lr = 0.1}), b(whole->parameters(), {.lr = 0.1});
      a.step();
      b.step();
    }
  }
}

// no_sync: the accumulate-only backward leaves local gradients (different from the baseline on
// some rank), the next synchronised one reduces everything accumulated.
void check_no_sync(dist::ProcessGroup& pg) {
  const int R = pg.size(), r = pg.rank();
  Tensor<float> x, y;
  make_data(x, y);
  auto local = make_model();
  auto whole = make_model();
  dist::DataParallel dp(local, pg);
  std::vector<int64_t> b1, b2, mine1, mine2;
  for (int64_t k = 0; k < 4 * R; ++k) {
    b1.push_back(k);
    b2.push_back(30 + k);
  }
  for (int64_t k = r; k < 4 * R; k += R) {
    mine1.push_back(b1[static_cast<size_t>(k)]);
    mine2.push_back(b2[static_cast<size_t>(k)]);
  }
  {
    auto guard = dp.no_sync();
    loss_on(*local, x, y, mine1).backward();
  }
  loss_on(*whole, x, y, b1).backward();
  double diff = relative_error(local->parameters()[0].grad(), whole->parameters()[0].grad());
  AnyTensor d = Tensor<double>::scalar(diff);
  pg.all_reduce(d, dist::ReduceOp::Max);
  expect(d.item_double() > 1e-4, "no_sync: accumulate-only gradients should differ from the baseline on some rank", r);
  loss_on(*local, x, y, mine2).backward();  // synchronised: reduces both micro-batches
  loss_on(*whole, x, y, b2).backward();
  auto pl = local->parameters(), pw = whole->parameters();
  for (size_t p = 0; p < pl.size(); ++p)
    expect(relative_error(pl[p].grad(), pw[p].grad()) <= 1e-6,
           "no_sync: synchronised gradient of parameter " + std::to_string(p), r);
}

// ZeRO-1 Adam (state sharded) ends with the parameters of plain data-parallel Adam.
void check_zero(dist::ProcessGroup& pg) {
  const int R = pg.size(), r = pg.rank();
  Tensor<float> x, y;
  make_data(x, y);
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
    expect(relative_error(ps[p], pp[p]) <= 1e-5, "ZeRO-1 parameter " + std::to_string(p) + " after 4 Adam steps", r);
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

// One data-parallel step (lossl: this rank's slice) next to the single-process one (lossw: the
// whole batch): the gradients must match, then the same SGD step on both.
void step_and_compare(nn::Sequential& local, nn::Sequential& whole, const Tensor<float>& lossl,
                      const Tensor<float>& lossw, const std::string& what, int r) {
  local.zero_grad();
  whole.zero_grad();
  lossl.backward();
  lossw.backward();
  auto pl = local.parameters(), pw = whole.parameters();
  for (size_t p = 0; p < pl.size(); ++p) {
    const double e = relative_error(pl[p].grad(), pw[p].grad());
    // fp32, the slices' gradients summed against the whole batch's: another summation order (the
    // GEMM library's blocking included: oneDNN's sgemm gave 1e-6 where OpenBLAS gave less).
    expect(e <= 3e-6, what + ": gradient of parameter " + std::to_string(p) + ": relative error " + std::to_string(e),
           r);
  }
  optim::SGD a(local.parameters(), {.lr = 0.1}), b(whole.parameters(), {.lr = 0.1});
  a.step();
  b.step();
}

// End of an uneven run: the same step count, parameters and gradients on every rank (bit for
// bit), and the parameters of the single-process run.
void check_end(dist::ProcessGroup& pg, nn::Sequential& local, nn::Sequential& whole, int64_t steps,
               int64_t expected_steps, const std::string& what) {
  const int r = pg.rank();
  expect(steps == expected_steps,
         what + ": " + std::to_string(steps) + " steps, expected " + std::to_string(expected_steps), r);
  expect(same_on_every_rank(pg, state_of(local, steps)),
         what + ": step count, parameters or gradients differ between ranks at the end", r);
  auto pl = local.parameters(), pw = whole.parameters();
  for (size_t p = 0; p < pl.size(); ++p)
    expect(relative_error(pl[p], pw[p]) <= 1e-5, what + ": parameter " + std::to_string(p) + " at the end", r);
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
  Tensor<float> x, y;
  make_data(x, y);
  auto local = make_model();
  auto whole = make_model();
  dist::DataParallel dp(local, pg);
  std::vector<data::DistributedSampler> samplers;  // every rank's, for the single-process batch
  for (int q = 0; q < R; ++q)
    samplers.emplace_back(n, R, q, data::DistributedSamplerOptions{.seed = 5, .drop_last = drop_last});
  const int64_t count = samplers[static_cast<size_t>(r)].num_samples();
  expect(count == (drop_last ? n / R : (n + R - 1) / R), what + ": num_samples " + std::to_string(count), r);
  expect(samplers[0].total_size() == (drop_last ? n - n % R : n + (R - n % R) % R), what + ": total_size", r);
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
      step_and_compare(*local, *whole, loss_on(*local, x, y, mine), loss_on(*whole, x, y, batch),
                       what + " epoch " + std::to_string(epoch) + " step " + std::to_string(steps), r);
      ++steps;
    }
  }
  check_end(pg, *local, *whole, steps, 2 * ((count + per_rank - 1) / per_rank), what);
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
  Tensor<float> x, y;
  make_data(x, y);
  auto local = make_model();
  auto whole = make_model();
  dist::DataParallel dp(local, pg);
  int64_t steps = 0, empty_steps = 0;
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    data::DistributedSampler all(n, 1, 0, {.seed = 11});
    all.set_epoch(epoch);
    auto order = all.indices();
    for (int64_t at = 0; at < n; at += batch_size) {
      std::vector<int64_t> batch(order.begin() + at, order.begin() + std::min(at + batch_size, n));
      const int64_t b = static_cast<int64_t>(batch.size());
      std::vector<int64_t> mine;
      for (int64_t k = r; k < b; k += R) mine.push_back(batch[static_cast<size_t>(k)]);
      if (mine.empty()) ++empty_steps;
      step_and_compare(*local, *whole, weighted_loss_on(*local, x, y, mine, b, R), loss_on(*whole, x, y, batch),
                       what + " epoch " + std::to_string(epoch) + " step " + std::to_string(steps) + " (slice of " +
                           std::to_string(mine.size()) + ")",
                       r);
      ++steps;
    }
  }
  check_end(pg, *local, *whole, steps, 2 * ((n + batch_size - 1) / batch_size), what);
  if (batch_size == 11)
    expect(empty_steps == (r == 0 ? 0 : 2), what + ": " + std::to_string(empty_steps) + " steps with an empty slice",
           r);
}

// The plain mean loss on an empty slice: DataParallel's forward takes the [0, 8] batch and the
// mean over zero samples is NaN, as in PyTorch (so the logged loss is NaN on that rank; the
// gradients, sums over nothing, are zero). A rank that skips its empty step instead would be worse:
// collectives are matched by order only, so its next all-reduce pairs with the others' current one
// (wrong gradients, no error) until the collectives differ in size and Open MPI aborts the job
// (MPI_ERR_TRUNCATE). So every rank runs every step, an empty slice with a weighted sum
// (weighted_loss_on). Only local work here, no collective.
void check_empty_slice(dist::ProcessGroup& pg) {
  const int r = pg.rank();
  Tensor<float> x, y;
  make_data(x, y);
  auto local = make_model();
  dist::DataParallel dp(local, pg);
  auto i = Tensor<int64_t>::from_vector(std::vector<int64_t>{});
  auto out = dp(index_select(x, 0, i));
  expect(out.shape() == Shape{0, 3}, "empty slice: forward gives " + out.shape().str() + ", expected [0, 3]", r);
  const auto l = nn::functional::mse_loss(out, index_select(y, 0, i));
  expect(l.numel() == 1 && std::isnan(l.item()), "empty slice: the mean loss must be NaN (as in PyTorch)", r);
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
  expect(thrown, "mismatched replicas must raise a DistributedError naming 0.weight", pg.rank());
}

}  // namespace

int main() {
  auto pg = dist::init_from_environment({.timeout = std::chrono::seconds(30)});
  try {
    check_gradients(*pg);
    check_no_sync(*pg);
    check_zero(*pg);
    check_uneven_sampler(*pg, false);
    check_uneven_sampler(*pg, true);
    check_uneven_slices(*pg, 9);
    check_uneven_slices(*pg, 11);
    check_empty_slice(*pg);
    check_mismatch(*pg);
  } catch (const std::exception& e) {
    std::printf("rank %d: FAILED with an exception: %s\n", pg->rank(), e.what());
    ++failures;
  }
  AnyTensor f = Tensor<int64_t>::scalar(failures);
  pg->all_reduce(f, dist::ReduceOp::Sum);
  if (pg->rank() == 0)
    std::printf("ddp over mpi, %d ranks: %s (%lld failures)\n", pg->size(),
                f.item_double() == 0 ? "all checks passed" : "FAILURES", static_cast<long long>(f.item_double()));
  return f.item_double() == 0 ? 0 : 1;
}
