#pragma once
// ember: the umbrella header. Including it gives the whole CPU library; the CUDA backend joins at
// run time when the program also compiles include/ember/backend/cuda/ember_cuda.cu with nvcc
// (CMake: link ember::cuda). See README "How CUDA kernels reach a program".
#include "ember/core/macros.hpp"  // first: its C++20 check comes before any other error
#include "ember/version.hpp"

#include "ember/core/backend_registry.hpp"
#include "ember/core/device.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/error.hpp"
#include "ember/core/half.hpp"
#include "ember/core/random.hpp"
#include "ember/core/shape.hpp"
#include "ember/core/tensor.hpp"
#include "ember/core/trace.hpp"
#include "ember/backend/cpu/parallel.hpp"  // set_num_threads, get_num_threads (CPU kernels and BLAS)

#include "ember/autograd/anomaly.hpp"
#include "ember/autograd/engine.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/node.hpp"

#include "ember/ops/ops.hpp"

#include "ember/io/io.hpp"

#include "ember/nn/nn.hpp"
#include "ember/optim/optim.hpp"
#include "ember/amp/amp.hpp"
#include "ember/train/train.hpp"
#include "ember/dist/process_group.hpp"  // dist::MpiProcessGroup: ember/dist/mpi.hpp (link ember::mpi)
#include "ember/data/distributed_sampler.hpp"
#include "ember/logging/metrics_logger.hpp"      // logging::MetricsLogger (TensorBoard, JSON lines, CSV)
#include "ember/profile/device_monitor.hpp"  // profile::DeviceMonitor (NVML loaded at run time)
#include "ember/profile/profiler.hpp"        // profile::Profiler, Range, ProfileScope, verdict
#include "ember/profile/step_log.hpp"
