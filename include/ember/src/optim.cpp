// ember's compiled library (EMBER_COMPILED_LIB, core/macros.hpp): optimizer and scheduler state
// files and their JSON, compiled once.
#include "ember/src/library_unit.hpp"

#include "ember/optim/detail/state_io_impl.hpp"
