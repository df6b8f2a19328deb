#pragma once
// The kernel table with the CPU backend, which is always present (the CUDA backend registers
// itself from the nvcc-compiled translation unit). See core/kernel_table.hpp.
#include "ember/core/kernel_table.hpp"

#include "ember/backend/cpu/cpu_backend.hpp"
