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
// - Threads: MPI is initialised with MPI_THREAD_MULTIPLE when the library provides it; otherwise
//   with what it provides (at least MPI_THREAD_SERIALIZED is required) and the group then
//   serialises its own MPI calls with a mutex, so any thread may use it, one call at a time.
// - Every collective is non-blocking (MPI_Iallreduce, MPI_Ibcast, MPI_Ireduce_scatter_block,
//   MPI_Iallgather, MPI_Ibarrier). Work::wait() polls MPI_Test (which also drives MPI's progress)
//   until the operation completes or ProcessGroupOptions::timeout passes; then it throws
//   DistributedError naming the op, the tensor, the rank and the timeout. MPI cannot cancel a
//   collective: after a timeout the group (and MPI) is unusable; report and exit (the process then
//   skips MPI_Finalize, which would wait for the lost peer forever).
// - ReduceOp::Avg is a sum followed by a division by size() (integer dtypes: truncated toward 0).
// - float16/bfloat16 reductions run in float32: the group converts into a float32 temporary,
//   reduces that with MPI_FLOAT and converts back when the Work completes (one rounding, at the
//   end). Broadcast and all_gather move their raw 16-bit values (MPI_UINT16_T).
// - float32/float64/int32/int64/uint8 map to MPI_FLOAT/MPI_DOUBLE/MPI_INT32_T/MPI_INT64_T/
//   MPI_UINT8_T. One collective moves at most INT_MAX elements per rank (MPI's count is an int).
// - Tensors must be CPU tensors (DeviceError otherwise); ember tensors are contiguous.
// - A Work keeps its tensors alive until it completes. Destroying a Work whose collective is
//   still pending keeps its buffers alive until the process ends (MPI forbids freeing such a
//   request), so MPI never writes into freed memory.
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>

#include "ember/core/error.hpp"
#include "ember/dist/process_group.hpp"

#if __has_include(<mpi.h>)
#include <mpi.h>

#include <atomic>
#include <climits>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "ember/core/half.hpp"
#include "ember/core/tensor.hpp"

namespace ember::dist {

inline constexpr bool kHaveMpi = true;

namespace detail {

// MPI's lifetime in this process: initialised on first use (unless the program did it), finalised
// at exit when ember initialised it and no collective was lost to a failure.
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

  ~MpiRuntime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (we_initialised_ && !finalized && !poisoned_.load()) MPI_Finalize();
  }

 private:
  MpiRuntime() {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised) {
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
  std::mutex mu_;
};

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

}  // namespace detail

// A pending MPI collective: wait() polls MPI_Test until it completes or the deadline passes.
class MpiWork : public Work {
 public:
  MpiWork(std::string what, int rank, std::chrono::milliseconds timeout)
      : what_(std::move(what)), rank_(rank), timeout_(timeout) {}
  MpiWork(const MpiWork&) = delete;
  MpiWork& operator=(const MpiWork&) = delete;

  ~MpiWork() override {
    if (!done_ && started_) {
      // MPI forbids freeing a pending collective's request: keep its buffers alive for good.
      detail::MpiRuntime::instance().poison();
      new std::vector<AnyTensor>(std::move(keep_));
      new std::deque<std::vector<float>>(std::move(temps_));
    }
  }

  bool is_completed() override {
    if (done_) return true;
    test_once();
    return done_;
  }

  void wait() override {
    if (done_) return;
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout_;
    const auto spin_until = start + std::chrono::milliseconds(200);
    while (true) {
      test_once();
      if (done_) return;
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        detail::MpiRuntime::instance().poison();
        throw DistributedError(::ember::detail::str_cat(
            "MPI ", what_, ": rank ", rank_, " timed out after ", timeout_.count(),
            " ms waiting for the other ranks (ProcessGroupOptions::timeout); a peer failed, exited or "
            "skipped this collective. The process group is unusable now."));
      }
      // Poll hard at first (MPI progresses inside MPI_Test), then back off to spare the CPU.
      if (now < spin_until) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
  }

  // ---- set-up by MpiProcessGroup ----
  MPI_Request* request() { return &req_; }
  void mark_started() { started_ = true; }
  void keep(const AnyTensor& t) { keep_.push_back(t); }
  std::vector<float>& temp() { return temps_.emplace_back(); }  // stable reference
  void on_complete(std::function<void()> f) { finish_ = std::move(f); }
  const std::string& what() const { return what_; }

 private:
  void test_once() {
    int flag = 0;
    int rc;
    {
      detail::MpiLock lock;
      rc = MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
    }
    if (rc != MPI_SUCCESS) {
      detail::MpiRuntime::instance().poison();
      done_ = true;  // the request is no longer usable; do not test it again
      keep_.clear();
      throw DistributedError(::ember::detail::str_cat("MPI ", what_, " on rank ", rank_,
                                             " failed: ", detail::mpi_error_string(rc)));
    }
    if (flag) {
      done_ = true;
      if (finish_) finish_();
      finish_ = nullptr;
      keep_.clear();
      temps_.clear();
    }
  }

  std::string what_;
  int rank_;
  std::chrono::milliseconds timeout_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  bool started_ = false;
  bool done_ = false;
  std::vector<AnyTensor> keep_;
  std::deque<std::vector<float>> temps_;  // a deque: references stay valid as it grows
  std::function<void()> finish_;
};

class MpiProcessGroup : public ProcessGroup {
 public:
  // A group over all processes of the job (a duplicate of MPI_COMM_WORLD).
  explicit MpiProcessGroup(ProcessGroupOptions options = {}) : MpiProcessGroup(MPI_COMM_WORLD, options) {}

  // A group over the processes of `comm` (duplicated: the caller keeps ownership of `comm`).
  MpiProcessGroup(MPI_Comm comm, ProcessGroupOptions options) : options_(options) {
    auto& rt = detail::MpiRuntime::instance();
    (void)rt;
    detail::MpiLock lock;
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

  MpiProcessGroup(const MpiProcessGroup&) = delete;
  MpiProcessGroup& operator=(const MpiProcessGroup&) = delete;

  ~MpiProcessGroup() override {
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
  const ProcessGroupOptions& options() const { return options_; }
  // The thread level MPI provides (MPI_THREAD_MULTIPLE, or MPI_THREAD_SERIALIZED: calls serialised).
  int thread_level() const { return detail::MpiRuntime::instance().thread_level(); }

  std::shared_ptr<Work> all_reduce_async(AnyTensor& t, ReduceOp op = ReduceOp::Sum) override {
    const std::string what = ::ember::detail::str_cat("all_reduce(", reduce_op_name(op), ") of ", t.desc());
    check_tensor(t, "all_reduce");
    const int64_t n = t.numel();
    if (n == 0) return std::make_shared<CompletedWork>();
    const int count = checked_count(n, what);
    auto w = std::make_shared<MpiWork>(what, rank_, options_.timeout);
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
    w->on_complete([=] {
      void* red = tmp ? static_cast<void*>(tmp) : buf;
      if (op == ReduceOp::Avg) detail::divide_in_place(dt, red, n, sz);
      if (tmp) detail::narrow_16(dt, tmp, buf, n);
    });
    {
      detail::MpiLock lock;
      check(MPI_Iallreduce(MPI_IN_PLACE, tmp ? static_cast<void*>(tmp) : buf, count, detail::mpi_reduce_type(dt),
                           detail::mpi_op(op), comm_, w->request()),
            "MPI_Iallreduce", what);
    }
    w->mark_started();
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
    auto w = std::make_shared<MpiWork>(what, rank_, options_.timeout);
    w->keep(t);
    {
      detail::MpiLock lock;
      check(MPI_Ibcast(t.data_ptr(), count, detail::mpi_raw_type(t.dtype()), root, comm_, w->request()),
            "MPI_Ibcast", what);
    }
    w->mark_started();
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
    auto w = std::make_shared<MpiWork>(what, rank_, options_.timeout);
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
    w->on_complete([=] {
      void* red = tout ? static_cast<void*>(tout) : out;
      if (op == ReduceOp::Avg) detail::divide_in_place(dt, red, n, sz);
      if (tout) detail::narrow_16(dt, tout, out, n);
    });
    {
      detail::MpiLock lock;
      check(MPI_Ireduce_scatter_block(tin ? static_cast<const void*>(tin) : in, tout ? static_cast<void*>(tout) : out,
                                      count, detail::mpi_reduce_type(dt), detail::mpi_op(op), comm_, w->request()),
            "MPI_Ireduce_scatter_block", what);
    }
    w->mark_started();
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
    auto w = std::make_shared<MpiWork>(what, rank_, options_.timeout);
    w->keep(output);
    w->keep(input);
    const MPI_Datatype type = detail::mpi_raw_type(input.dtype());
    {
      detail::MpiLock lock;
      check(MPI_Iallgather(input.data_ptr(), count, type, output.data_ptr(), count, type, comm_, w->request()),
            "MPI_Iallgather", what);
    }
    w->mark_started();
    return w;
  }

  std::shared_ptr<Work> barrier_async() {
    auto w = std::make_shared<MpiWork>("barrier", rank_, options_.timeout);
    {
      detail::MpiLock lock;
      check(MPI_Ibarrier(comm_, w->request()), "MPI_Ibarrier", "barrier");
    }
    w->mark_started();
    return w;
  }
  void barrier() override { barrier_async()->wait(); }

 private:
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

  ProcessGroupOptions options_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
};

// The group of all processes launched together (mpirun, srun), initialising MPI when needed.
inline std::shared_ptr<MpiProcessGroup> init_from_environment(ProcessGroupOptions options = {}) {
  return std::make_shared<MpiProcessGroup>(options);
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
