# ember's package tests package.plain_gxx and package.plain_gxx_compiled: a CPU-only program
# compiles with nothing but `<c++ compiler> -std=c++20 -I<ember/include>` (no CMake, no CUDA
# include path, no libraries), pulls in no CUDA header, and runs. With -DCOMPILED=ON it follows the
# README's recipe for the compiled library instead: include/ember/src/*.cpp compiled with
# -DEMBER_COMPILED_LIB into libember.a, the program compiled with the same definition and linked
# to it. Run with cmake -P:
#   -DCXX=<compiler> -DINCLUDE_DIR=<ember/include> -DSOURCE=<main.cpp> -DBINARY_DIR=<folder> -DEXPECT=<regex>
#   [-DCOMPILED=ON]
cmake_minimum_required(VERSION 3.25)
foreach(_v CPATH CPLUS_INCLUDE_PATH C_INCLUDE_PATH)  # no include path from the environment either
  unset(ENV{${_v}})
endforeach()
file(REMOVE_RECURSE "${BINARY_DIR}")
file(MAKE_DIRECTORY "${BINARY_DIR}")
set(_exe "${BINARY_DIR}/plain_consumer")

# Runs a command (ARGN); where it fails, stops with "<what>:" and what it printed.
function(_run_or_fail what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${what}:\n${_out}")
  endif()
endfunction()

# The headers it reads: none may come from the CUDA toolkit, cuDNN or NCCL.
execute_process(COMMAND "${CXX}" -std=c++20 "-I${INCLUDE_DIR}" -M "${SOURCE}"
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _deps ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${CXX} -std=c++20 -I${INCLUDE_DIR} -M failed:\n${_err}")
endif()
# ember's own headers end in .hpp/.cuh; these are the toolkit's, cuDNN's and NCCL's.
string(REGEX MATCHALL "[^ \\\n]*/(cuda_runtime[a-z_]*|cuda|cuda_fp16|cuda_bf16|cublas[A-Za-z_0-9]*|cudnn[a-z_0-9]*|nccl[a-z_]*)\\.h[ \\\n]"
       _cuda "${_deps}")
if(_cuda)
  list(REMOVE_DUPLICATES _cuda)
  message(FATAL_ERROR "a CPU-only translation unit reads CUDA headers: ${_cuda}")
endif()

set(_defs "")
set(_libs "")
if(COMPILED)
  set(_defs -DEMBER_COMPILED_LIB)
  file(GLOB _lib_sources "${INCLUDE_DIR}/ember/src/*.cpp")
  set(_objects "")
  foreach(_src IN LISTS _lib_sources)
    get_filename_component(_name "${_src}" NAME_WE)
    set(_obj "${BINARY_DIR}/${_name}.o")
    message("-- ${CXX} -std=c++20 -O1 -DEMBER_COMPILED_LIB -I${INCLUDE_DIR} -c ${_src} -o ${_obj}")
    _run_or_fail("compiling the library source ${_src} failed"
                 "${CXX}" -std=c++20 -O1 -DEMBER_COMPILED_LIB "-I${INCLUDE_DIR}" -c "${_src}" -o "${_obj}")
    list(APPEND _objects "${_obj}")
  endforeach()
  _run_or_fail("ar failed" ar rcs "${BINARY_DIR}/libember.a" ${_objects})
  set(_libs "${BINARY_DIR}/libember.a")
endif()

message("-- ${CXX} -std=c++20 ${_defs} -I${INCLUDE_DIR} ${SOURCE} ${_libs} -o ${_exe}")
_run_or_fail("plain compile failed" "${CXX}" -std=c++20 ${_defs} "-I${INCLUDE_DIR}" "${SOURCE}" ${_libs} -o "${_exe}")
execute_process(COMMAND "${_exe}" RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
message("${_out}")
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "plain_consumer exited with ${_rc}")
endif()
if(NOT _out MATCHES "${EXPECT}")
  message(FATAL_ERROR "the output does not match '${EXPECT}'")
endif()
message("plain compiler consumer OK")
