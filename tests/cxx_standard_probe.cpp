// Compiled by the test cxx_standard_error with -std=c++17: ember must stop at once with a clear
// #error (core/macros.hpp), not with pages of errors from its first concept.
#include <ember/ember.hpp>
