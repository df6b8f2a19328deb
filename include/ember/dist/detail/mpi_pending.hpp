#pragma once
// The bookkeeping of one MPI collective in flight (dist::MpiProcessGroup): its buffers, what to do
// when it completes, its outcome. Part of ember/dist/mpi.hpp, which includes it where mpi.h exists.
#include <mpi.h>

#include <atomic>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/core/tensor.hpp"
#include "ember/dist/detail/mpi_runtime.hpp"

namespace ember::dist::detail {

// to do once it has (averaging, narrowing back to 16-bit floats), and its outcome. Exactly one
// thread drives it: the group's communication thread, or (without one) the caller that waits.
struct MpiPending {
  enum Status : int { kPending, kDone, kFailed };

  std::string what;
  int rank = 0;
  MPI_Request req = MPI_REQUEST_NULL;  // without a communication thread: the non-blocking request
  std::vector<AnyTensor> keep;
  std::deque<std::vector<float>> temps;  // a deque: references stay valid as it grows
  std::function<void()> finish;
  std::atomic<int> status{kPending};
  std::string error;  // written before status becomes kFailed

  void complete() {
    if (finish) finish();
    finish = nullptr;
    keep.clear();
    temps.clear();
    status.store(kDone, std::memory_order_release);
  }
  void fail(int rc) { fail(::ember::detail::str_cat("MPI ", what, " on rank ", rank, " failed: ", mpi_error_string(rc))); }
  void fail(std::string message) {
    MpiRuntime::instance().poison();
    error = std::move(message);
    req = MPI_REQUEST_NULL;  // no longer usable: never test it again
    keep.clear();
    status.store(kFailed, std::memory_order_release);
  }
  // Without a communication thread: one MPI_Test (which also advances MPI) and its outcome.
  bool test() {
    int flag = 0;
    int rc;
    {
      MpiLock lock;
      rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    }
    if (rc != MPI_SUCCESS) {
      fail(rc);
    } else if (flag) {
      complete();
    }
    return status.load(std::memory_order_acquire) != kPending;
  }
};

}  // namespace ember::dist::detail
