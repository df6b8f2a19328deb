#pragma once
// ember.hpp and the training stack above it: the Trainer and its parts, the process groups, the
// distributed sampler, the metrics logger and the profiler. Costs several seconds more per file
// than ember.hpp (nlohmann-json, zlib, the Trainer): a program's files that do not need these
// include ember.hpp and the headers they use instead. Still separate: the data readers
// (ember/data/*.hpp, some need libpng, libjpeg, liblmdb), dist/mpi.hpp (ember::mpi), nn/gpt.hpp,
// quant/, deploy/ and io/gguf.hpp.
#include "ember/ember.hpp"

#include "ember/train/train.hpp"
#include "ember/dist/process_group.hpp"  // dist::MpiProcessGroup: ember/dist/mpi.hpp (link ember::mpi)
#include "ember/data/distributed_sampler.hpp"
#include "ember/logging/metrics_logger.hpp"  // logging::MetricsLogger (TensorBoard, JSON lines, CSV)
#include "ember/profile/device_monitor.hpp"  // profile::DeviceMonitor (NVML loaded at run time)
#include "ember/profile/profiler.hpp"        // profile::Profiler, Range, ProfileScope, verdict
#include "ember/profile/step_log.hpp"
