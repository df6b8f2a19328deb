#pragma once
// ember: the umbrella header for a training program. It gives tensors, autograd, the ops, nn (all
// layers but GPT), the optimizers and schedulers, mixed precision and safetensors files: what a
// model, its loss and its update are written with. The rest has headers of its own, so that a
// program compiles only what it uses:
//
//   ember/train/train.hpp            Trainer, CheckpointManager, accumulation, batch-size finder
//   ember/data/*.hpp                 DataLoader, datasets and readers, transforms, samplers
//   ember/dist/*.hpp                 process groups, DataParallel, ZeRO (dist/mpi.hpp: ember::mpi)
//   ember/logging/metrics_logger.hpp TensorBoard, JSON lines and CSV metrics
//   ember/profile/*.hpp              profiler, step log, device monitor
//   ember/nn/gpt.hpp, ember/quant/, ember/deploy/, ember/io/gguf.hpp   GPT, INT8, ONNX and GGUF
//   ember/all.hpp                    this header with train, dist, logging and profile
//
// The CUDA backend joins at run time when the program also compiles
// include/ember/backend/cuda/ember_cuda.cu with nvcc (CMake: link ember::cuda). See README "How
// CUDA kernels reach a program", and "Using ember in a project" for the compiled library
// (EMBER_COMPILED_LIB, CMake's default) and header-only builds.
#include "ember/core/macros.hpp"  // first: its C++20 check comes before any other error
#include "ember/version.hpp"

#include "ember/core/backend_registry.hpp"
#include "ember/core/build_info.hpp"
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

#include "ember/io/safetensors.hpp"  // io::save_file, load_file (io/io.hpp adds the atomic writes)

#include "ember/nn/nn.hpp"
#include "ember/optim/optim.hpp"
#include "ember/amp/amp.hpp"
