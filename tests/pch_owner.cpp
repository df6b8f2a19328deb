// Empty on purpose: the target ember_test_pch (tests/CMakeLists.txt) exists to own the test
// areas' precompiled header (Catch2 and ember.hpp), which CMake attaches to a source file of it.
