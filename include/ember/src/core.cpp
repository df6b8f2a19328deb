// ember's compiled library (EMBER_COMPILED_LIB, core/macros.hpp): build_info() reports the
// library's settings, those its kernels were compiled with.
#include "ember/src/library_unit.hpp"

#include "ember/core/build_info.hpp"

namespace ember {
BuildInfo build_info() { return detail::build_info_of_this_file(); }
}  // namespace ember
