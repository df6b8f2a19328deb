# An older language standard gets ember's #error, first (core/macros.hpp). GCC and Clang only.
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  add_test(NAME cxx_standard_error
           COMMAND ${CMAKE_CXX_COMPILER} -std=c++17 -fsyntax-only -Wfatal-errors -I${PROJECT_SOURCE_DIR}/include
                   ${CMAKE_CURRENT_SOURCE_DIR}/cxx_standard_probe.cpp)
  set_tests_properties(cxx_standard_error PROPERTIES PASS_REGULAR_EXPRESSION "ember needs C\\+\\+20: compile with -std=c\\+\\+20"
                                                     LABELS test_core)
endif()
