#pragma once
// The communication thread of a dist::MpiProcessGroup (MpiOptions::comm_thread). Part of
// ember/dist/mpi.hpp, which includes it where mpi.h exists.
#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "ember/core/error.hpp"
#include "ember/dist/detail/mpi_pending.hpp"
#include "ember/dist/detail/mpi_runtime.hpp"

namespace ember::dist::detail {

// A group's communication thread: runs the group's collectives one after another, in the order
// they were started, as blocking MPI calls (MPI_Allreduce, ...).
//
// Why: Open MPI advances a non-blocking collective only while some thread is inside an MPI call,
// so an all_reduce started from a gradient hook would sit still until the caller waits for it at
// the end of backward. A thread inside the blocking call moves it while the caller computes, and
// the blocking algorithms (coll/tuned) are about twice as fast as the non-blocking ones (libnbc)
// for MB-sized messages. Measured (benchmarks/bench_mpi_progress, plain MPI, 2 ranks, four 2 MB
// all-reduces in a step whose compute is a sleep, as with an accelerator): 74-76% of the
// all-reduce time hidden with this design, 19-21% with a thread polling non-blocking requests,
// none with MPI_Test calls between compute chunks; DataParallel with bucket views: 77%
// (bench_ddp_overlap). Where every core is busy computing, a thread cannot hide communication
// that itself needs a core (shared-memory copies): 13% there (see docs/distributed.md).
//
// A blocking MPI call cannot be interrupted: if a peer vanishes the thread stays inside it. The
// waiters give up at their deadline (ProcessGroupOptions::timeout) with DistributedError; the
// thread is then detached, never joined, and MPI is not finalised.
class MpiCommThread {
 public:
  using Job = std::function<int()>;  // one blocking MPI call; returns its error code

  explicit MpiCommThread(std::chrono::milliseconds drain_timeout)
      : s_(std::make_shared<Shared>()), drain_timeout_(drain_timeout) {
    thread_ = std::thread([s = s_] { run(*s); });
  }
  MpiCommThread(const MpiCommThread&) = delete;
  MpiCommThread& operator=(const MpiCommThread&) = delete;

  // Collectives still queued run first (the peers expect them), for at most drain_timeout; a thread
  // that does not get through them (a lost peer) is left inside MPI, detached.
  ~MpiCommThread() {
    bool drained;
    {
      std::unique_lock<std::mutex> lk(s_->mu);
      drained = !MpiRuntime::instance().poisoned() &&
                s_->done.wait_for(lk, drain_timeout_, [&] { return s_->queue.empty() && !s_->busy; });
      s_->stop = true;
    }
    s_->wake.notify_one();
    if (drained) {
      thread_.join();
    } else {
      MpiRuntime::instance().poison();
      thread_.detach();  // it owns s_ (shared) and leaves when its call returns, if ever
    }
  }

  void submit(std::shared_ptr<MpiPending> p, Job job) {
    {
      std::lock_guard<std::mutex> lk(s_->mu);
      s_->queue.emplace_back(std::move(p), std::move(job));
    }
    s_->wake.notify_one();
  }

  // Blocks until p completed or failed (true) or the deadline passed (false).
  bool wait_until(const MpiPending& p, std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lk(s_->mu);
    return s_->done.wait_until(lk, deadline,
                               [&] { return p.status.load(std::memory_order_acquire) != MpiPending::kPending; });
  }

 private:
  struct Shared {
    std::mutex mu;
    std::condition_variable wake;  // the thread: new work or stop
    std::condition_variable done;  // the waiters: a collective completed or failed
    std::deque<std::pair<std::shared_ptr<MpiPending>, Job>> queue;
    bool busy = false;
    bool stop = false;
  };

  static void run(Shared& s) {
    while (true) {
      std::pair<std::shared_ptr<MpiPending>, Job> item;
      {
        std::unique_lock<std::mutex> lk(s.mu);
        s.wake.wait(lk, [&] { return s.stop || !s.queue.empty(); });
        if (s.queue.empty()) return;  // stop, nothing left
        item = std::move(s.queue.front());
        s.queue.pop_front();
        s.busy = true;
      }
      auto& [p, job] = item;
      if (MpiRuntime::instance().poisoned()) {
        p->fail(::ember::detail::str_cat("MPI ", p->what, " on rank ", p->rank,
                                         " not run: an earlier collective failed or timed out, MPI is unusable"));
      } else if (const int rc = job(); rc == MPI_SUCCESS) {
        p->complete();
      } else {
        p->fail(rc);
      }
      {
        std::lock_guard<std::mutex> lk(s.mu);
        s.busy = false;
      }
      s.done.notify_all();
    }
  }

  std::shared_ptr<Shared> s_;
  std::chrono::milliseconds drain_timeout_;
  std::thread thread_;
};

}  // namespace ember::dist::detail
