// Multi-process tests of dist::MpiProcessGroup's collectives (run under mpirun with 2 and 3 ranks;
// see tests/distributed/CMakeLists.txt): all dtypes and ops, async overlap, background progress,
// uneven batches, errors raised before any communication, with the communication thread and
// without it. Every rank checks the results against what it can compute itself (mpi_harness.hpp).
// The deliberate failures (timeouts, a killed rank, mismatched sizes) are test_mpi_failures.cpp.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ember/data/distributed_sampler.hpp"
#include "ember/dist/mpi.hpp"
#include "mpi_harness.hpp"

using namespace ember;
using testing::mpi::expect;

namespace {


bool close(double got, double want, double tol) { return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want)); }

void check_values(const AnyTensor& t, const std::vector<double>& want, double tol, const std::string& what) {
  std::vector<double> got = t.to_double_vector();
  bool ok = got.size() == want.size();
  size_t bad = 0;
  for (size_t i = 0; ok && i < got.size(); ++i) {
    if (!close(got[i], want[i], tol)) {
      ok = false;
      bad = i;
    }
  }
  expect(ok, what + (ok ? "" : ": element " + std::to_string(bad) + " is " +
                                    (bad < got.size() ? std::to_string(got[bad]) : "missing") + ", expected " +
                                    (bad < want.size() ? std::to_string(want[bad]) : "nothing")));
}

template <class Fn>
void check_throws(Fn&& fn, const char* expected_type, const std::string& what) {
  try {
    fn();
  } catch (const std::exception& e) {
    expect(std::string(expected_type) == "any" || std::strstr(typeid(e).name(), expected_type) != nullptr,
           what + ": threw " + typeid(e).name() + " (" + e.what() + "), expected " + expected_type);
    return;
  }
  expect(false, what + ": did not throw");
}

double tol_for(DType t) { return (t == DType::Float16 || t == DType::BFloat16) ? 1e-2 : 1e-6; }

// rank r holds (r + 1) * (i + 1): small integers, exact in every dtype.
void test_all_reduce(dist::MpiProcessGroup& pg, DType dt, dist::ReduceOp op) {
  const int R = pg.size(), r = pg.rank();
  const int64_t n = 37;
  std::vector<double> mine(n), want(n);
  const double S = R * (R + 1) / 2.0;
  for (int64_t i = 0; i < n; ++i) {
    mine[i] = (r + 1) * static_cast<double>(i % 8 + 1);
    double k = static_cast<double>(i % 8 + 1);
    if (op == dist::ReduceOp::Sum) want[i] = S * k;
    if (op == dist::ReduceOp::Max) want[i] = R * k;
    if (op == dist::ReduceOp::Avg) want[i] = is_floating(dt) ? S * k / R : std::trunc(S * k / R);
  }
  AnyTensor t = FloatTensor::from_vector(std::vector<float>(mine.begin(), mine.end())).to(dt).detach();
  pg.all_reduce(t, op);
  check_values(t, want, tol_for(dt), std::string("all_reduce ") + dist::reduce_op_name(op) + " " + dtype_name(dt));
}

void test_collectives(dist::MpiProcessGroup& pg) {
  const int R = pg.size(), r = pg.rank();
  const DType all_dtypes[] = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                              DType::Int32,   DType::Int64,   DType::UInt8};

  for (DType dt : all_dtypes) test_all_reduce(pg, dt, dist::ReduceOp::Sum);
  for (DType dt : {DType::Float32, DType::Float64, DType::Int64, DType::Float16}) {
    test_all_reduce(pg, dt, dist::ReduceOp::Avg);
    test_all_reduce(pg, dt, dist::ReduceOp::Max);
  }

  // A large message (several MB: Open MPI's pipelined algorithms).
  {
    const int64_t n = 1 << 20;
    FloatTensor t = FloatTensor::full({n}, static_cast<double>(r + 1));
    pg.all_reduce(t, dist::ReduceOp::Avg);
    std::vector<float> v = t.to_vector();
    bool ok = true;
    for (float x : v) ok = ok && close(x, (R + 1) / 2.0, 1e-6);
    expect(ok, "all_reduce avg float32 of 1M elements");
  }

  // Broadcast from the last rank, every dtype.
  for (DType dt : all_dtypes) {
    const int root = R - 1;
    std::vector<float> vals(11);
    for (int i = 0; i < 11; ++i) vals[i] = static_cast<float>(r * 10 + i);
    AnyTensor t = FloatTensor::from_vector(vals, Shape{11}).to(dt).detach();
    pg.broadcast(t, root);
    std::vector<double> want(11);
    for (int i = 0; i < 11; ++i) want[i] = root * 10 + i;
    check_values(t, want, 0.0, std::string("broadcast from rank ") + std::to_string(root) + " " + dtype_name(dt));
  }

  // reduce_scatter: input[j] = r + j over R * m elements; rank r gets sum_q (q + r*m + k).
  for (DType dt : {DType::Float32, DType::Float64, DType::Int64, DType::Float16}) {
    for (dist::ReduceOp op : {dist::ReduceOp::Sum, dist::ReduceOp::Avg, dist::ReduceOp::Max}) {
      const int64_t m = 5;
      std::vector<float> in(static_cast<size_t>(R * m));
      for (int64_t j = 0; j < R * m; ++j) in[j] = static_cast<float>(r + j);
      AnyTensor input = FloatTensor::from_vector(in).to(dt).detach();
      AnyTensor output = AnyTensor::zeros({m}, dt);
      pg.reduce_scatter(output, input, op);
      std::vector<double> want(m);
      for (int64_t k = 0; k < m; ++k) {
        double base = static_cast<double>(r * m + k);
        double sum = R * base + R * (R - 1) / 2.0;
        if (op == dist::ReduceOp::Sum) want[k] = sum;
        if (op == dist::ReduceOp::Max) want[k] = base + (R - 1);
        if (op == dist::ReduceOp::Avg) want[k] = is_floating(dt) ? sum / R : std::trunc(sum / R);
      }
      check_values(output, want, tol_for(dt),
                   std::string("reduce_scatter ") + dist::reduce_op_name(op) + " " + dtype_name(dt));
    }
  }

  // all_gather: chunk q is rank q's input.
  for (DType dt : all_dtypes) {
    const int64_t m = 6;
    std::vector<float> in(m);
    for (int64_t k = 0; k < m; ++k) in[k] = static_cast<float>(r * 20 + k);
    AnyTensor input = FloatTensor::from_vector(in).to(dt).detach();
    AnyTensor output = AnyTensor::zeros({R, m}, dt);
    pg.all_gather(output, input);
    std::vector<double> want;
    for (int q = 0; q < R; ++q)
      for (int64_t k = 0; k < m; ++k) want.push_back(q * 20 + k);
    check_values(output, want, 0.0, std::string("all_gather ") + dtype_name(dt));
  }

  pg.barrier();
  expect(true, "barrier");

  // Async overlap: start two collectives, wait for them in the reverse order.
  {
    FloatTensor a = FloatTensor::full({1000}, r + 1.0);
    LongTensor b_in = LongTensor::full({3}, static_cast<double>(r));
    LongTensor b_out = LongTensor::zeros({3 * R});
    auto wa = pg.all_reduce_async(a, dist::ReduceOp::Sum);
    auto wb = pg.all_gather_async(b_out, b_in);
    wb->wait();
    wa->wait();
    expect(wa->is_completed() && wb->is_completed(), "async: both Work handles report completion");
    check_values(a, std::vector<double>(1000, R * (R + 1) / 2.0), 1e-6, "async overlap: all_reduce");
    std::vector<double> want;
    for (int q = 0; q < R; ++q) want.insert(want.end(), 3, q);
    check_values(b_out, want, 0.0, "async overlap: all_gather");
  }

  // Uneven batches: rank r has 3 + r samples with losses r + i / 10; the global mean weights
  // every sample once (all_reduce of [loss sum, count], not the mean of the ranks' means).
  {
    const int B = 3 + r;
    double local_sum = 0;
    for (int i = 0; i < B; ++i) local_sum += r + i / 10.0;
    DoubleTensor stats = DoubleTensor::from_vector({local_sum, static_cast<double>(B)});
    pg.all_reduce(stats, dist::ReduceOp::Sum);
    double total = 0, count = 0;
    for (int q = 0; q < R; ++q)
      for (int i = 0; i < 3 + q; ++i) {
        total += q + i / 10.0;
        count += 1;
      }
    std::vector<double> s = stats.to_vector();
    expect(close(s[1], count, 0) && close(s[0] / s[1], total / count, 1e-12),
           "uneven batches: global mean over " + std::to_string(static_cast<int>(count)) + " samples");
    // The sampler evens out the shares: 10 samples over R ranks, every rank gets the same count,
    // and together (with padding) they cover all 10.
    data::DistributedSampler sampler(10, R, r, {.seed = 1});
    sampler.set_epoch(3);
    std::vector<int64_t> idx = sampler.indices();
    LongTensor mine = LongTensor::from_vector(idx);
    LongTensor all = LongTensor::zeros({static_cast<int64_t>(idx.size()) * R});
    pg.all_gather(all, mine);
    std::vector<int64_t> v = all.to_vector();
    std::vector<bool> seen(10, false);
    for (int64_t i : v) seen[static_cast<size_t>(i)] = true;
    bool covered = true;
    for (bool b : seen) covered = covered && b;
    expect(covered && static_cast<int64_t>(v.size()) == sampler.total_size(),
           "sampler: shares gathered from all ranks cover the dataset");
  }

  // Errors raised before any communication (every rank raises the same one, so no rank waits).
  {
    FloatTensor in = FloatTensor::zeros({4});
    FloatTensor out = FloatTensor::zeros({4 * R + 1});
    check_throws([&] { pg.all_gather(out, in); }, "ShapeError", "all_gather with a wrong output size");
    FloatTensor rs_out = FloatTensor::zeros({3});
    check_throws([&] { pg.reduce_scatter(rs_out, in); }, "ShapeError", "reduce_scatter with a wrong input size");
    DoubleTensor other = DoubleTensor::zeros({4 * R});
    check_throws([&] { pg.all_gather(other, in); }, "DTypeError", "all_gather with a different output dtype");
    FloatTensor t = FloatTensor::zeros({2});
    check_throws([&] { pg.broadcast(t, R); }, "ValueError", "broadcast from a root outside the group");
  }

  // Empty tensors complete at once.
  {
    FloatTensor e = FloatTensor::zeros({0});
    expect(pg.all_reduce_async(e)->is_completed(), "all_reduce of an empty tensor");
  }
  expect(pg.backend_name() == "mpi", "backend_name");
  expect(pg.local_rank() >= 0 && pg.local_rank() < pg.local_size(), "local_rank in [0, local_size)");
}

// With the communication thread a collective completes while the caller does not enter MPI at all:
// an 8 MB all_reduce (far more than one MPI_Test can move) is complete after the caller slept.
void test_background_progress(dist::MpiProcessGroup& pg) {
  const int R = pg.size(), r = pg.rank();
  FloatTensor t = FloatTensor::full({int64_t{2} << 20}, static_cast<double>(r + 1));
  pg.barrier();
  auto w = pg.all_reduce_async(t, dist::ReduceOp::Sum);
  if (pg.has_comm_thread()) {
    // is_completed() only reads the flag the thread sets: it never enters MPI itself.
    bool done = false;
    for (int i = 0; i < 100 && !done; ++i) {  // up to 2 s: the other ranks may start later
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      done = w->is_completed();
    }
    expect(done, "comm thread: an 8 MB all_reduce completed while the caller slept");
  }
  w->wait();
  std::vector<float> v = t.to_vector();
  expect(v.front() == R * (R + 1) / 2.0f && v.back() == R * (R + 1) / 2.0f, "background all_reduce: values");

  // A Work dropped before completion still completes (the thread owns it) and later
  // collectives are unaffected.
  if (pg.has_comm_thread()) {
    FloatTensor d = FloatTensor::full({int64_t{1} << 18}, 1.0);
    pg.all_reduce_async(d, dist::ReduceOp::Sum);  // handle dropped at once
    FloatTensor e = FloatTensor::full({3}, 2.0);
    pg.all_reduce(e, dist::ReduceOp::Sum);
    check_values(e, std::vector<double>(3, 2.0 * R), 0.0, "all_reduce after a dropped Work");
    bool dropped_done = false;
    for (int i = 0; i < 200 && !dropped_done; ++i) {
      dropped_done = d.data()[0] == static_cast<float>(R) && d.data()[(1 << 18) - 1] == static_cast<float>(R);
      if (!dropped_done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    expect(dropped_done, "a dropped Work completes in the background");
  }
}

}  // namespace

int main() {
  return testing::mpi::run_job("test_mpi collectives", {.timeout = std::chrono::seconds(30)},
                               [](dist::MpiProcessGroup& pg) {
    // The same checks once more with the caller driving MPI (MpiOptions::comm_thread = false).
    dist::MpiOptions caller_driven;
    caller_driven.timeout = std::chrono::seconds(30);
    caller_driven.comm_thread = false;
    dist::MpiProcessGroup pg_caller(caller_driven);
    auto t0 = std::chrono::steady_clock::now();
    expect(pg.has_comm_thread() == (pg.thread_level() == MPI_THREAD_MULTIPLE),
           "the communication thread runs exactly where MPI provides MPI_THREAD_MULTIPLE");
    expect(!pg_caller.has_comm_thread(), "MpiOptions::comm_thread = false: no communication thread");
    for (dist::MpiProcessGroup* g : {&pg, &pg_caller}) {
      try {
        test_collectives(*g);
        test_background_progress(*g);
      } catch (const std::exception& e) {
        expect(false, std::string("unexpected exception: ") + e.what());
      }
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const auto& tally = testing::mpi::tally();
    std::printf("test_mpi rank %d of %d: %d checks, %d failed (%.0f ms, thread level %d, comm thread %s)\n",
                pg.rank(), pg.size(), tally.checks, tally.failures, ms, pg.thread_level(),
                pg.has_comm_thread() ? "on" : "off");
    std::fflush(stdout);
  });
}
