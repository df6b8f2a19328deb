#pragma once
// OpenBLAS 0.3.21 (Debian 12) takes some AVX-512 CPUs for old ones and runs its slow Prescott
// GEMM kernels (about 1.5-5x slower). OPENBLAS_CORETYPE=SkylakeX fixes it on AVX-512 CPUs only,
// and OpenBLAS reads it when the library is loaded, before main. So a program that wants it
// re-executes itself once with the variable set, when the CPU has AVX-512 and the user has not
// chosen a core type. Only the examples and benchmarks do this; the library never touches the
// environment.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace examples {

inline bool cpu_has_avx512f() {
  std::ifstream info("/proc/cpuinfo");
  std::string line;
  while (std::getline(info, line))
    if (line.rfind("flags", 0) == 0) return line.find(" avx512f") != std::string::npos;
  return false;
}

inline void ensure_openblas_coretype(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("EMBER_NO_REEXEC") || !cpu_has_avx512f()) return;
  setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  setenv("EMBER_NO_REEXEC", "1", 1);  // never loop
  execv("/proc/self/exe", argv);      // returns only on failure: then just run as we are
}

}  // namespace examples
