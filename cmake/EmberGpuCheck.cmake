# What tools/gpu-check.sh builds and runs on the GPU check machine, where minutes are counted
# (docs/gpu-status.md, "Which tests and benchmarks the check runs"):
#   - the custom target `ember_gpu` depends on every target the check needs: the check builds
#     `cmake --build <dir> --target ember_gpu` and nothing else;
#   - every ctest entry of a GPU test area carries the label `gpu` (the check runs `ctest -L gpu`).
# Included by tests/, examples/ and benchmarks/ (any order, any subset): the first one defines it.
include_guard(GLOBAL)

add_custom_target(ember_gpu)

# ember_gpu_target(<target>...): the check builds these targets.
function(ember_gpu_target)
  add_dependencies(ember_gpu ${ARGN})
endfunction()

# ember_gpu_test_area(<target> <test list variable>): a Catch2 executable whose discovered tests
# (catch_discover_tests(... TEST_LIST <var>)) all run on the GPU machine: they get the labels
# "<target>;gpu". The labels are set in a ctest include file read after catch_discover_tests' own
# (its PROPERTIES option cannot carry a list), so a test file needs no change to be labelled.
function(ember_gpu_test_area target list_var)
  ember_gpu_target(${target})
  set(_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_gpu_labels.cmake")
  file(WRITE "${_file}"
    "if(DEFINED ${list_var})\n"
    "  set_tests_properties(\${${list_var}} PROPERTIES LABELS \"${target};gpu\")\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${_file}")
endfunction()

# ember_gpu_test(<test>...): plain add_test() entries (an example on cuda:0) that the check runs:
# they get the label `gpu` added to theirs.
function(ember_gpu_test)
  foreach(_test IN LISTS ARGN)
    set_property(TEST ${_test} APPEND PROPERTY LABELS gpu)
  endforeach()
endfunction()
