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
//                             process group is alive, see distributed/mpi.hpp.)
//   test_mpi_failures stall   rank 1 stops taking part (sleeps, alive, as behind a cut link); the
//                             others use the default options, so EMBER_DIST_TIMEOUT_S sets their
//                             timeout, and MpiOptions::abort_on_timeout (default on) makes the
//                             first to time out MPI_Abort the job: mpirun exits 75
//                             (dist::kTimeoutAbortStatus) and kills rank 1.
//   test_mpi_failures env     no MPI: the parsing of EMBER_DIST_TIMEOUT_S and
//                             EMBER_DIST_ABORT_ON_TIMEOUT (values and error messages).
// In throw/exit the other ranks sit in blocking all_reduces with a 5 s timeout; no rank may hang.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "ember/distributed/mpi.hpp"

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

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "throw" || mode == "exit") return run(mode);
  if (mode == "stall") return run_stall();
  if (mode == "env") return run_env();
  std::fprintf(stderr, "usage: %s throw|exit|stall|env\n", argv[0]);
  return 2;
}
