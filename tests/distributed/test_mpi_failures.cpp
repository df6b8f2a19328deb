// Deliberate failures of one rank under mpirun, checked by their exit status (issue 14): the
// launcher must end the whole job with the failing rank's status, and no surviving rank may hang
// in the collective it was waiting in (tests/distributed/CMakeLists.txt, expect_exit.cmake).
//
//   test_mpi_failures throw   rank 1 throws an exception nobody catches mid-loop: std::terminate
//                             aborts it (SIGABRT), mpirun exits 134 (128 + 6)
//   test_mpi_failures exit    rank 1 calls std::exit(7) mid-loop while the others wait in
//                             all_reduce: mpirun must exit 7 at once. (Before the fix, exit ran
//                             ember's static MpiRuntime destructor, whose MPI_Finalize waited for
//                             the other ranks, so mpirun never saw rank 1 end and the job hung
//                             until the survivors' timeout; now MPI is not finalised while a
//                             process group is alive, see dist/mpi.hpp.)
//   test_mpi_failures stall   rank 1 stops taking part (sleeps, alive, as behind a cut link); the
//                             others use the default options, so EMBER_DIST_TIMEOUT_S sets their
//                             timeout, and MpiOptions::abort_on_timeout (default on) makes the
//                             first to time out MPI_Abort the job: mpirun exits 75
//                             (dist::kTimeoutAbortStatus) and kills rank 1.
//   test_mpi_failures env     no MPI: the parsing of EMBER_DIST_TIMEOUT_S and
//                             EMBER_DIST_ABORT_ON_TIMEOUT (values and error messages).
//   test_mpi_failures settings  2 ranks started with different environments (MPMD:
//                             `-np 1 env MKL_CBWR=AVX2 prog settings : -np 1 env -u MKL_CBWR prog
//                             settings`): DataParallel's start-up check (dist/same_settings.hpp)
//                             warns on rank 0 only, naming MKL_CBWR and both values; agreeing
//                             settings are silent; SettingsCheck::Error on one rank throws
//                             DistributedError on both, and the group still works afterwards.
// In throw/exit the other ranks sit in blocking all_reduces with a 5 s timeout; no rank may hang.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include <iostream>
#include <sstream>
#include <vector>

#include "ember/dist/data_parallel.hpp"
#include "ember/dist/mpi.hpp"
#include "ember/nn/linear.hpp"

using namespace ember;

namespace {

int run(const std::string& mode) {
  auto pg = dist::init_from_environment({.timeout = std::chrono::seconds(5)});
  FloatTensor t = FloatTensor::ones({256});
  for (int i = 0; i < 1000000; ++i) {
    if (i == 20 && pg->rank() == 1) {
      std::printf("rank 1: %s at iteration %d\n", mode == "throw" ? "throwing" : "exiting with status 7", i);
      std::fflush(stdout);
      if (mode == "throw") throw std::runtime_error("deliberate failure of rank 1");  // uncaught
      std::exit(7);
    }
    pg->all_reduce(t, dist::ReduceOp::Avg);
  }
  std::printf("rank %d: FAILED: the loop finished although rank 1 failed\n", pg->rank());
  return 0;
}

int run_stall() {
  auto pg = dist::init_from_environment();  // timeout and abort_on_timeout from the environment
  FloatTensor t = FloatTensor::ones({256});
  for (int i = 0; i < 1000000; ++i) {
    if (i == 20 && pg->rank() == 1) {
      std::printf("rank 1: stalling at iteration %d (timeout %lld ms)\n", i,
                  static_cast<long long>(pg->options().timeout.count()));
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::seconds(60));  // mpirun must kill it long before
      std::printf("rank 1: FAILED: not killed within 60 s\n");
      return 9;
    }
    pg->all_reduce(t, dist::ReduceOp::Avg);
  }
  std::printf("rank %d: FAILED: the loop finished although rank 1 stalled\n", pg->rank());
  return 0;
}

int g_failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what.c_str());
  if (!ok) ++g_failures;
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
  check(dist::ProcessGroupOptions{}.timeout == std::chrono::milliseconds(300000), "unset: 300 s");
  setenv("EMBER_DIST_TIMEOUT_S", "", 1);
  check(dist::default_timeout() == std::chrono::milliseconds(300000), "empty: 300 s");
  setenv("EMBER_DIST_TIMEOUT_S", "60", 1);
  check(dist::ProcessGroupOptions{}.timeout == std::chrono::milliseconds(60000), "60: 60000 ms");
  setenv("EMBER_DIST_TIMEOUT_S", "0.25", 1);
  check(dist::MpiOptions{}.timeout == std::chrono::milliseconds(250), "0.25: 250 ms (MpiOptions too)");
  for (const char* bad : {"abc", "10s", "0", "-3", "nan", "inf", "1e12"}) {
    const std::string m = error_of("EMBER_DIST_TIMEOUT_S", bad, [] { (void)dist::default_timeout(); });
    check(m.find(std::string("EMBER_DIST_TIMEOUT_S='") + bad + "' is not a number of seconds") != std::string::npos,
          std::string("EMBER_DIST_TIMEOUT_S=") + bad + " is a ValueError naming it: " + m);
  }
  unsetenv("EMBER_DIST_TIMEOUT_S");

  unsetenv("EMBER_DIST_ABORT_ON_TIMEOUT");
  check(dist::MpiOptions{}.abort_on_timeout, "abort_on_timeout: on by default");
  setenv("EMBER_DIST_ABORT_ON_TIMEOUT", "0", 1);
  check(!dist::MpiOptions{}.abort_on_timeout, "EMBER_DIST_ABORT_ON_TIMEOUT=0: off");
  setenv("EMBER_DIST_ABORT_ON_TIMEOUT", "1", 1);
  check(dist::MpiOptions{}.abort_on_timeout, "EMBER_DIST_ABORT_ON_TIMEOUT=1: on");
  const std::string m = error_of("EMBER_DIST_ABORT_ON_TIMEOUT", "yes", [] { (void)dist::MpiOptions{}; });
  check(m.find("EMBER_DIST_ABORT_ON_TIMEOUT='yes' must be 0 or 1") != std::string::npos,
        "EMBER_DIST_ABORT_ON_TIMEOUT=yes is a ValueError naming it: " + m);
  unsetenv("EMBER_DIST_ABORT_ON_TIMEOUT");
  std::printf("%s\n", g_failures == 0 ? "all checks passed" : "FAILURES");
  return g_failures == 0 ? 0 : 1;
}

int run_settings() {
  auto pg = dist::init_from_environment({.timeout = std::chrono::seconds(20)});
  const int r = pg->rank();
  int failures = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::printf("rank %d: FAILED: %s\n", r, what.c_str());
      ++failures;
    }
  };
  auto has = [](const std::string& s, const char* part) { return s.find(part) != std::string::npos; };
  const char* cbwr = std::getenv("MKL_CBWR");
  expect(pg->size() == 2, "two ranks");
  expect((r == 0) == (cbwr != nullptr && std::string(cbwr) == "AVX2"),
         "only rank 0 has MKL_CBWR=AVX2 (the MPMD launch of tests/distributed/CMakeLists.txt)");
  auto model = std::make_shared<nn::Linear>(4, 3);
  const char* want = "MKL_CBWR rank0=AVX2 rank1=(unset)";

  // Warn through a hook: rank 0 alone, once, naming the variable, both values and the fix.
  std::vector<std::string> got;
  dist::DataParallelOptions o;
  o.same_settings.mode = dist::SettingsCheck::Warn;
  o.same_settings.warn = [&](const std::string& m) { got.push_back(m); };
  { dist::DataParallel dp(model, *pg, o); }
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
  { dist::DataParallel dp(model, *pg, o); }
  expect(got.empty(), "agreeing settings: no warning");

  // SettingsCheck::Error on rank 1 only: both ranks throw, neither waits in a collective.
  o.same_settings.settings.reset();
  o.same_settings.mode = r == 1 ? dist::SettingsCheck::Error : dist::SettingsCheck::Warn;
  std::string thrown;
  try {
    dist::DataParallel dp(model, *pg, o);
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
    dist::DataParallel dp(model, *pg, d);
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
  pg->all_reduce(t, dist::ReduceOp::Sum);
  expect(t.to_vector()[0] == 2.f, "an all_reduce after the checks");
  std::printf("rank %d: settings: %s\n", r, failures ? "FAILURES" : "all checks passed");
  std::fflush(stdout);
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "throw" || mode == "exit") return run(mode);
  if (mode == "stall") return run_stall();
  if (mode == "env") return run_env();
  if (mode == "settings") return run_settings();
  std::fprintf(stderr, "usage: %s throw|exit|stall|env|settings\n", argv[0]);
  return 2;
}
