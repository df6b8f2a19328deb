#pragma once
// dist::MpiProcessGroup: the ProcessGroup for CPU tensors over MPI (DESIGN.md decision 9: Open MPI
// moves the bytes and launches the ranks; `mpirun -np N prog` or `srun prog`).
//
//   auto pg = ember::dist::init_from_environment();      // MPI_Init_thread if needed
//   pg->all_reduce(grad, ember::dist::ReduceOp::Avg);    // every rank ends with the mean
//
// Build: link the CMake target ember::mpi (ember::ember + MPI::MPI_CXX). mpi.h is not on the
// compiler's default include path, so this header is not part of ember/ember.hpp; included
// without MPI's include path it declares only `kHaveMpi = false` and an init_from_environment()
// that throws DistributedError (so it still compiles on its own, e.g. in the header tests).
//
// Behaviour:
// - The group works on a duplicate of MPI_COMM_WORLD (or of the communicator given) with
//   MPI_ERRORS_RETURN; an MPI error code becomes a DistributedError with MPI_Error_string's text.
// - When ember initialises MPI it sets OMPI_MCA_mpi_yield_when_idle=1 unless the environment
//   already sets it (Open MPI then yields the core while it busy-waits; see MpiRuntime).
// - Threads: MPI is initialised with MPI_THREAD_MULTIPLE when the library provides it; otherwise
//   with what it provides (at least MPI_THREAD_SERIALIZED is required) and the group then
//   serialises its own MPI calls with a mutex, so any thread may use it, one call at a time.
// - Collectives run on the group's communication thread (MpiOptions::comm_thread, the default
//   where MPI provides MPI_THREAD_MULTIPLE): the *_async calls queue a blocking MPI call
//   (MPI_Allreduce, MPI_Bcast, MPI_Reduce_scatter_block, MPI_Allgather, MPI_Barrier) that the thread
//   runs in order, so a collective advances while the caller computes (Open MPI advances a
//   non-blocking collective only while a thread is inside MPI). Without the thread the collectives
//   are the non-blocking MPI_I* calls, driven by MPI_Test in wait() and is_completed().
// - Work::wait() gives up when ProcessGroupOptions::timeout has passed since the wait began and
//   throws DistributedError naming the op, the tensor, the rank and the timeout. MPI cannot cancel
//   a collective: after a timeout the group (and MPI) is unusable; report and exit (the process
//   then skips MPI_Finalize, which would wait for the lost peer forever).
// - MpiOptions::abort_on_timeout (default on; EMBER_DIST_ABORT_ON_TIMEOUT=0 turns the default
//   off): instead of throwing the timeout's DistributedError, wait() prints it to stderr and calls
//   MPI_Abort(MPI_COMM_WORLD, kTimeoutAbortStatus), so the launcher tears the whole job down (a
//   rank that merely exits leaves mpirun waiting for a cut-off host). Off: the program catches
//   the DistributedError and must exit itself.
// - MPI_Finalize at exit only when no MpiProcessGroup is alive any more: a rank that calls
//   std::exit (or returns from main) while a group it made still exists leaves without
//   finalising, so Open MPI ends the job at once with its status. (MPI_Finalize there would wait
//   for the other ranks, which wait for it in a collective: the job would hang until the timeout.)
//   Destroy the groups before a normal end (a local in main is).
// - ReduceOp::Avg is a sum followed by a division by size() (integer dtypes: truncated toward 0).
// - float16/bfloat16 reductions run in float32: the group converts into a float32 temporary,
//   reduces that with MPI_FLOAT and converts back when the Work completes (one rounding, at the
//   end). Broadcast and all_gather move their raw 16-bit values (MPI_UINT16_T).
// - float32/float64/int32/int64/uint8 map to MPI_FLOAT/MPI_DOUBLE/MPI_INT32_T/MPI_INT64_T/
//   MPI_UINT8_T. One collective moves at most INT_MAX elements per rank (MPI's count is an int).
// - Tensors must be CPU tensors (DeviceError otherwise); ember tensors are contiguous.
// - A Work keeps its tensors alive until it completes. A Work dropped before it completed still
//   completes on the communication thread. Without the thread nobody drives it any more: its
//   buffers then stay alive until the process ends (MPI forbids freeing a pending request), so MPI
//   never writes into freed memory.
// - The tensors of an asynchronous collective must not be written until its Work completed (with
//   the communication thread MPI reads them when the thread reaches the collective, not at the call).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "ember/core/error.hpp"
#include "ember/dist/process_group.hpp"

#if __has_include(<mpi.h>)
#include <mpi.h>

#include <atomic>
#include <climits>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "ember/core/half.hpp"
#include "ember/core/tensor.hpp"

namespace ember::dist {

inline constexpr bool kHaveMpi = true;
// The exit status of a job that a rank aborted after a collective timed out
// (MpiOptions::abort_on_timeout): EX_TEMPFAIL of <sysexits.h>, "try again later" (restart the job
// from its last checkpoint), distinct from a crash (134, 137) and from a plain failure (1).
inline constexpr int kTimeoutAbortStatus = 75;

namespace detail {

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

// The MPI datatype that carries a dtype's values in a reduction (16-bit floats: float32 temporary).
inline MPI_Datatype mpi_reduce_type(DType t) {
  switch (t) {
    case DType::Float32: case DType::Float16: case DType::BFloat16: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Int32: return MPI_INT32_T;
    case DType::Int64: return MPI_INT64_T;
    case DType::UInt8: return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}
// The MPI datatype that moves a dtype's raw values (broadcast, all_gather).
inline MPI_Datatype mpi_raw_type(DType t) {
  if (t == DType::Float16 || t == DType::BFloat16) return MPI_UINT16_T;
  return mpi_reduce_type(t);
}
inline bool is_16bit_float(DType t) { return t == DType::Float16 || t == DType::BFloat16; }

inline MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

// 16-bit float values <-> float32 temporary.
inline void widen_16(DType t, const void* src, float* dst, int64_t n) {
  if (t == DType::Float16) {
    auto* s = static_cast<const half*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
  } else {
    auto* s = static_cast<const bfloat16*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
  }
}
inline void narrow_16(DType t, const float* src, void* dst, int64_t n) {
  if (t == DType::Float16) {
    auto* d = static_cast<half*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = half(src[i]);
  } else {
    auto* d = static_cast<bfloat16*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = bfloat16(src[i]);
  }
}

// Divides n values of a reduction buffer (in its MPI reduce type) by `by`.
inline void divide_in_place(DType t, void* p, int64_t n, int by) {
  auto div = [&](auto* x) {
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<std::remove_reference_t<decltype(x[i])>>(x[i] / by);
  };
  switch (t) {
    case DType::Float32: case DType::Float16: case DType::BFloat16: div(static_cast<float*>(p)); break;
    case DType::Float64: div(static_cast<double*>(p)); break;
    case DType::Int32: div(static_cast<int32_t*>(p)); break;
    case DType::Int64: div(static_cast<int64_t*>(p)); break;
    case DType::UInt8: div(static_cast<uint8_t*>(p)); break;
  }
}

// One collective in flight: the buffers MPI reads and writes (kept alive until it completes), what
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

}  // namespace detail

// A pending MPI collective. With the group's communication thread (the default where MPI provides
// MPI_THREAD_MULTIPLE) wait() sleeps until that thread has run it; without one, wait() drives the
// non-blocking request with MPI_Test. Either way it gives up when ProcessGroupOptions::timeout has
// passed since the wait began.
class MpiWork : public Work {
 public:
  MpiWork(std::string what, int rank, std::chrono::milliseconds timeout, std::shared_ptr<detail::MpiCommThread> comm,
          bool abort_on_timeout = false)
      : p_(std::make_shared<detail::MpiPending>()), timeout_(timeout), comm_(std::move(comm)),
        abort_on_timeout_(abort_on_timeout) {
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
    if (abort_on_timeout_) abort_job(message);
    throw DistributedError(message);
  }

  // ---- set-up by MpiProcessGroup, before start() ----
  void keep(const AnyTensor& t) { p_->keep.push_back(t); }
  std::vector<float>& temp() { return p_->temps.emplace_back(); }  // stable reference
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
  bool abort_on_timeout_ = false;
  bool started_ = false;

  // MpiOptions::abort_on_timeout: say why on stderr (the launcher shows it), then end the job.
  [[noreturn]] static void abort_job(const std::string& message) {
    std::fprintf(stderr,
                 "ember: DistributedError: %s\nember: aborting the MPI job with status %d "
                 "(MpiOptions::abort_on_timeout; EMBER_DIST_ABORT_ON_TIMEOUT=0 to handle the error instead)\n",
                 message.c_str(), kTimeoutAbortStatus);
    std::fflush(stderr);
    {
      detail::MpiLock lock;  // serialised MPI: no other call of ours runs at the same time
      MPI_Abort(MPI_COMM_WORLD, kTimeoutAbortStatus);
    }
    std::_Exit(kTimeoutAbortStatus);  // MPI_Abort does not return; should it, end this rank anyway
  }
};

struct MpiOptions : ProcessGroupOptions {
  // Run the group's collectives on a communication thread of its own (detail::MpiCommThread) so
  // that they advance while the caller computes. Used only where MPI provides
  // MPI_THREAD_MULTIPLE (the program may then call MPI from any thread); otherwise, or when
  // false, the collectives are non-blocking MPI calls that the waiting caller drives.
  bool comm_thread = true;
  // When a collective times out, print the DistributedError and MPI_Abort the whole job with
  // kTimeoutAbortStatus instead of throwing (see the header comment). Default on
  // (EMBER_DIST_ABORT_ON_TIMEOUT=0: off); set false in programs that catch the error themselves.
  bool abort_on_timeout = detail::default_abort_on_timeout();

  MpiOptions() = default;
  MpiOptions(const ProcessGroupOptions& base) : ProcessGroupOptions(base) {}  // NOLINT: widening is lossless
};

class MpiProcessGroup : public ProcessGroup {
 public:
  // A group over all processes of the job (a duplicate of MPI_COMM_WORLD).
  explicit MpiProcessGroup(MpiOptions options = {}) : MpiProcessGroup(MPI_COMM_WORLD, options) {}

  // A group over the processes of `comm` (duplicated: the caller keeps ownership of `comm`).
  MpiProcessGroup(MPI_Comm comm, MpiOptions options) : options_(options) {
    auto& rt = detail::MpiRuntime::instance();
    {
      detail::MpiLock lock;
      init(comm);
    }
    if (options_.comm_thread && !rt.serialized())
      comm_thread_ = std::make_shared<detail::MpiCommThread>(options_.timeout);
    rt.group_created();  // constructed: the destructor runs from here on
  }

  MpiProcessGroup(const MpiProcessGroup&) = delete;
  MpiProcessGroup& operator=(const MpiProcessGroup&) = delete;

  ~MpiProcessGroup() override {
    detail::MpiRuntime::instance().group_destroyed();
    comm_thread_.reset();  // runs what is queued (bounded by the timeout), then joins
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL && !detail::MpiRuntime::instance().poisoned()) {
      detail::MpiLock lock;
      MPI_Comm_free(&comm_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  std::string backend_name() const override { return "mpi"; }
  MPI_Comm comm() const { return comm_; }
  const MpiOptions& options() const { return options_; }
  // Whether the group's collectives run on its communication thread (MpiOptions::comm_thread).
  bool has_comm_thread() const { return comm_thread_ != nullptr; }
  // The thread level MPI provides (MPI_THREAD_MULTIPLE, or MPI_THREAD_SERIALIZED: calls serialised).
  int thread_level() const { return detail::MpiRuntime::instance().thread_level(); }
  std::shared_ptr<Work> all_reduce_async(AnyTensor& t, ReduceOp op = ReduceOp::Sum) override {
    const std::string what = ::ember::detail::str_cat("all_reduce(", reduce_op_name(op), ") of ", t.desc());
    check_tensor(t, "all_reduce");
    const int64_t n = t.numel();
    if (n == 0) return std::make_shared<CompletedWork>();
    const int count = checked_count(n, what);
    auto w = make_work(what);
    w->keep(t);
    const DType dt = t.dtype();
    void* buf = t.data_ptr();
    float* tmp = nullptr;
    if (detail::is_16bit_float(dt)) {
      auto& v = w->temp();
      v.resize(static_cast<size_t>(n));
      detail::widen_16(dt, buf, v.data(), n);
      tmp = v.data();
    }
    const int sz = size_;
    void* red = tmp ? static_cast<void*>(tmp) : buf;  // what MPI reduces
    w->on_complete([=] {
      if (op == ReduceOp::Avg) detail::divide_in_place(dt, red, n, sz);
      if (tmp) detail::narrow_16(dt, tmp, buf, n);
    });
    const MPI_Datatype type = detail::mpi_reduce_type(dt);
    const MPI_Op mop = detail::mpi_op(op);
    const MPI_Comm comm = comm_;
    check(w->start([=] { return MPI_Allreduce(MPI_IN_PLACE, red, count, type, mop, comm); },
                   [=](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, red, count, type, mop, comm, r); }),
          "MPI_Iallreduce", what);
    return w;
  }

  std::shared_ptr<Work> broadcast_async(AnyTensor& t, int root = 0) override {
    const std::string what = ::ember::detail::str_cat("broadcast(root ", root, ") of ", t.desc());
    check_tensor(t, "broadcast");
    EMBER_CHECK(root >= 0 && root < size_, ValueError, "MpiProcessGroup::broadcast: root ", root,
                " is not a rank of this group of ", size_);
    const int64_t n = t.numel();
    if (n == 0) return std::make_shared<CompletedWork>();
    const int count = checked_count(n, what);
    auto w = make_work(what);
    w->keep(t);
    void* buf = t.data_ptr();
    const MPI_Datatype type = detail::mpi_raw_type(t.dtype());
    const MPI_Comm comm = comm_;
    check(w->start([=] { return MPI_Bcast(buf, count, type, root, comm); },
                   [=](MPI_Request* r) { return MPI_Ibcast(buf, count, type, root, comm, r); }),
          "MPI_Ibcast", what);
    return w;
  }

  std::shared_ptr<Work> reduce_scatter_async(AnyTensor& output, const AnyTensor& input,
                                             ReduceOp op = ReduceOp::Sum) override {
    const std::string what = ::ember::detail::str_cat("reduce_scatter(", reduce_op_name(op), ") of ", input.desc(),
                                             " into ", output.desc());
    check_tensor(output, "reduce_scatter");
    check_tensor(input, "reduce_scatter");
    EMBER_CHECK(output.dtype() == input.dtype(), DTypeError, "MpiProcessGroup::reduce_scatter: output ",
                output.desc(), " and input ", input.desc(), " differ in dtype");
    EMBER_CHECK(input.numel() == output.numel() * size_, ShapeError, "MpiProcessGroup::reduce_scatter: input ",
                input.desc(), " must have size() * output.numel() = ", size_, " * ", output.numel(),
                " elements (output ", output.desc(), ")");
    const int64_t n = output.numel();
    if (n == 0) return std::make_shared<CompletedWork>();
    const int count = checked_count(n, what);
    checked_count(input.numel(), what);
    auto w = make_work(what);
    w->keep(output);
    w->keep(input);
    const DType dt = output.dtype();
    const void* in = input.data_ptr();
    void* out = output.data_ptr();
    float* tin = nullptr;
    float* tout = nullptr;
    if (detail::is_16bit_float(dt)) {
      auto& vi = w->temp();
      vi.resize(static_cast<size_t>(input.numel()));
      detail::widen_16(dt, in, vi.data(), input.numel());
      auto& vo = w->temp();
      vo.resize(static_cast<size_t>(n));
      tin = vi.data();
      tout = vo.data();
    }
    const int sz = size_;
    const void* src = tin ? static_cast<const void*>(tin) : in;
    void* dst = tout ? static_cast<void*>(tout) : out;  // what MPI reduces into
    w->on_complete([=] {
      if (op == ReduceOp::Avg) detail::divide_in_place(dt, dst, n, sz);
      if (tout) detail::narrow_16(dt, tout, out, n);
    });
    const MPI_Datatype type = detail::mpi_reduce_type(dt);
    const MPI_Op mop = detail::mpi_op(op);
    const MPI_Comm comm = comm_;
    check(w->start([=] { return MPI_Reduce_scatter_block(src, dst, count, type, mop, comm); },
                   [=](MPI_Request* r) { return MPI_Ireduce_scatter_block(src, dst, count, type, mop, comm, r); }),
          "MPI_Ireduce_scatter_block", what);
    return w;
  }

  std::shared_ptr<Work> all_gather_async(AnyTensor& output, const AnyTensor& input) override {
    const std::string what = ::ember::detail::str_cat("all_gather of ", input.desc(), " into ", output.desc());
    check_tensor(output, "all_gather");
    check_tensor(input, "all_gather");
    EMBER_CHECK(output.dtype() == input.dtype(), DTypeError, "MpiProcessGroup::all_gather: output ",
                output.desc(), " and input ", input.desc(), " differ in dtype");
    EMBER_CHECK(output.numel() == input.numel() * size_, ShapeError, "MpiProcessGroup::all_gather: output ",
                output.desc(), " must have size() * input.numel() = ", size_, " * ", input.numel(),
                " elements (input ", input.desc(), ")");
    const int64_t n = input.numel();
    if (n == 0) return std::make_shared<CompletedWork>();
    const int count = checked_count(n, what);
    checked_count(output.numel(), what);
    auto w = make_work(what);
    w->keep(output);
    w->keep(input);
    const MPI_Datatype type = detail::mpi_raw_type(input.dtype());
    const void* src = input.data_ptr();
    void* dst = output.data_ptr();
    const MPI_Comm comm = comm_;
    check(w->start([=] { return MPI_Allgather(src, count, type, dst, count, type, comm); },
                   [=](MPI_Request* r) { return MPI_Iallgather(src, count, type, dst, count, type, comm, r); }),
          "MPI_Iallgather", what);
    return w;
  }

  std::shared_ptr<Work> barrier_async() {
    auto w = make_work("barrier");
    const MPI_Comm comm = comm_;
    check(w->start([=] { return MPI_Barrier(comm); }, [=](MPI_Request* r) { return MPI_Ibarrier(comm, r); }),
          "MPI_Ibarrier", "barrier");
    return w;
  }
  void barrier() override { barrier_async()->wait(); }

 private:
  // Duplicates comm and reads rank, size and local rank (with MPI's lock held).
  void init(MPI_Comm comm) {
    check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    // Local rank (GPU selection, one process per device): the launcher's variable when it sets
    // one, else the rank among the processes that share this node's memory.
    MPI_Comm node = MPI_COMM_NULL;
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    check(MPI_Comm_rank(node, &local_rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(node, &local_size_), "MPI_Comm_size");
    MPI_Comm_free(&node);
    bool world = false;
    int cmp = MPI_UNEQUAL;
    if (MPI_Comm_compare(comm, MPI_COMM_WORLD, &cmp) == MPI_SUCCESS) world = (cmp == MPI_IDENT || cmp == MPI_CONGRUENT);
    if (world) {
      for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
        if (const char* v = std::getenv(var); v && *v) {
          local_rank_ = std::atoi(v);
          break;
        }
      }
    }
  }

  void check(int rc, const char* call, const std::string& what = "") const {
    if (rc == MPI_SUCCESS) return;
    detail::MpiRuntime::instance().poison();
    throw DistributedError(::ember::detail::str_cat(call, what.empty() ? "" : " (", what, what.empty() ? "" : ")",
                                           " failed on rank ", rank_, ": ", detail::mpi_error_string(rc)));
  }
  static void check_tensor(const AnyTensor& t, const char* op) {
    EMBER_CHECK(t.defined(), ValueError, "MpiProcessGroup::", op, ": undefined tensor");
    EMBER_CHECK(t.device().is_cpu(), DeviceError, "MpiProcessGroup::", op, ": ", t.desc(),
                " is not a CPU tensor (the MPI backend moves host memory; use NCCL for CUDA tensors)");
  }
  static int checked_count(int64_t n, const std::string& what) {
    EMBER_CHECK(n <= INT_MAX, ValueError, "MpiProcessGroup: ", what, " has ", n,
                " elements; one MPI collective moves at most INT_MAX elements per rank");
    return static_cast<int>(n);
  }

  std::shared_ptr<MpiWork> make_work(std::string what) const {
    return std::make_shared<MpiWork>(std::move(what), rank_, options_.timeout, comm_thread_,
                                     options_.abort_on_timeout);
  }

  MpiOptions options_;
  std::shared_ptr<detail::MpiCommThread> comm_thread_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
};

// The group of all processes launched together (mpirun, srun), initialising MPI when needed.
inline std::shared_ptr<MpiProcessGroup> init_from_environment(const MpiOptions& options = {}) {
  return std::make_shared<MpiProcessGroup>(options);
}
inline std::shared_ptr<MpiProcessGroup> init_from_environment(const ProcessGroupOptions& options) {
  return std::make_shared<MpiProcessGroup>(MpiOptions(options));
}

}  // namespace ember::dist

#else  // no mpi.h on the include path

namespace ember::dist {

inline constexpr bool kHaveMpi = false;

// Without MPI: a clear error at run time (link ember::mpi to get MpiProcessGroup).
inline std::shared_ptr<ProcessGroup> init_from_environment(ProcessGroupOptions = {}) {
  throw DistributedError(
      "dist::init_from_environment: compiled without MPI (mpi.h not found); link the CMake target "
      "ember::mpi (Open MPI: apt-get install libopenmpi-dev openmpi-bin)");
}

}  // namespace ember::dist

#endif
