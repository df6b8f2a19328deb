#pragma once
// The host buffers of train::CheckpointManager::save_async: the state is copied into them on the
// calling thread (host tensors with a few threads, device tensors as downloads into pinned memory,
// one synchronisation per device), then the background writer reads them while training changes
// the live tensors. They are reused from one save to the next, so a save_async after the first
// costs one memcpy per tensor and no page faults.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <system_error>
#include <thread>
#include <vector>

#include "ember/core/backend_registry.hpp"
#include "ember/core/tensor.hpp"

namespace ember::train::detail {

// A host copy of t that shares nothing with it (the training thread may change t right after).
inline AnyTensor host_snapshot(const AnyTensor& t) {
  if (!t.device().is_cpu()) return t.detach().to(Device::cpu());
  AnyTensor out = AnyTensor::empty(t.shape(), t.dtype(), Device::cpu());
  if (t.nbytes() > 0) std::memcpy(out.data_ptr(), t.data_ptr(), t.nbytes());
  return out;
}

// The copies of one save_async: begin(), stage() for each tensor, complete().
class StagingBuffers {
 public:
  // Drops the copies of a staging that threw before complete() (its device copies are
  // stream-ordered: nothing is left in flight that matters).
  void begin() {
    pending_devices_.clear();
    host_copies_.clear();
  }

  // A host copy of v in staging buffer `slot` (reallocated when the shape, dtype or source device
  // changed), complete once complete() returns. A device tensor's buffer is pinned host memory
  // from its backend (Backend::allocate_pinned) and its copy only queued (download_async); a host
  // tensor's copy is queued for complete()'s threads.
  AnyTensor stage(const AnyTensor& v, size_t slot) {
    if (slot >= slots_.size()) slots_.resize(slot + 1);
    StagingSlot& st = slots_[slot];
    AnyTensor& buf = st.host;
    if (!buf.defined() || buf.dtype() != v.dtype() || !(buf.shape() == v.shape()) || st.source != v.device()) {
      buf = v.device().is_cpu() ? AnyTensor::empty(v.shape(), v.dtype(), Device::cpu()) : pinned_host_tensor(v);
      st.source = v.device();
    }
    if (v.nbytes() > 0) {
      if (v.device().is_cpu()) {
        host_copies_.push_back({buf.data_ptr(), v.data_ptr(), v.nbytes()});  // done by complete()
      } else {
        v.backend().download_async(buf.data_ptr(), v.data_ptr(), v.nbytes());
        if (std::find(pending_devices_.begin(), pending_devices_.end(), v.device()) == pending_devices_.end())
          pending_devices_.push_back(v.device());
      }
    }
    return buf;
  }

  // Makes every copy queued by stage() complete: one synchronisation per device, then the host
  // copies over copy_threads threads (0: min(4, hardware threads)).
  void complete(int copy_threads) {
    for (const Device& d : pending_devices_) backend_for(d).synchronize();
    pending_devices_.clear();
    run_host_copies(copy_threads);
  }

 private:
  // The host-to-host staging copies of one save_async, cut into equal byte ranges over
  // copy_threads threads (this one included): one memcpy is bound by one core's bandwidth.
  void run_host_copies(int copy_threads) {
    struct Copy {
      char* dst;
      const char* src;
      size_t bytes;
    };
    size_t total = 0;
    for (const HostCopy& c : host_copies_) total += c.bytes;
    int n = copy_threads > 0 ? copy_threads
                             : static_cast<int>(std::min(4u, std::max(1u, std::thread::hardware_concurrency())));
    constexpr size_t kMinPerThread = size_t(4) << 20;  // below this a thread costs more than it saves
    n = static_cast<int>(std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(n), total / kMinPerThread)));
    const size_t share = (total + static_cast<size_t>(n) - 1) / static_cast<size_t>(n);
    std::vector<std::vector<Copy>> parts(static_cast<size_t>(n));
    size_t part = 0, filled = 0;
    for (const HostCopy& c : host_copies_) {
      size_t done = 0;
      while (done < c.bytes) {
        const bool last = part + 1 == parts.size();  // the last part takes whatever is left
        const size_t take = last ? c.bytes - done : std::min(c.bytes - done, share - filled);
        parts[part].push_back({static_cast<char*>(c.dst) + done, static_cast<const char*>(c.src) + done, take});
        done += take;
        filled += take;
        if (filled == share && part + 1 < parts.size()) {
          ++part;
          filled = 0;
        }
      }
    }
    host_copies_.clear();
    auto run = [](const std::vector<Copy>& cs) {
      for (const Copy& c : cs) std::memcpy(c.dst, c.src, c.bytes);
    };
    std::vector<std::thread> helpers;
    for (size_t i = 1; i < parts.size(); ++i) {
      try {
        helpers.emplace_back(run, std::cref(parts[i]));
      } catch (const std::system_error&) {
        run(parts[i]);  // no thread to be had: copy it here
      }
    }
    run(parts[0]);
    for (auto& h : helpers) h.join();
  }

  // An uninitialised CPU tensor shaped as v whose storage is pinned host memory of v's device.
  static AnyTensor pinned_host_tensor(const AnyTensor& v) {
    const Device dev = v.device();
    return AnyTensor::empty_from(
        v.shape(), v.dtype(), Device::cpu(), [dev](size_t bytes) { return backend_for(dev).allocate_pinned(bytes); },
        [dev](void* q, size_t n) { backend_for(dev).free_pinned(q, n); }, "CheckpointManager staging");
  }

  struct StagingSlot {
    AnyTensor host;                // pageable for a CPU source, pinned for a device source
    Device source = Device::cpu();
  };
  std::vector<StagingSlot> slots_;  // one per tensor of a checkpoint, reused from one save to the next
  std::vector<Device> pending_devices_;  // devices with queued downloads (calling thread only)
  struct HostCopy {
    void* dst;
    const void* src;
    size_t bytes;
  };
  std::vector<HostCopy> host_copies_;  // staging copies of host tensors queued by stage() (calling thread only)
};

}  // namespace ember::train::detail
