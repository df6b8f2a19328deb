#pragma once
// dist::MpiProcessGroup: the ProcessGroup for CPU tensors over MPI (Open MPI moves the bytes and
// launches the ranks; `mpirun -np N prog` or `srun prog`).
//
//   auto pg = ember::dist::init_from_environment();      // MPI_Init_thread if needed
//   pg->all_reduce(grad, ember::dist::ReduceOp::Avg);    // every rank ends with the mean
//
// The machinery behind it lives in ember/dist/detail/: MPI's lifetime and locking
// (mpi_runtime.hpp), dtypes as MPI sees them (mpi_datatypes.hpp), one collective in flight
// (mpi_pending.hpp), the communication thread (mpi_comm_thread.hpp) and the Work handle with its
// deadline (mpi_work.hpp).
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
//   already sets it (Open MPI then yields the core while it busy-waits; see detail/mpi_runtime.hpp).
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

#include <climits>
#include <functional>
#include <vector>

#include "ember/core/tensor.hpp"
#include "ember/dist/detail/mpi_comm_thread.hpp"
#include "ember/dist/detail/mpi_datatypes.hpp"
#include "ember/dist/detail/mpi_runtime.hpp"
#include "ember/dist/detail/mpi_work.hpp"

namespace ember::dist {

inline constexpr bool kHaveMpi = true;
// The exit status of a job that a rank aborted after a collective timed out
// (MpiOptions::abort_on_timeout): EX_TEMPFAIL of <sysexits.h>, "try again later" (restart the job
// from its last checkpoint), distinct from a crash (134, 137) and from a plain failure (1).
inline constexpr int kTimeoutAbortStatus = 75;

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
      tmp = w->temp(n);
      detail::widen_16(dt, buf, tmp, n);
    }
    void* red = tmp ? static_cast<void*>(tmp) : buf;  // what MPI reduces
    finish_reduction(*w, op, dt, red, tmp, buf, n);
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
    int count = 0;
    auto w = whole_and_part_work("reduce_scatter", output, input, /*output_is_whole=*/false, what, count);
    if (!w) return std::make_shared<CompletedWork>();
    const int64_t n = output.numel();
    const DType dt = output.dtype();
    const void* in = input.data_ptr();
    void* out = output.data_ptr();
    float* tin = nullptr;
    float* tout = nullptr;
    if (detail::is_16bit_float(dt)) {
      tin = w->temp(input.numel());
      detail::widen_16(dt, in, tin, input.numel());
      tout = w->temp(n);
    }
    const void* src = tin ? static_cast<const void*>(tin) : in;
    void* dst = tout ? static_cast<void*>(tout) : out;  // what MPI reduces into
    finish_reduction(*w, op, dt, dst, tout, out, n);
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
    int count = 0;
    auto w = whole_and_part_work("all_gather", output, input, /*output_is_whole=*/true, what, count);
    if (!w) return std::make_shared<CompletedWork>();
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

  // The checks and the Work of a collective between a whole tensor and this rank's part of it
  // (reduce_scatter: the part is the output; all_gather: the input). A null Work when the part is
  // empty (nothing to move); else the Work, keeping both tensors, with `count` set to the part's
  // element count as MPI takes it (both counts checked).
  std::shared_ptr<MpiWork> whole_and_part_work(const char* op, const AnyTensor& output, const AnyTensor& input,
                                               bool output_is_whole, const std::string& what, int& count) const {
    check_tensor(output, op);
    check_tensor(input, op);
    detail::check_whole_and_part(::ember::detail::str_cat("MpiProcessGroup::", op), output, input, output_is_whole,
                                 size_);
    const AnyTensor& part = output_is_whole ? input : output;
    const AnyTensor& whole = output_is_whole ? output : input;
    if (part.numel() == 0) return nullptr;
    count = checked_count(part.numel(), what);
    checked_count(whole.numel(), what);
    auto w = make_work(what);
    w->keep(output);
    w->keep(input);
    return w;
  }

  // What a reduction does on completion: the average's division by the group size in `reduced`
  // (the n elements MPI reduced into), then, for a 16-bit float tensor, the narrowing of their
  // fp32 widening back into `out`.
  void finish_reduction(MpiWork& w, ReduceOp op, DType dt, void* reduced, float* widened, void* out,
                        int64_t n) const {
    const int sz = size_;
    w.on_complete([=] {
      if (op == ReduceOp::Avg) detail::divide_in_place(dt, reduced, n, sz);
      if (widened) detail::narrow_16(dt, widened, out, n);
    });
  }

  std::shared_ptr<MpiWork> make_work(std::string what) const {
    return std::make_shared<MpiWork>(std::move(what), rank_, options_.timeout, comm_thread_,
                                     options_.abort_on_timeout ? kTimeoutAbortStatus : 0);
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
