#pragma once
// dist::NcclProcessGroup: the ProcessGroup of CUDA tensors, over NCCL.
// Host code only: any C++20 compiler with the CUDA toolkit's include path (cuda_runtime.h, nccl.h)
// compiles it; link CUDA::cudart and NCCL (ember::cuda_deps does both).
//
// Without the CUDA headers this header is empty, so that a CPU-only build (and the CPU header test,
// which compiles every header under ember/dist without CUDA include paths) keeps working; define
// EMBER_REQUIRE_NCCL to turn that case into a compile error instead.
//
// Streams and completion. ember does all of its work on one stream per device
// (cuda::current_stream). Each group owns a dedicated NCCL stream. A collective
//   1. records an event on ember's stream and makes the NCCL stream wait on it (the collective sees
//      every result ember queued before it: no host sync),
//   2. enqueues the NCCL call on the NCCL stream,
//   3. records a "done" event on the NCCL stream, held by the returned NcclWork.
// NcclWork::wait() makes ember's stream wait on "done": completion means "ordered before any later
// work on ember's stream for that device", not that the host has seen the result (reading a tensor
// back to the host synchronises ember's stream, so it sees the result). NcclWork::synchronize()
// blocks the host until the collective has finished.
//
// Failures never hang silently. Host waits (synchronize(), barrier(), wait() with
// NcclOptions::blocking_wait) poll ncclCommGetAsyncError and cudaEventQuery until the deadline
// (ProcessGroupOptions::timeout after the collective was issued); on an asynchronous NCCL error or a
// timeout they abort the communicator (ncclCommAbort) and throw ember::DistributedError. Every new
// collective and every wait() also checks the group's outstanding collectives against their
// deadlines, so a collective that never finishes is reported at the next call into the group. After
// an abort every call into the group throws DistributedError. With the default stream-ordered
// wait(), a hang between two calls into the group shows up only at the next host synchronisation of
// ember's stream: use blocking_wait (or synchronize()) where a deadline must hold there too.
//
// Construction:
//   (a) one process per GPU: every rank builds the group from the same ncclUniqueId. Rank 0 makes
//       it (nccl_unique_id()) and sends it to the others; NcclProcessGroup::create(cpu_group, device)
//       does this over any ProcessGroup-like CPU group (MpiProcessGroup), broadcasting the 128 bytes
//       as a uint8 CPU tensor, so this header needs no mpi.h. The communicator is created
//       non-blocking, so that its initialisation too is bounded by the timeout.
//   (b) one process driving all GPUs of a server: NcclProcessGroup::create_all(devices)
//       (ncclCommInitAll) returns one group per device. In this mode ONE thread issues the
//       collectives of all devices, inside a dist::NcclGroup scope (ncclGroupStart/ncclGroupEnd):
//         { dist::NcclGroup g; for (auto& pg : groups) works.push_back(pg->all_reduce_async(t[i])); }
//         for (auto& w : works) w->wait();
//       NCCL may block inside a collective call until its peers join, so issuing device after
//       device outside a group could deadlock; a collective of such a group of size > 1 issued
//       outside an NcclGroup throws DistributedError. Work handles of collectives issued inside the
//       scope are waitable after it ends (the "done" events are recorded at ncclGroupEnd); wait()
//       inside the scope throws. Blocking calls that wait on the host (barrier(), and wait() with
//       blocking_wait) cannot be used inside the scope, so such a set of size > 1 has no barrier():
//       issue the collectives in a scope, then NcclWork::synchronize() each of them.
// One group is driven by one thread at a time (collectives must be issued in the same order on
// every rank anyway).
//
// The machinery behind the group lives in ember/dist/detail/: the communicator's state, deadline
// checks, error polling and abort (nccl_comm_state.hpp), and one issued collective with the
// NcclGroup scope's bookkeeping (nccl_work_state.hpp).
#if __has_include(<nccl.h>) && __has_include(<cuda_runtime.h>)

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ember/backend/cuda/nccl.hpp"
#include "ember/backend/cuda/runtime.hpp"
#include "ember/core/error.hpp"
#include "ember/core/tensor.hpp"
#include "ember/dist/detail/nccl_comm_state.hpp"
#include "ember/dist/detail/nccl_work_state.hpp"
#include "ember/dist/process_group.hpp"

namespace ember::dist {

struct NcclOptions : ProcessGroupOptions {
  // wait() also blocks the host until the collective finished (as synchronize()), under the
  // deadline. Off by default: wait() only orders ember's stream after the collective.
  bool blocking_wait = false;
};

// A fresh NCCL unique id (rank 0 makes it; every rank must use the same one).
inline ncclUniqueId nccl_unique_id() {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  EMBER_NCCL_CHECK(ncclGetUniqueId(&id));
  return id;
}

// Sends root's unique id to every rank of a CPU group: any type with rank() and
// broadcast(AnyTensor&, int root) over CPU tensors (MpiProcessGroup). Root makes the id.
template <class CpuGroup>
ncclUniqueId broadcast_nccl_unique_id(CpuGroup& cpu_group, int root = 0) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (cpu_group.rank() == root) id = nccl_unique_id();
  static_assert(sizeof(id.internal) == NCCL_UNIQUE_ID_BYTES);
  AnyTensor bytes = AnyTensor::zeros(Shape{static_cast<int64_t>(NCCL_UNIQUE_ID_BYTES)}, DType::UInt8, Device::cpu());
  std::memcpy(bytes.data_ptr(), id.internal, NCCL_UNIQUE_ID_BYTES);
  cpu_group.broadcast(bytes, root);
  std::memcpy(id.internal, bytes.data_ptr(), NCCL_UNIQUE_ID_BYTES);
  return id;
}

inline ncclRedOp_t nccl_reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  throw ValueError(::ember::detail::str_cat("nccl_reduce_op: unknown reduce op ", static_cast<int>(op)));
}

// ncclGroupStart() for the current thread; end() (or the destructor) calls ncclGroupEnd() and
// records the "done" events of the collectives issued inside. Scopes nest.
class NcclGroup {
 public:
  NcclGroup() {
    EMBER_NCCL_CHECK(ncclGroupStart());
    ++detail::nccl_group_scope().depth;
    open_ = true;
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  ~NcclGroup() {
    if (!open_) return;
    try {
      end();
    } catch (...) {
      // A destructor must not throw; the failure shows up at the next call into the groups.
    }
  }

  void end() {
    if (!open_) return;
    open_ = false;
    auto& scope = detail::nccl_group_scope();
    --scope.depth;
    std::vector<std::shared_ptr<detail::NcclWorkState>> works;
    if (scope.depth == 0) works.swap(scope.pending);
    const ncclResult_t r = ncclGroupEnd();
    EMBER_NCCL_CHECK(r);
    if (scope.depth != 0) return;
    for (auto& w : works) {
      detail::record_done(*w, "ncclGroupEnd");
      if (w->abandoned) {  // its NcclWork is gone: order ember's stream after it, as ~NcclWork does
        const int device = w->comm->device;
        cuda::DeviceGuard guard(device);
        EMBER_CUDA_CHECK(cudaStreamWaitEvent(cuda::current_stream(device), w->done->ev, 0));
        w->keep.clear();
      }
    }
  }

 private:
  bool open_ = false;
};

// The handle of one NCCL collective.
class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<detail::NcclWorkState> state, bool blocking_wait)
      : s_(std::move(state)), blocking_wait_(blocking_wait) {}
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;

  // Dropping an unwaited handle still orders ember's stream after the collective before its
  // tensors can be freed (their memory is reused in ember's stream order).
  ~NcclWork() override {
    if (!s_ || waited_) return;
    if (!s_->recorded) {
      s_->abandoned = true;
      return;
    }
    try {
      cuda::DeviceGuard guard(s_->comm->device);
      (void)cudaStreamWaitEvent(cuda::current_stream(s_->comm->device), s_->done->ev, 0);
    } catch (...) {
    }
    s_->keep.clear();
  }

  bool is_completed() override {
    require_recorded("is_completed");
    s_->comm->poll_async_error(s_->what.c_str());
    return s_->comm->event_done(s_->done->ev);
  }

  // Orders ember's stream after the collective (no host sync); with NcclOptions::blocking_wait
  // also blocks the host as synchronize() does.
  void wait() override {
    require_recorded("wait");
    if (blocking_wait_) {
      synchronize();
      return;
    }
    s_->comm->sweep(s_->what.c_str());
    order_ember_stream();
  }

  // Blocks the host until the collective finished, at most until its deadline (issue time +
  // ProcessGroupOptions::timeout); then aborts the communicator and throws DistributedError.
  void synchronize() {
    require_recorded("synchronize");
    s_->comm->host_wait(s_->done->ev, s_->start + s_->comm->options.timeout, s_->what, s_->comm->options.timeout);
    order_ember_stream();
  }
  // The same with a deadline of now + timeout.
  void synchronize(std::chrono::milliseconds timeout) {
    require_recorded("synchronize");
    s_->comm->host_wait(s_->done->ev, detail::Clock::now() + timeout, s_->what, timeout);
    order_ember_stream();
  }

  // The "done" event on the NCCL stream (for cudaStreamWaitEvent on another stream).
  cudaEvent_t event() const { return s_->done->ev; }

 private:
  void require_recorded(const char* what) const {
    if (!s_->recorded) {
      throw DistributedError(::ember::detail::str_cat("NcclWork::", what, " (", s_->what,
                                                      "): the collective was issued inside a dist::NcclGroup scope "
                                                      "that has not ended yet"));
    }
  }
  void order_ember_stream() {
    cuda::DeviceGuard guard(s_->comm->device);
    EMBER_CUDA_CHECK(cudaStreamWaitEvent(cuda::current_stream(s_->comm->device), s_->done->ev, 0));
    waited_ = true;
    s_->keep.clear();
  }

  std::shared_ptr<detail::NcclWorkState> s_;
  bool blocking_wait_ = false;
  bool waited_ = false;
};

class NcclProcessGroup : public ProcessGroup {
 public:
  // (a) One rank of `size`, on `device`, from the unique id every rank shares. Blocks (at most
  // options.timeout) until all ranks have joined.
  NcclProcessGroup(const ncclUniqueId& id, int rank, int size, int device, NcclOptions options = {})
      : options_(options) {
    EMBER_CHECK(size >= 1 && rank >= 0 && rank < size, ValueError, "NcclProcessGroup: rank ", rank,
                " is not in [0, ", size, ")");
    cuda::internal::check_device_index(device, "NcclProcessGroup");
    auto st = std::make_shared<detail::NcclCommState>();
    st->open(rank, size, device, options);
    cuda::DeviceGuard guard(device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    st->nonblocking = true;
    const auto deadline = detail::Clock::now() + options.timeout;
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress && comm != nullptr) (void)ncclCommAbort(comm);  // do not leak it
    EMBER_NCCL_CHECK(r);
    st->comm = comm;
    st->wait_ready(deadline, "ncclCommInitRankConfig (waiting for all ranks to join)");
    state_ = std::move(st);
  }

  // (a) over a CPU group (MpiProcessGroup or any type with rank(), size() and a CPU broadcast):
  // rank 0 makes the unique id and broadcasts it; this rank's communicator lives on `device`.
  template <class CpuGroup>
  static std::unique_ptr<NcclProcessGroup> create(CpuGroup& cpu_group, int device, NcclOptions options = {}) {
    const ncclUniqueId id = broadcast_nccl_unique_id(cpu_group, 0);
    return std::make_unique<NcclProcessGroup>(id, cpu_group.rank(), cpu_group.size(), device, options);
  }

  // (b) One process drives the GPUs `devices` (ncclCommInitAll): group i is rank i on devices[i].
  // Collectives of a set of size > 1 must be issued from one thread inside a dist::NcclGroup scope.
  static std::vector<std::unique_ptr<NcclProcessGroup>> create_all(const std::vector<int>& devices,
                                                                   NcclOptions options = {}) {
    EMBER_CHECK(!devices.empty(), ValueError, "NcclProcessGroup::create_all: no devices");
    for (size_t i = 0; i < devices.size(); ++i) {
      cuda::internal::check_device_index(devices[i], "NcclProcessGroup::create_all");
      for (size_t j = 0; j < i; ++j) {
        EMBER_CHECK(devices[i] != devices[j], ValueError, "NcclProcessGroup::create_all: device cuda:", devices[i],
                    " appears twice");
      }
    }
    const int n = static_cast<int>(devices.size());
    detail::grant_pool_access(devices);
    std::vector<ncclComm_t> comms(devices.size(), nullptr);
    EMBER_NCCL_CHECK(ncclCommInitAll(comms.data(), n, devices.data()));
    auto clique = std::make_shared<std::vector<std::weak_ptr<detail::NcclCommState>>>();
    std::vector<std::unique_ptr<NcclProcessGroup>> groups;
    std::vector<std::shared_ptr<detail::NcclCommState>> states;
    try {
      for (int i = 0; i < n; ++i) {
        auto st = std::make_shared<detail::NcclCommState>();
        st->comm = comms[static_cast<size_t>(i)];
        comms[static_cast<size_t>(i)] = nullptr;
        st->clique = clique;
        states.push_back(st);
        st->open(i, n, devices[static_cast<size_t>(i)], options);
        clique->push_back(st);
      }
    } catch (...) {
      // The states made so far release their communicators; NCCL frees a set's resources only
      // once every member is gone, so abort the ones not handed to a state yet.
      for (ncclComm_t c : comms)
        if (c != nullptr) (void)ncclCommAbort(c);
      throw;
    }
    for (int i = 0; i < n; ++i) {
      groups.push_back(std::unique_ptr<NcclProcessGroup>(new NcclProcessGroup(std::move(states[static_cast<size_t>(i)]), options, true)));
    }
    return groups;
  }

  NcclProcessGroup(const NcclProcessGroup&) = delete;
  NcclProcessGroup& operator=(const NcclProcessGroup&) = delete;

  int rank() const override { return state_->rank; }
  int size() const override { return state_->size; }
  // The group's GPU (its collectives take tensors there only).
  Device device() const override { return Device::cuda(state_->device); }
  std::string backend_name() const override { return "nccl"; }
  const NcclOptions& options() const { return options_; }
  ncclComm_t nccl_comm() const { return state_->comm; }
  cudaStream_t nccl_stream() const { return state_->stream; }
  bool aborted() {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->aborted;
  }

  std::shared_ptr<Work> all_reduce_async(AnyTensor& t, ReduceOp op = ReduceOp::Sum) override {
    check_tensor(t, "all_reduce");
    const ncclDataType_t dt = cuda::nccl_dtype(t.dtype());
    const ncclRedOp_t rop = nccl_reduce_op(op);
    void* p = t.data_ptr();
    const size_t n = static_cast<size_t>(t.numel());
    return launch(::ember::detail::str_cat("all_reduce(", reduce_op_name(op), ", ", t.desc(), ")"), {t},
                  [&](ncclComm_t c, cudaStream_t s) { return ncclAllReduce(p, p, n, dt, rop, c, s); }, n == 0);
  }

  std::shared_ptr<Work> broadcast_async(AnyTensor& t, int root = 0) override {
    check_tensor(t, "broadcast");
    EMBER_CHECK(root >= 0 && root < size(), ValueError, "NcclProcessGroup::broadcast: root ", root,
                " is not in [0, ", size(), ")");
    const ncclDataType_t dt = cuda::nccl_dtype(t.dtype());
    void* p = t.data_ptr();
    const size_t n = static_cast<size_t>(t.numel());
    return launch(::ember::detail::str_cat("broadcast(root ", root, ", ", t.desc(), ")"), {t},
                  [&](ncclComm_t c, cudaStream_t s) { return ncclBroadcast(p, p, n, dt, root, c, s); }, n == 0);
  }

  std::shared_ptr<Work> reduce_scatter_async(AnyTensor& output, const AnyTensor& input,
                                             ReduceOp op = ReduceOp::Sum) override {
    check_tensor(output, "reduce_scatter (output)");
    check_tensor(input, "reduce_scatter (input)");
    detail::check_whole_and_part("NcclProcessGroup::reduce_scatter", output, input, /*output_is_whole=*/false, size());
    const ncclDataType_t dt = cuda::nccl_dtype(output.dtype());
    const ncclRedOp_t rop = nccl_reduce_op(op);
    const void* in = input.data_ptr();
    void* out = output.data_ptr();
    const size_t n = static_cast<size_t>(output.numel());
    return launch(::ember::detail::str_cat("reduce_scatter(", reduce_op_name(op), ", ", input.desc(), " -> ", output.desc(), ")"),
                  {output, input},
                  [&](ncclComm_t c, cudaStream_t s) { return ncclReduceScatter(in, out, n, dt, rop, c, s); }, n == 0);
  }

  std::shared_ptr<Work> all_gather_async(AnyTensor& output, const AnyTensor& input) override {
    check_tensor(output, "all_gather (output)");
    check_tensor(input, "all_gather (input)");
    detail::check_whole_and_part("NcclProcessGroup::all_gather", output, input, /*output_is_whole=*/true, size());
    const ncclDataType_t dt = cuda::nccl_dtype(input.dtype());
    const void* in = input.data_ptr();
    void* out = output.data_ptr();
    const size_t n = static_cast<size_t>(input.numel());
    return launch(::ember::detail::str_cat("all_gather(", input.desc(), " -> ", output.desc(), ")"), {output, input},
                  [&](ncclComm_t c, cudaStream_t s) { return ncclAllGather(in, out, n, dt, c, s); }, n == 0);
  }

  // A one-element all-reduce, waited for on the host (bounded by the timeout). Not usable inside
  // an NcclGroup scope.
  void barrier() override {
    void* p = state_->barrier_buf;
    auto w = launch("barrier", {}, [&](ncclComm_t c, cudaStream_t s) { return ncclAllReduce(p, p, 1, ncclInt32, ncclSum, c, s); },
                    false);
    static_cast<NcclWork&>(*w).synchronize();
  }

  // Host wait for every collective issued so far (bounded by the timeout of each).
  void synchronize() {
    state_->check_not_aborted("synchronize");
    std::vector<detail::NcclPending> works;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      works.assign(state_->outstanding.begin(), state_->outstanding.end());
    }
    for (auto& w : works) state_->host_wait(w.done->ev, w.start + options_.timeout, w.what, options_.timeout);
    state_->sweep("synchronize");
  }

  // Throws DistributedError (after aborting) on an asynchronous NCCL error or an overdue collective.
  void check_async_error() {
    state_->check_not_aborted("check_async_error");
    state_->sweep("check_async_error");
  }

  // Aborts the communicator (and, for create_all, those of the other devices): pending
  // collectives stop, and every later call into the group throws DistributedError.
  void abort(const std::string& reason = "aborted by the user") { state_->abort_with_clique(reason, reason); }

 private:
  NcclProcessGroup(std::shared_ptr<detail::NcclCommState> state, NcclOptions options, bool single_process)
      : options_(options), state_(std::move(state)), single_process_(single_process) {}

  void check_tensor(const AnyTensor& t, const char* what) const {
    EMBER_CHECK(t.defined(), ValueError, "NcclProcessGroup::", what, ": undefined tensor");
    EMBER_CHECK(t.device() == Device::cuda(state_->device), DeviceError, "NcclProcessGroup::", what, ": tensor ",
                t.desc(), " is on ", t.device().str(), " but this group (", state_->where(), ") works on cuda:",
                state_->device);
  }

  template <class Call>
  std::shared_ptr<Work> launch(std::string what, std::vector<AnyTensor> keep, Call&& call, bool empty) {
    detail::NcclCommState& st = *state_;
    st.check_not_aborted(what.c_str());
    st.sweep(what.c_str());
    auto& scope = detail::nccl_group_scope();
    if (single_process_ && st.size > 1 && scope.depth == 0) {
      throw DistributedError(::ember::detail::str_cat(
          "NcclProcessGroup::", what, " (", st.where(), "): a group made by create_all with ", st.size,
          " devices issues collectives inside a dist::NcclGroup scope, from one thread (NCCL may block in a "
          "collective until the other devices join)"));
    }
    if (empty) return std::make_shared<CompletedWork>();
    cuda::DeviceGuard guard(st.device);
    auto w = std::make_shared<detail::NcclWorkState>();
    w->comm = state_;
    w->what = std::move(what);
    w->keep = std::move(keep);
    w->start = detail::Clock::now();
    w->done = std::make_shared<detail::NcclEvent>();
    {
      std::lock_guard<std::mutex> lock(st.mu);
      EMBER_CUDA_CHECK(cudaEventRecord(st.ready, cuda::current_stream(st.device)));
      EMBER_CUDA_CHECK(cudaStreamWaitEvent(st.stream, st.ready, 0));
      EMBER_NCCL_CHECK_COMM(call(st.comm, st.stream), st.comm);
    }
    if (scope.depth > 0) {
      scope.pending.push_back(w);
    } else {
      detail::record_done(*w, w->what.c_str());
    }
    return std::make_shared<NcclWork>(std::move(w), options_.blocking_wait);
  }

  NcclOptions options_;
  std::shared_ptr<detail::NcclCommState> state_;
  bool single_process_ = false;
};

}  // namespace ember::dist

#elif defined(EMBER_REQUIRE_NCCL)
#error "ember/dist/nccl.hpp: nccl.h and cuda_runtime.h were not found (add the CUDA toolkit's include path)"
#endif
