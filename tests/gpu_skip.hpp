#pragma once
// EMBER_REQUIRE_GPU(): the first statement of a test case that needs a CUDA device. Without one,
// the test prints "SKIPPED: no GPU (<reason>; <test name>)" to stdout and returns; ctest counts
// that output as a skip (SKIP_REGULAR_EXPRESSION "SKIPPED: " in tests/CMakeLists.txt), since
// Catch2 v2 has no SKIP. The reason is what the CUDA runtime said at start-up (for example
// "cudaGetDeviceCount: cudaErrorInsufficientDriver (...); driver CUDA version none, runtime 13.0"),
// so that a GPU machine on which the tests skip says why in every line of the log.
//
// A test file that uses EMBER_REQUIRE_GPU is a GPU test area: tests/CMakeLists.txt gives all of
// its ctest entries the label `gpu`, and tools/gpu-check.sh runs `ctest -L gpu` on the GPU machine.
//
// EMBER_TEST_HAVE_CUDA is defined (tests/CMakeLists.txt) for every test executable into which the
// CUDA backend is compiled; only then are the CUDA runtime's headers on the include path.
#include <catch2/catch.hpp>

#include <iostream>
#include <string>

#include <ember/core/backend_registry.hpp>

#if defined(EMBER_TEST_HAVE_CUDA)
#include <ember/backend/cuda/runtime.hpp>
#endif

namespace ember::testing {

// Why no GPU is usable in this program (never empty).
inline std::string no_gpu_reason() {
  if (!::ember::cuda::is_compiled()) return "the CUDA backend is not compiled into this program";
#if defined(EMBER_TEST_HAVE_CUDA)
  const std::string& e = ::ember::cuda::device_count_error();
  if (!e.empty()) return e;
#endif
  return std::to_string(::ember::cuda::device_count()) + " CUDA devices registered";
}

}  // namespace ember::testing

#define EMBER_REQUIRE_GPU()                                                                           \
  do {                                                                                                \
    if (!::ember::cuda::is_available()) {                                                             \
      std::cout << "SKIPPED: no GPU (" << ::ember::testing::no_gpu_reason() << "; "                   \
                << ::Catch::getResultCapture().getCurrentTestName() << ")" << std::endl;              \
      return;                                                                                         \
    }                                                                                                 \
  } while (0)
