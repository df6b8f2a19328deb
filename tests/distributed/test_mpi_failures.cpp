// Deliberate failures under mpirun: the launcher must end the whole job, with the failing rank's
// status where there is one, and no surviving rank may hang in the collective it was waiting in.
// tests/distributed/CMakeLists.txt runs each mode and checks the exit status, the time and the
// output (expect_exit.cmake).
//
//   test_mpi_failures timeout   rank 0 skips a collective: the others must raise DistributedError
//                               within the 2 s timeout; they report it and abort the job (status 3)
//   test_mpi_failures mismatch  the ranks all_reduce different sizes: a DistributedError naming the
//                               collective (MPI_ERR_TRUNCATE), not a fatal MPI abort, not a hang
//   test_mpi_failures kill      rank 1 SIGKILLs itself mid-loop: the job must end, non-zero, quickly
//   test_mpi_failures throw     rank 1 throws an exception nobody catches mid-loop: std::terminate
//                               aborts it (SIGABRT), mpirun exits 134 (128 + 6)
//   test_mpi_failures exit      rank 1 calls std::exit(7) mid-loop while the others wait in
//                               all_reduce: mpirun must exit 7 at once. ember does not finalise MPI
//                               while a process group is alive (MPI_Finalize would wait for the
//                               other ranks, which wait for rank 1 until their timeout; see
//                               dist/mpi.hpp).
//   test_mpi_failures stall     rank 1 stops taking part (sleeps, alive, as behind a cut link); the
//                               others use the default options, so EMBER_DIST_TIMEOUT_S sets their
//                               timeout, and MpiOptions::abort_on_timeout (default on) makes the
//                               first to time out MPI_Abort the job: mpirun exits 75
//                               (dist::kTimeoutAbortStatus) and kills rank 1.
//   test_mpi_failures env       no MPI: the parsing of EMBER_DIST_TIMEOUT_S and
//                               EMBER_DIST_ABORT_ON_TIMEOUT (values and error messages).
//   test_mpi_failures settings  2 ranks started with different environments (MPMD:
//                               `-np 1 env MKL_CBWR=AVX2 prog settings : -np 1 env -u MKL_CBWR prog
//                               settings`): DataParallel's start-up check (dist/same_settings.hpp)
//                               warns on rank 0 only, naming MKL_CBWR and both values; agreeing
//                               settings are silent; SettingsCheck::Error on one rank throws
//                               DistributedError on both, and the group still works afterwards.
// In kill/throw/exit/stall the other ranks sit in blocking all_reduces; no rank may hang.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ember/dist/data_parallel.hpp"
#include "ember/dist/mpi.hpp"
#include "ember/nn/linear.hpp"
#include "mpi_harness.hpp"

using namespace ember;
using testing::mpi::expect;

namespace {

// All-reduces (ReduceOp::Avg) of `elements` floats in a loop until rank 1 leaves it at iteration
// `at` through fail() (which dies, stalls or returns a status); the other ranks must never get
// out of the loop: the job ends before.
int all_reduce_until_rank_1_fails(dist::ProcessGroup& pg, int64_t elements, int at,
                                  const std::function<int()>& fail) {
  FloatTensor t = FloatTensor::ones({elements});
  for (int i = 0; i < 1000000; ++i) {
    if (i == at && pg.rank() == 1) return fail();
    pg.all_reduce(t, dist::ReduceOp::Avg);
  }
  std::printf("rank %d: FAILED: the loop finished although rank 1 failed\n", pg.rank());
  return 0;
}

// Rank 1 dies (SIGKILL) in the middle of a loop of all_reduces.
int run_kill() {
  auto pg = dist::init_from_environment({.timeout = std::chrono::seconds(15)});
  return all_reduce_until_rank_1_fails(*pg, 1024, 50, [] {
    std::printf("rank 1: raising SIGKILL at iteration 50\n");
    std::fflush(stdout);
    std::raise(SIGKILL);
    return 8;
  });
}

// Rank 1 throws (uncaught) or calls std::exit(7) in the middle of a loop of all_reduces.
int run_throw_or_exit(const std::string& mode) {
  auto pg = dist::init_from_environment({.timeout = std::chrono::seconds(5)});
  return all_reduce_until_rank_1_fails(*pg, 256, 20, [&]() -> int {
    std::printf("rank 1: %s at iteration 20\n", mode == "throw" ? "throwing" : "exiting with status 7");
    std::fflush(stdout);
    if (mode == "throw") throw std::runtime_error("deliberate failure of rank 1");  // uncaught
    std::exit(7);
  });
}

// Rank 1 stops taking part, alive; the others' timeout and abort come from the environment.
int run_stall() {
  auto pg = dist::init_from_environment();  // timeout and abort_on_timeout from the environment
  return all_reduce_until_rank_1_fails(*pg, 256, 20, [&] {
    std::printf("rank 1: stalling at iteration 20 (timeout %lld ms)\n",
                static_cast<long long>(pg->options().timeout.count()));
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(60));  // mpirun must kill it long before
    std::printf("rank 1: FAILED: not killed within 60 s\n");
    return 9;
  });
}

// Rank 0 skips a collective; the others must raise DistributedError within the timeout.
int run_timeout() {
  dist::MpiOptions options;
  options.timeout = std::chrono::milliseconds(2000);
  options.abort_on_timeout = false;  // this test catches the error itself
  auto pg = dist::init_from_environment(options);
  pg->barrier();
  if (pg->rank() == 0) {
    // Not taking part: wait until the others have given up (the job is aborted by then).
    std::this_thread::sleep_for(std::chrono::seconds(20));
    std::printf("rank 0: the job was not aborted within 20 s\n");
    return 5;
  }
  FloatTensor t = FloatTensor::ones({8});
  auto start = std::chrono::steady_clock::now();
  try {
    pg->all_reduce(t);
    std::printf("rank %d: all_reduce completed without rank 0 (unexpected)\n", pg->rank());
    return 6;
  } catch (const DistributedError& e) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("rank %d: DistributedError after %.2f s (as expected): %s\n", pg->rank(), s, e.what());
    std::fflush(stdout);
    bool ok = s < 8.0 && std::strstr(e.what(), "float32[8]") && std::strstr(e.what(), "2000 ms");
    std::printf("rank %d: timeout test %s; aborting the job on purpose\n", pg->rank(), ok ? "EXPECTED-ERROR-OK" : "BAD");
    std::fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, ok ? 3 : 4);
  }
  return 7;
}

// The ranks call all_reduce with different sizes (rank 0: 8 elements, the others: 64): MPI
// reports a truncated message on a rank that receives more than its buffer holds, which must be a
// DistributedError (the group's communicator returns errors), not a fatal MPI abort; that rank
// then ends the job. Ranks whose call "succeeds" wait for the job to end.
int run_mismatch() {
  auto pg = dist::init_from_environment({.timeout = std::chrono::seconds(10)});
  pg->barrier();
  FloatTensor t = FloatTensor::ones({pg->rank() == 0 ? 8 : 64});
  try {
    pg->all_reduce(t);
  } catch (const DistributedError& e) {
    std::printf("rank %d: DistributedError (as expected): %s\nrank %d: MISMATCH-ERROR-OK\n", pg->rank(), e.what(),
                pg->rank());
    std::fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  std::this_thread::sleep_for(std::chrono::seconds(20));  // until a rank that saw the error ends the job
  std::printf("rank %d: no rank reported the mismatch within 20 s\n", pg->rank());
  return 5;
}

// The ValueError message of f() with EMBER_* = value, or "" when it does not throw.
template <class F>
std::string error_of(const char* var, const char* value, F f) {
  setenv(var, value, 1);
  try {
    f();
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

int run_env() {
  unsetenv("EMBER_DIST_TIMEOUT_S");
  expect(dist::ProcessGroupOptions{}.timeout == std::chrono::milliseconds(300000), "unset: 300 s");
  setenv("EMBER_DIST_TIMEOUT_S", "", 1);
  expect(dist::default_timeout() == std::chrono::milliseconds(300000), "empty: 300 s");
  setenv("EMBER_DIST_TIMEOUT_S", "60", 1);
  expect(dist::ProcessGroupOptions{}.timeout == std::chrono::milliseconds(60000), "60: 60000 ms");
  setenv("EMBER_DIST_TIMEOUT_S", "0.25", 1);
  expect(dist::MpiOptions{}.timeout == std::chrono::milliseconds(250), "0.25: 250 ms (MpiOptions too)");
  for (const char* bad : {"abc", "10s", "0", "-3", "nan", "inf", "1e12"}) {
    const std::string m = error_of("EMBER_DIST_TIMEOUT_S", bad, [] { (void)dist::default_timeout(); });
    expect(m.find(std::string("EMBER_DIST_TIMEOUT_S='") + bad + "' is not a number of seconds") != std::string::npos,
           std::string("EMBER_DIST_TIMEOUT_S=") + bad + " is a ValueError naming it: " + m);
  }
  unsetenv("EMBER_DIST_TIMEOUT_S");

  unsetenv("EMBER_DIST_ABORT_ON_TIMEOUT");
  expect(dist::MpiOptions{}.abort_on_timeout, "abort_on_timeout: on by default");
  setenv("EMBER_DIST_ABORT_ON_TIMEOUT", "0", 1);
  expect(!dist::MpiOptions{}.abort_on_timeout, "EMBER_DIST_ABORT_ON_TIMEOUT=0: off");
  setenv("EMBER_DIST_ABORT_ON_TIMEOUT", "1", 1);
  expect(dist::MpiOptions{}.abort_on_timeout, "EMBER_DIST_ABORT_ON_TIMEOUT=1: on");
  const std::string m = error_of("EMBER_DIST_ABORT_ON_TIMEOUT", "yes", [] { (void)dist::MpiOptions{}; });
  expect(m.find("EMBER_DIST_ABORT_ON_TIMEOUT='yes' must be 0 or 1") != std::string::npos,
         "EMBER_DIST_ABORT_ON_TIMEOUT=yes is a ValueError naming it: " + m);
  unsetenv("EMBER_DIST_ABORT_ON_TIMEOUT");
  return testing::mpi::local_verdict("timeout environment");
}

void check_settings(dist::MpiProcessGroup& pg) {
  const int r = pg.rank();
  auto has = [](const std::string& s, const char* part) { return s.find(part) != std::string::npos; };
  const char* cbwr = std::getenv("MKL_CBWR");
  expect(pg.size() == 2, "two ranks");
  expect((r == 0) == (cbwr != nullptr && std::string(cbwr) == "AVX2"),
         "only rank 0 has MKL_CBWR=AVX2 (the MPMD launch of tests/distributed/CMakeLists.txt)");
  auto model = std::make_shared<nn::Linear>(4, 3);
  const char* want = "MKL_CBWR rank0=AVX2 rank1=(unset)";

  // Warn through a hook: rank 0 alone, once, naming the variable, both values and the fix.
  std::vector<std::string> got;
  dist::DataParallelOptions o;
  o.same_settings.mode = dist::SettingsCheck::Warn;
  o.same_settings.warn = [&](const std::string& m) { got.push_back(m); };
  { dist::DataParallel dp(model, pg, o); }
  if (r == 0)
    expect(got.size() == 1 && has(got[0], want) && has(got[0], "mpirun -x MKL_CBWR (Slurm: srun --export=ALL)"),
           "rank 0 warns once naming MKL_CBWR: " + (got.empty() ? std::string("(nothing)") : got[0]));
  else
    expect(got.empty(), "rank 1 does not warn");

  // Agreeing settings (this process's, less MKL_CBWR): silent.
  dist::NumericSettings s = dist::local_numeric_settings();
  std::erase_if(s, [](const dist::NumericSetting& e) { return e.name == "MKL_CBWR"; });
  got.clear();
  o.same_settings.settings = s;
  { dist::DataParallel dp(model, pg, o); }
  expect(got.empty(), "agreeing settings: no warning");

  // SettingsCheck::Error on rank 1 only: both ranks throw, neither waits in a collective.
  o.same_settings.settings.reset();
  o.same_settings.mode = r == 1 ? dist::SettingsCheck::Error : dist::SettingsCheck::Warn;
  std::string thrown;
  try {
    dist::DataParallel dp(model, pg, o);
  } catch (const DistributedError& e) {
    thrown = e.what();
  }
  expect(has(thrown, want), "DistributedError on every rank naming MKL_CBWR: " + thrown);
  expect(got.empty(), "no warning when it is an error");

  // The default sink: std::cerr, on rank 0 (copied to stdout here so the test log shows it).
  std::ostringstream captured;
  std::streambuf* old = std::cerr.rdbuf(captured.rdbuf());
  {
    dist::DataParallelOptions d;
    d.same_settings.mode = dist::SettingsCheck::Warn;
    dist::DataParallel dp(model, pg, d);
  }
  std::cerr.rdbuf(old);
  if (r == 0) {
    expect(has(captured.str(), "warning: ember DataParallel: ranks disagree on settings that change numerics") &&
               has(captured.str(), want),
           "the default warning goes to std::cerr");
    std::printf("rank 0 stderr: %s", captured.str().c_str());
  } else {
    expect(captured.str().empty(), "rank 1 writes nothing to std::cerr");
  }

  // The group still works.
  FloatTensor t = FloatTensor::ones({4});
  pg.all_reduce(t, dist::ReduceOp::Sum);
  expect(t.to_vector()[0] == 2.f, "an all_reduce after the checks");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "timeout") return run_timeout();
  if (mode == "mismatch") return run_mismatch();
  if (mode == "kill") return run_kill();
  if (mode == "throw" || mode == "exit") return run_throw_or_exit(mode);
  if (mode == "stall") return run_stall();
  if (mode == "env") return run_env();
  if (mode == "settings")
    return testing::mpi::run_job("settings", {.timeout = std::chrono::seconds(20)}, check_settings);
  std::fprintf(stderr, "usage: %s timeout|mismatch|kill|throw|exit|stall|env|settings\n", argv[0]);
  return 2;
}
