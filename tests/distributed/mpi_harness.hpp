#pragma once
// What the MPI test programs of this folder share. They use plain checks, not Catch2: every rank
// of an mpirun job is a process of its own and runs the same checks. A failed check prints
// "rank R: FAILED <what>" at once; at the end the ranks add up their failures and rank 0 prints
// one verdict, "<name>, N ranks: all checks passed (0 failures)" or "<name>, N ranks: FAILURES
// (k failures)", which tests/distributed/CMakeLists.txt matches along with the exit status
// (non-zero when any rank failed a check).
//
//   int main(int argc, char** argv) {
//     return testing::mpi::run_job("ddp over mpi", {.timeout = std::chrono::seconds(30)},
//                                  [&](dist::MpiProcessGroup& pg) { testing::mpi::expect(ok, "what"); });
//   }
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include <ember/core/random.hpp>
#include <ember/core/tensor.hpp>
#include <ember/dist/mpi.hpp>
#include <ember/nn/activation.hpp>
#include <ember/nn/linear.hpp>
#include <ember/nn/sequential.hpp>

namespace ember::testing::mpi {

// This rank's checks so far, and the scratch folder the job removes when it passed.
struct Tally {
  int rank = 0;
  int checks = 0;
  int failures = 0;
  std::filesystem::path scratch;
};
inline Tally& tally() {
  static Tally t;
  return t;
}

// One check of this rank; a failure is printed at once.
inline void expect(bool ok, const std::string& what) {
  Tally& t = tally();
  ++t.checks;
  if (ok) return;
  ++t.failures;
  std::printf("rank %d: FAILED %s\n", t.rank, what.c_str());
  std::fflush(stdout);
}

// The job's verdict: every rank's failures added up (one all_reduce, so every rank must get
// here), printed by rank 0; the scratch folder removed when all passed. Returns the exit status.
inline int job_verdict(dist::ProcessGroup& pg, const std::string& name) {
  AnyTensor failed = Tensor<int64_t>::scalar(tally().failures);
  pg.all_reduce(failed, dist::ReduceOp::Sum);
  const auto total = static_cast<long long>(failed.item_double());
  if (pg.rank() == 0) {
    std::printf("%s, %d ranks: %s (%lld failures)\n", name.c_str(), pg.size(),
                total == 0 ? "all checks passed" : "FAILURES", total);
    std::fflush(stdout);
    if (total == 0 && !tally().scratch.empty()) std::filesystem::remove_all(tally().scratch);
  }
  return total == 0 ? 0 : 1;
}

// The verdict of a program without MPI (one process): "<name>: all checks passed (0 failures)".
inline int local_verdict(const std::string& name) {
  const int failures = tally().failures;
  std::printf("%s: %s (%d failures)\n", name.c_str(), failures == 0 ? "all checks passed" : "FAILURES", failures);
  return failures == 0 ? 0 : 1;
}

// The whole job: the process group of the launch (`options`), body(group) on every rank (an
// exception out of it is a failed check), then job_verdict.
template <class Body>
int run_job(const std::string& name, const dist::ProcessGroupOptions& options, Body&& body) {
  auto pg = dist::init_from_environment(options);
  tally().rank = pg->rank();
  try {
    body(*pg);
  } catch (const std::exception& e) {
    expect(false, std::string("with an exception: ") + e.what());
  }
  return job_verdict(*pg, name);
}

// A scratch folder for the job: argv[1], else `fallback`. Rank 0 empties it now and removes it
// when the job passed; every rank returns once it is empty.
inline std::filesystem::path scratch_folder(dist::ProcessGroup& pg, int argc, char** argv, const char* fallback) {
  const std::filesystem::path dir = argc > 1 ? argv[1] : fallback;
  if (pg.rank() == 0) std::filesystem::remove_all(dir);
  pg.barrier();
  tally().scratch = dir;
  return dir;
}

// max |a - b| / max |b| over a tensor (for runs whose summation orders differ).
inline double relative_error(const AnyTensor& a, const AnyTensor& b) {
  auto x = a.to_double_vector(), y = b.to_double_vector();
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < x.size(); ++i) {
    num = std::max(num, std::fabs(x[i] - y[i]));
    den = std::max(den, std::fabs(y[i]));
  }
  return num / den;
}

// Linear(in, hidden), Tanh, Linear(hidden, out) from seed 42: the same replica on every rank.
inline std::shared_ptr<nn::Sequential> seeded_mlp(int64_t in, int64_t hidden, int64_t out) {
  manual_seed(42);
  auto m = std::make_shared<nn::Sequential>();
  m->emplace<nn::Linear>(in, hidden);
  m->emplace<nn::Tanh>();
  m->emplace<nn::Linear>(hidden, out);
  return m;
}

// n regression samples (x: [n, in], y: [n, out], standard normal from generator seed 7), the same
// on every rank.
inline std::pair<Tensor<float>, Tensor<float>> regression_data(int64_t n, int64_t in, int64_t out) {
  Generator g(7);
  auto x = Tensor<float>::randn({n, in}, Device::cpu(), 0.0, 1.0, g);
  auto y = Tensor<float>::randn({n, out}, Device::cpu(), 0.0, 1.0, g);
  return {x, y};
}

}  // namespace ember::testing::mpi
