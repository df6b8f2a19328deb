// The CPU backend compiled once for a program built with EMBER_CPU_BACKEND_COMPILED defined in
// every file (the CMake target ember::cpu_backend compiles this file and defines it for its
// users). Without that definition ember is header-only and this file is not needed. All files of
// a program must agree: mixing the two gives two CPU backends (two allocators, two sets of stats).
#if !defined(EMBER_CPU_BACKEND_COMPILED)
#error "ember_cpu.cpp: compile it with EMBER_CPU_BACKEND_COMPILED defined, as every file of the program that links it"
#endif
#include "ember/backend/cpu/cpu_backend.hpp"

namespace ember::detail {
Backend& compiled_cpu_backend() {
  static cpu::CpuBackend backend;
  return backend;
}
}  // namespace ember::detail
