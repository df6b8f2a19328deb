#pragma once
// The message of the exception a call throws, or "(no exception)": for the tests that check
// what an error says (CHECK_THAT(message_of([&] { ... }), Contains(...))).
#include <exception>
#include <string>

namespace ember::testing {

template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace ember::testing
