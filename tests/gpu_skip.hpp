#pragma once
// EMBER_REQUIRE_GPU(): the first statement of a test case that needs a CUDA device. Without one,
// the test prints "SKIPPED: no GPU (<test name>)" to stdout and returns; ctest counts that output
// as a skip (SKIP_REGULAR_EXPRESSION in tests/CMakeLists.txt), since Catch2 v2 has no SKIP.
#include <catch2/catch.hpp>

#include <iostream>

#include <ember/core/backend.hpp>

#define EMBER_REQUIRE_GPU()                                                                           \
  do {                                                                                                \
    if (!::ember::cuda::is_available()) {                                                             \
      std::cout << "SKIPPED: no GPU (" << ::Catch::getResultCapture().getCurrentTestName() << ")"     \
                << std::endl;                                                                         \
      return;                                                                                         \
    }                                                                                                 \
  } while (0)
