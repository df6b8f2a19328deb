#pragma once
// Included first by every source file of ember's compiled library (include/ember/src/*.cpp).
#if !defined(EMBER_COMPILED_LIB)
#error "include/ember/src/*.cpp are ember's compiled library: compile them with EMBER_COMPILED_LIB defined, as every file of the program that links them (CMake's ember::ember does both)"
#endif
#include "ember/core/macros.hpp"
