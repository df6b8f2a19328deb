# Driver of ember's package tests: configures, builds and (optionally) runs a consumer project in a
# fresh folder, and checks what the program prints. Run with cmake -P:
#   -DSOURCE_DIR=<consumer project> -DBINARY_DIR=<fresh build folder> -DGENERATOR=<generator>
#   -DARGS=<extra configure arguments, separated by |>
#   -DRUN=<executable to run, relative to BINARY_DIR; empty: build only>
#   -DLAUNCHER=<command that starts RUN, e.g. mpiexec and its arguments, separated by |; empty: none>
#   -DEXPECT=<regular expression the program's output must match>
#   -DEXPECT_CONFIGURE_FAILURE=<regular expression>  the consumer's configure must fail, and its
#                  output match this; nothing is built
#   -DNO_NVCC=ON   hide the CUDA compiler (PATH without nvcc, CUDACXX/CUDA_PATH/... unset), as on a
#                  machine without the CUDA toolkit
#   -DINSTALL_FROM=<ember source> -DPREFIX=<folder>  instead of a consumer: configure ember itself,
#                  build and install it into PREFIX, then check the installed package files
#   -DEXPECT_FILES=<files under PREFIX that must exist, separated by |>
cmake_minimum_required(VERSION 3.25)

function(run_step what)
  string(REPLACE ";" " " _shown "${ARGN}")
  message("-- ${what}: ${_shown}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  if(NOT _rc EQUAL 0)
    message("${_out}")
    message(FATAL_ERROR "${what} failed (exit ${_rc})")
  endif()
  set(STEP_OUTPUT "${_out}" PARENT_SCOPE)
endfunction()

string(REPLACE "|" ";" _args "${ARGS}")
if(NOT GENERATOR)
  set(GENERATOR "Ninja")
endif()

if(NO_NVCC)
  # Everything CMake's CUDA compiler search looks at.
  foreach(_v CUDACXX CUDA_PATH CUDA_HOME CUDA_ROOT CUDAToolkit_ROOT CUDAARCHS)
    unset(ENV{${_v}})
  endforeach()
  set(_path "")
  string(REPLACE ":" ";" _dirs "$ENV{PATH}")
  foreach(_d IN LISTS _dirs)
    if(NOT EXISTS "${_d}/nvcc")
      list(APPEND _path "${_d}")
    endif()
  endforeach()
  string(REPLACE ";" ":" _path "${_path}")
  set(ENV{PATH} "${_path}")
endif()

file(REMOVE_RECURSE "${BINARY_DIR}")
file(MAKE_DIRECTORY "${BINARY_DIR}")

if(INSTALL_FROM)
  file(REMOVE_RECURSE "${PREFIX}")
  run_step("configure ember" "${CMAKE_COMMAND}" -S "${INSTALL_FROM}" -B "${BINARY_DIR}" -G "${GENERATOR}"
           "-DCMAKE_INSTALL_PREFIX=${PREFIX}" ${_args})
  message("${STEP_OUTPUT}")
  run_step("build ember" "${CMAKE_COMMAND}" --build "${BINARY_DIR}")
  run_step("install ember" "${CMAKE_COMMAND}" --install "${BINARY_DIR}")
  message("${STEP_OUTPUT}")
  string(REPLACE "|" ";" _files "${EXPECT_FILES}")
  foreach(_f IN LISTS _files)
    if(NOT EXISTS "${PREFIX}/${_f}")
      message(FATAL_ERROR "not installed: ${PREFIX}/${_f}")
    endif()
  endforeach()
  message("ember package installed into ${PREFIX}")
  return()
endif()

if(EXPECT_CONFIGURE_FAILURE)
  execute_process(COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${BINARY_DIR}" -G "${GENERATOR}" ${_args}
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  message("${_out}")
  if(_rc EQUAL 0)
    message(FATAL_ERROR "configuring the consumer succeeded; it should have failed")
  endif()
  # CMake wraps long messages: compare with the line breaks and indentation folded into spaces.
  string(REGEX REPLACE "[ \t]*\n[ \t]*" " " _folded "${_out}")
  if(NOT _folded MATCHES "${EXPECT_CONFIGURE_FAILURE}")
    message(FATAL_ERROR "configuring the consumer failed, but its output does not match '${EXPECT_CONFIGURE_FAILURE}'")
  endif()
  message("consumer configure failed as expected")
  return()
endif()

run_step("configure consumer" "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${BINARY_DIR}" -G "${GENERATOR}" ${_args})
message("${STEP_OUTPUT}")
run_step("build consumer" "${CMAKE_COMMAND}" --build "${BINARY_DIR}")
if(NOT RUN)
  message("consumer built (not run)")
  return()
endif()
string(REPLACE "|" ";" _launcher "${LAUNCHER}")
execute_process(COMMAND ${_launcher} "${BINARY_DIR}/${RUN}" RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
message("${_out}")
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${RUN} exited with ${_rc}")
endif()
if(EXPECT AND NOT _out MATCHES "${EXPECT}")
  message(FATAL_ERROR "the output of ${RUN} does not match '${EXPECT}'")
endif()
message("consumer OK")
