#pragma once
// dist::MpiWork: the Work handle of a dist::MpiProcessGroup collective (its deadline, its abort on
// timeout). Part of ember/dist/mpi.hpp, which includes it where mpi.h exists.
#include <mpi.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "ember/core/error.hpp"
#include "ember/core/tensor.hpp"
#include "ember/dist/detail/mpi_comm_thread.hpp"
#include "ember/dist/detail/mpi_pending.hpp"
#include "ember/dist/detail/mpi_runtime.hpp"
#include "ember/dist/process_group.hpp"

namespace ember::dist {

// A pending MPI collective. With the group's communication thread (the default where MPI provides
// MPI_THREAD_MULTIPLE) wait() sleeps until that thread has run it; without one, wait() drives the
// non-blocking request with MPI_Test. Either way it gives up when ProcessGroupOptions::timeout has
// passed since the wait began.
class MpiWork : public Work {
 public:
  // abort_status: when not 0, a timeout ends the whole job with this status (MPI_Abort) instead
  // of throwing (MpiOptions::abort_on_timeout, dist::kTimeoutAbortStatus).
  MpiWork(std::string what, int rank, std::chrono::milliseconds timeout, std::shared_ptr<detail::MpiCommThread> comm,
          int abort_status = 0)
      : p_(std::make_shared<detail::MpiPending>()), timeout_(timeout), comm_(std::move(comm)),
        abort_status_(abort_status) {
    p_->what = std::move(what);
    p_->rank = rank;
  }
  MpiWork(const MpiWork&) = delete;
  MpiWork& operator=(const MpiWork&) = delete;

  ~MpiWork() override {
    if (started_ && !comm_ && p_->status.load() == detail::MpiPending::kPending) {
      // Nobody drives this request any more and MPI forbids freeing a pending one: keep its
      // buffers alive for good. (A communication thread runs its collectives to the end.)
      detail::MpiRuntime::instance().poison();
      new std::shared_ptr<detail::MpiPending>(p_);
    }
  }

  bool is_completed() override {
    int s = p_->status.load(std::memory_order_acquire);
    if (s == detail::MpiPending::kPending && !comm_) {
      p_->test();
      s = p_->status.load(std::memory_order_acquire);
    }
    if (s == detail::MpiPending::kFailed) throw DistributedError(p_->error);
    return s == detail::MpiPending::kDone;
  }

  void wait() override {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout_;
    if (comm_) {
      comm_->wait_until(*p_, deadline);
    } else {
      const auto spin_until = start + std::chrono::milliseconds(200);
      while (!p_->test()) {
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) break;
        // Poll hard at first (MPI progresses inside MPI_Test), then back off to spare the CPU.
        if (now < spin_until) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      }
    }
    const int s = p_->status.load(std::memory_order_acquire);
    if (s == detail::MpiPending::kDone) return;
    if (s == detail::MpiPending::kFailed) throw DistributedError(p_->error);
    detail::MpiRuntime::instance().poison();
    std::string message = ::ember::detail::str_cat(
        "MPI ", p_->what, ": rank ", p_->rank, " timed out after ", timeout_.count(),
        " ms waiting for the other ranks (ProcessGroupOptions::timeout); a peer failed, exited or "
        "skipped this collective. The process group is unusable now.");
    if (abort_status_ != 0) detail::abort_mpi_job(message, abort_status_);
    throw DistributedError(message);
  }

  // ---- set-up by MpiProcessGroup, before start() ----
  void keep(const AnyTensor& t) { p_->keep.push_back(t); }
  // A float32 buffer of n values that lives until the collective completes.
  float* temp(int64_t n) {
    auto& v = p_->temps.emplace_back(static_cast<size_t>(n));
    return v.data();
  }
  void on_complete(std::function<void()> f) { p_->finish = std::move(f); }
  const std::string& what() const { return p_->what; }
  // Starts the collective: `blocking` on the communication thread, or `nonblocking` (an MPI_I*
  // call filling the request) here. Returns the MPI error code of an MPI_I* call (else success).
  int start(std::function<int()> blocking, const std::function<int(MPI_Request*)>& nonblocking) {
    if (comm_) {
      comm_->submit(p_, std::move(blocking));
      started_ = true;
      return MPI_SUCCESS;
    }
    int rc;
    {
      detail::MpiLock lock;
      rc = nonblocking(&p_->req);
    }
    started_ = rc == MPI_SUCCESS;
    return rc;
  }

 private:
  std::shared_ptr<detail::MpiPending> p_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<detail::MpiCommThread> comm_;
  int abort_status_ = 0;
  bool started_ = false;
};

}  // namespace ember::dist
