#pragma once
// One issued NCCL collective of a dist::NcclProcessGroup (what NcclWork holds), and the
// collectives issued inside the current dist::NcclGroup scope. Part of ember/dist/nccl.hpp, which
// includes it where nccl.h and cuda_runtime.h exist.
#include <nccl.h>
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ember/backend/cuda/runtime.hpp"
#include "ember/core/error.hpp"
#include "ember/core/tensor.hpp"
#include "ember/dist/detail/nccl_comm_state.hpp"

namespace ember::dist::detail {

// One issued collective: its "done" event (recorded on the NCCL stream), its deadline, and the
// tensors it reads and writes (kept alive until ember's stream is ordered after it).
struct NcclWorkState {
  std::shared_ptr<NcclCommState> comm;
  std::string what;
  std::shared_ptr<NcclEvent> done;
  bool recorded = false;   // false while inside an NcclGroup scope
  bool abandoned = false;  // the NcclWork was dropped before the event was recorded
  Clock::time_point start;
  std::vector<AnyTensor> keep;
};

// Records w's "done" event on the NCCL stream once the call that issued it has finished (a
// non-blocking communicator: `call` names it in a timeout), and hands it to the communicator's
// deadline checks.
inline void record_done(NcclWorkState& w, const char* call) {
  NcclCommState& c = *w.comm;
  if (c.nonblocking) c.wait_ready(w.start + c.options.timeout, call);
  cuda::DeviceGuard guard(c.device);
  EMBER_CUDA_CHECK(cudaEventRecord(w.done->ev, c.stream));
  std::lock_guard<std::mutex> lock(c.mu);
  w.recorded = true;
  c.outstanding.push_back(NcclPending{w.done, w.start, w.what});
}

// The collectives issued by this thread inside the current NcclGroup scope.
struct NcclGroupScope {
  int depth = 0;
  std::vector<std::shared_ptr<NcclWorkState>> pending;
};
inline NcclGroupScope& nccl_group_scope() {
  thread_local NcclGroupScope scope;
  return scope;
}

}  // namespace ember::dist::detail
