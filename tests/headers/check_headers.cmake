# ctest headers.self_contained: builds the header tests (a no-op on an up-to-date tree, an error
# with the compiler's message when a header is not self-contained) and runs the link test.
# cmake -DBUILD_DIR=... -DCONFIG=... -DTARGET=... -DEXE=... [-DCLANG_TARGET=... -DCLANG_EACH=ON|OFF] -P check_headers.cmake
set(_config_args "")
if(CONFIG)
  set(_config_args --config "${CONFIG}")
endif()
# Builds `target`; where that fails, stops with the build's output (`with` names the compiler).
function(_build_or_fail target with)
  execute_process(COMMAND "${CMAKE_COMMAND}" --build "${BUILD_DIR}" --target "${target}" ${_config_args}
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "building ${target} failed: a public header does not compile on its own${with}\n${_out}")
  endif()
endfunction()
_build_or_fail("${TARGET}" "")
# The second compiler's check (clang++ with libc++), when it is configured.
if(CLANG_TARGET)
  _build_or_fail("${CLANG_TARGET}" " with clang++")
  if(CLANG_EACH)
    message("the public headers also compile on their own with clang++ and libc++")
  else()
    message("the public headers also compile with clang++ and libc++, all in one file (each on its own: -DEMBER_HEADER_TESTS_CLANG_EACH=ON)")
  endif()
endif()
execute_process(COMMAND "${EXE}" RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
message("${_out}")
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${EXE} exited with ${_rc}")
endif()
