#pragma once
// The state of one NCCL communicator behind a dist::NcclProcessGroup: the communicator and its
// stream, the collectives still outstanding with their deadlines, the polling of NCCL's
// asynchronous errors, host waits, and the abort (of a whole create_all set). Part of
// ember/dist/nccl.hpp, which includes it where nccl.h and cuda_runtime.h exist.
#include <nccl.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ember/backend/cuda/nccl.hpp"
#include "ember/backend/cuda/runtime.hpp"
#include "ember/core/error.hpp"
#include "ember/dist/process_group.hpp"

namespace ember::dist::detail {

using Clock = std::chrono::steady_clock;

// Between two polls of a host wait: yield at first, then sleep 100 us.
inline void nccl_poll_pause(int& spins) {
  if (++spins < 64) std::this_thread::yield();
  else std::this_thread::sleep_for(std::chrono::microseconds(100));
}

// A CUDA event, destroyed with its last owner.
struct NcclEvent {
  cudaEvent_t ev = nullptr;
  NcclEvent() { EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)); }
  NcclEvent(const NcclEvent&) = delete;
  NcclEvent& operator=(const NcclEvent&) = delete;
  ~NcclEvent() {
    if (ev) (void)cudaEventDestroy(ev);
  }
};

// A collective the communicator still tracks (no tensors, no back pointer: no ownership cycle).
struct NcclPending {
  std::shared_ptr<NcclEvent> done;
  Clock::time_point start;
  std::string what;
};

// ncclAvg and bfloat16 reductions, which the group uses, need NCCL 2.10 or newer at run time (the
// library loaded may be older than the headers compiled against, e.g. from a Python wheel).
inline void check_nccl_version() {
  const int v = cuda::nccl_runtime_version();  // 2.9 on: major*10000 + minor*100 + patch; before: *1000
  EMBER_CHECK(v >= 21000, DistributedError, "NcclProcessGroup: the NCCL loaded at run time has version code ", v,
              " (ncclGetVersion); ember needs NCCL 2.10 or newer (ncclAvg, bfloat16)");
}

// One process driving several GPUs: NCCL may read and write the other devices' buffers directly,
// and memory from a device's stream-ordered pool (ember's allocator) is visible to another
// device only after cudaMemPoolSetAccess (peer access alone does not cover pools).
inline void grant_pool_access(const std::vector<int>& devices) {
  if (devices.size() < 2) return;
  for (int owner : devices) {
    cudaMemPool_t pool = nullptr;
    EMBER_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, owner));
    for (int peer : devices) {
      if (peer == owner) continue;
      int can = 0;
      EMBER_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, peer, owner));
      if (!can) continue;  // NCCL then goes through its own buffers
      cudaMemAccessDesc access{};
      access.location.type = cudaMemLocationTypeDevice;
      access.location.id = peer;
      access.flags = cudaMemAccessFlagsProtReadWrite;
      EMBER_CUDA_CHECK(cudaMemPoolSetAccess(pool, &access, 1));
    }
  }
}

// The communicator and the NCCL stream of one device, shared by its group and its Work handles.
struct NcclCommState {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int size = 1;
  int device = 0;
  bool nonblocking = false;
  ProcessGroupOptions options;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;
  void* barrier_buf = nullptr;
  std::mutex mu;
  bool aborted = false;
  std::string abort_reason;
  std::deque<NcclPending> outstanding;
  // The communicators created together by create_all: an abort aborts them all (a kernel of the
  // others may wait for this one forever).
  std::shared_ptr<std::vector<std::weak_ptr<NcclCommState>>> clique;

  // Sets up rank, size, device and options, the NCCL stream, the event that orders it after
  // ember's stream, and the barrier's buffer (the communicator comes from the caller).
  void open(int r, int n, int dev, const ProcessGroupOptions& opts) {
    check_nccl_version();
    rank = r;
    size = n;
    device = dev;
    options = opts;
    cuda::DeviceGuard guard(device);
    (void)cuda::current_stream(device);  // create ember's stream now, not inside a collective
    EMBER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    EMBER_CUDA_CHECK(cudaMalloc(&barrier_buf, sizeof(int32_t)));
    EMBER_CUDA_CHECK(cudaMemsetAsync(barrier_buf, 0, sizeof(int32_t), stream));  // NCCL's stream: ordered
  }

  std::string where() const {
    return ::ember::detail::str_cat("rank ", rank, "/", size, " on cuda:", device);
  }

  // Aborts the communicator (once); returns false if it already was.
  bool abort_one(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted) return false;
    aborted = true;
    abort_reason = reason;
    if (comm) {
      const int prev = cuda::internal::current_device_or_minus_one();
      (void)cudaSetDevice(device);
      (void)ncclCommAbort(comm);
      if (prev >= 0 && prev != device) (void)cudaSetDevice(prev);
    }
    comm = nullptr;
    return true;
  }

  // Aborts this communicator and the others of its create_all set (with others_reason).
  void abort_with_clique(const std::string& reason, const std::string& others_reason) {
    abort_one(reason);
    if (clique) {
      for (auto& w : *clique) {
        if (auto other = w.lock(); other && other.get() != this) other->abort_one(others_reason);
      }
    }
  }

  [[noreturn]] void abort_and_throw(const std::string& reason) {
    abort_with_clique(reason, "a communicator of the same create_all set was aborted: " + reason);
    throw DistributedError(::ember::detail::str_cat("NcclProcessGroup (", where(), "): ", reason,
                                                    "; the communicator was aborted"));
  }

  void check_not_aborted(const char* what) {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted) {
      throw DistributedError(::ember::detail::str_cat("NcclProcessGroup::", what, " (", where(),
                                                      "): the communicator was aborted earlier: ", abort_reason));
    }
  }

  // ncclSuccess, ncclInProgress, or the asynchronous error (an error aborts and throws).
  ncclResult_t poll_async_error(const char* what) {
    ncclResult_t r = ncclSuccess;
    std::string last;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (aborted) {
        throw DistributedError(::ember::detail::str_cat("NcclProcessGroup: ", what, " (", where(),
                                                        "): the communicator was aborted earlier: ", abort_reason));
      }
      const ncclResult_t q = ncclCommGetAsyncError(comm, &r);
      if (q != ncclSuccess) r = q;
      if (r != ncclSuccess && r != ncclInProgress) {
        const char* l = ncclGetLastError(comm);
        if (l) last = l;
      }
    }
    if (r != ncclSuccess && r != ncclInProgress) {
      abort_and_throw(::ember::detail::str_cat(what, ": asynchronous NCCL error ", static_cast<int>(r), " (",
                                               ncclGetErrorString(r), ")", last.empty() ? std::string() : ": " + last));
    }
    return r;
  }

  // Non-blocking communicators: polls until the last call has finished (ncclInProgress cleared).
  void wait_ready(Clock::time_point deadline, const char* what) {
    int spins = 0;
    while (poll_async_error(what) == ncclInProgress) {
      if (Clock::now() > deadline) {
        abort_and_throw(::ember::detail::str_cat(what, " did not finish within ", options.timeout.count(), " ms"));
      }
      nccl_poll_pause(spins);
    }
  }

  // Whether the NCCL stream has reached `ev` (a CUDA error other than "not ready" throws).
  bool event_done(cudaEvent_t ev) {
    cuda::DeviceGuard guard(device);
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) cuda::internal::throw_cuda_error(e, "cudaEventQuery (NCCL collective)", __FILE__, __LINE__);
    return false;
  }

  // Retires the finished collectives; one past its deadline aborts the communicator.
  void sweep(const char* what) {
    poll_async_error(what);
    std::string late;
    {
      std::lock_guard<std::mutex> lock(mu);
      while (!outstanding.empty()) {
        NcclPending& w = outstanding.front();
        if (event_done(w.done->ev)) {
          outstanding.pop_front();
          continue;
        }
        if (Clock::now() - w.start > options.timeout) {
          late = ::ember::detail::str_cat(w.what, " did not finish within ", options.timeout.count(), " ms");
        }
        break;  // collectives finish in order on the NCCL stream
      }
    }
    if (!late.empty()) abort_and_throw(late);
  }

  // Host wait for one event, until `deadline`.
  void host_wait(cudaEvent_t ev, Clock::time_point deadline, const std::string& what,
                 std::chrono::milliseconds timeout) {
    int spins = 0;
    for (;;) {
      poll_async_error(what.c_str());
      if (event_done(ev)) return;
      if (Clock::now() > deadline) {
        abort_and_throw(::ember::detail::str_cat(what, " did not finish within ", timeout.count(), " ms"));
      }
      nccl_poll_pause(spins);
    }
  }

  ~NcclCommState() {
    try {
      teardown();
    } catch (...) {
    }
  }

  void teardown() {
    if (!aborted && comm != nullptr) {
      cuda::DeviceGuard guard(device);
      // Let the issued collectives finish (bounded), then destroy; abort what does not finish.
      bool finished = false;
      const auto deadline = Clock::now() + options.timeout;
      int spins = 0;
      for (;;) {
        const cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess) { finished = true; break; }
        if (e != cudaErrorNotReady || Clock::now() > deadline) break;
        ncclResult_t r = ncclSuccess;
        if (ncclCommGetAsyncError(comm, &r) != ncclSuccess || (r != ncclSuccess && r != ncclInProgress)) break;
        nccl_poll_pause(spins);
      }
      if (finished && nonblocking) {
        finished = false;
        const ncclResult_t f = ncclCommFinalize(comm);
        while (f == ncclSuccess || f == ncclInProgress) {
          ncclResult_t r = ncclSuccess;
          if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) break;
          if (r == ncclSuccess) { finished = true; break; }
          if (r != ncclInProgress || Clock::now() > deadline) break;
          nccl_poll_pause(spins);
        }
      }
      if (finished) (void)ncclCommDestroy(comm);
      else (void)ncclCommAbort(comm);
      comm = nullptr;
    }
    cuda::DeviceGuard guard(device);
    if (barrier_buf) (void)cudaFree(barrier_buf);
    if (ready) (void)cudaEventDestroy(ready);
    if (stream) (void)cudaStreamDestroy(stream);
  }
};

}  // namespace ember::dist::detail
