#pragma once
// The process-wide side of dist::MpiProcessGroup: MPI's initialisation and finalisation
// (MpiRuntime), the lock that serialises ember's MPI calls where MPI is not MPI_THREAD_MULTIPLE
// (MpiLock), MPI's error text, the abort of the whole job, and the default of
// MpiOptions::abort_on_timeout. Part of ember/dist/mpi.hpp, which includes it where mpi.h exists.
#include <mpi.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "ember/core/error.hpp"

namespace ember::dist::detail {

// MPI's lifetime in this process: initialised on first use (unless the program did it), finalised
// at exit when ember initialised it, no collective was lost to a failure and no group is alive.
class MpiRuntime {
 public:
  static MpiRuntime& instance() {
    static MpiRuntime rt;
    return rt;
  }
  int thread_level() const { return provided_; }
  bool serialized() const { return provided_ < MPI_THREAD_MULTIPLE; }
  // After a timeout or an MPI error a collective may still be pending: MPI_Finalize would hang.
  void poison() { poisoned_.store(true); }
  bool poisoned() const { return poisoned_.load(); }
  std::mutex& mutex() { return mu_; }
  // MpiProcessGroups alive now (constructor / destructor).
  void group_created() { live_groups_.fetch_add(1); }
  void group_destroyed() { live_groups_.fetch_sub(1); }
  int live_groups() const { return live_groups_.load(); }

  // Runs at exit (std::exit or the end of main). A group still alive means the program is leaving
  // in the middle of its work, with peers that may be waiting for it in a collective: MPI_Finalize
  // would block until they reach it (never, if they wait in an all_reduce: until their timeout).
  // Leaving without it lets the launcher see this rank end and end the job with its status.
  ~MpiRuntime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (we_initialised_ && !finalized && !poisoned_.load() && live_groups_.load() == 0) MPI_Finalize();
  }

 private:
  MpiRuntime() {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised) {
      // A group's communication thread sits inside blocking MPI calls while the training thread
      // computes, so this process has more threads that want a core than it was given. Open MPI
      // busy-polls while it waits; yielding the core between polls (what it does on its own when
      // it knows it is oversubscribed) keeps the waiting thread from starving the computing one:
      // bench_ddp_overlap --device-ms 1 here hid 77% of DataParallel's communication with it, 45%
      // without it.
      // Only a default: the launcher's or the user's setting (--mca, OMPI_MCA_*) wins.
      setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
      int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided_);
      if (rc != MPI_SUCCESS) throw DistributedError("MPI_Init_thread failed (error code " + std::to_string(rc) + ")");
      we_initialised_ = true;
    } else {
      MPI_Query_thread(&provided_);
    }
    if (provided_ < MPI_THREAD_SERIALIZED) {
      throw DistributedError(
          "MpiProcessGroup: the MPI library provides thread level " + std::to_string(provided_) +
          " but needs at least MPI_THREAD_SERIALIZED (initialise MPI with MPI_Init_thread)");
    }
  }
  int provided_ = MPI_THREAD_SINGLE;
  bool we_initialised_ = false;
  std::atomic<bool> poisoned_{false};
  std::atomic<int> live_groups_{0};
  std::mutex mu_;
};

// The default of MpiOptions::abort_on_timeout: EMBER_DIST_ABORT_ON_TIMEOUT (0 or 1) when set and
// not empty, else on. Another value is a ValueError naming the variable.
inline bool default_abort_on_timeout() {
  const char* v = std::getenv("EMBER_DIST_ABORT_ON_TIMEOUT");
  if (!v || !*v) return true;
  const std::string s(v);
  EMBER_CHECK(s == "0" || s == "1", ValueError, "EMBER_DIST_ABORT_ON_TIMEOUT='", s,
              "' must be 0 or 1 (the default of MpiOptions::abort_on_timeout)");
  return s == "1";
}

// Locks the runtime's mutex only when MPI is not MPI_THREAD_MULTIPLE.
class MpiLock {
 public:
  MpiLock() {
    auto& rt = MpiRuntime::instance();
    if (rt.serialized()) lock_ = std::unique_lock<std::mutex>(rt.mutex());
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

inline std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error code " + std::to_string(code);
  return std::string(buf, static_cast<size_t>(len));
}

// MpiOptions::abort_on_timeout: says why on stderr (the launcher shows it), then ends the whole
// job with `status`.
[[noreturn]] inline void abort_mpi_job(const std::string& message, int status) {
  std::fprintf(stderr,
               "ember: DistributedError: %s\nember: aborting the MPI job with status %d "
               "(MpiOptions::abort_on_timeout; EMBER_DIST_ABORT_ON_TIMEOUT=0 to handle the error instead)\n",
               message.c_str(), status);
  std::fflush(stderr);
  {
    MpiLock lock;  // serialised MPI: no other call of ours runs at the same time
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  std::_Exit(status);  // MPI_Abort does not return; should it, end this rank anyway
}

}  // namespace ember::dist::detail
