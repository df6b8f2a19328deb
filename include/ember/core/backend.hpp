#pragma once
// The kernel table with the CPU backend, which is always present (the CUDA backend registers
// itself from the nvcc-compiled translation unit). See core/kernel_table.hpp.
#include "ember/core/kernel_table.hpp"

// With EMBER_CPU_BACKEND_COMPILED the backend is compiled once (backend/cpu/ember_cpu.cpp) and
// stays out of the other files; a file that names cpu::CpuBackend includes it itself.
#if !defined(EMBER_CPU_BACKEND_COMPILED)
#include "ember/backend/cpu/cpu_backend.hpp"
#endif
