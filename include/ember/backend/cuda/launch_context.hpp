#pragma once
// Where the CUDA backend's work for one device goes (host code): the device, its multiprocessor
// count (grid sizes), its ember stream (runtime.hpp) and its stream-ordered allocator for scratch
// memory. Every launch_* function of kernels/*.cuh, the copies (device_copy.hpp) and the
// convolutions (conv.hpp) take one; CudaBackend holds it.
#include <cstddef>

#include "ember/backend/cuda/allocator.hpp"
#include "ember/backend/cuda/runtime.hpp"

namespace ember::cuda {

struct LaunchContext {
  int device = 0;
  int sm_count = 0;
  cudaStream_t stream = nullptr;
  DeviceAllocator* memory = nullptr;

  // Scratch memory in the stream's order: valid for the work queued before release().
  void* scratch(size_t bytes) const { return memory->allocate(bytes); }
  void release(void* p, size_t bytes) const noexcept { memory->deallocate(p, bytes); }
};

}  // namespace ember::cuda
