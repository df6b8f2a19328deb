// ember's compiled library (EMBER_COMPILED_LIB, core/macros.hpp): the CPU backend, compiled once.
// The other files of the program see only the kernel table (core/backend_registry.hpp).
#include "ember/src/library_unit.hpp"

#include "ember/backend/cpu/cpu_backend.hpp"

namespace ember::detail {
Backend& compiled_cpu_backend() {
  static cpu::CpuBackend backend;
  return backend;
}
}  // namespace ember::detail
