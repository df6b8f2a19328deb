// ember's compiled library (EMBER_COMPILED_LIB, core/macros.hpp): safetensors files and headers
// (nlohmann-json), compiled once.
#include "ember/src/library_unit.hpp"

#include "ember/io/detail/safetensors_header_impl.hpp"
#include "ember/io/detail/safetensors_impl.hpp"
