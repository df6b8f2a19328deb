# Runs a command that must fail: exit status non-zero, within MAX_SECONDS, and (when EXPECT is
# given) with output matching the regular expression EXPECT. Used for the MPI tests where a rank
# times out or dies on purpose.
#   cmake -DCOMMAND="mpiexec -n 2 prog timeout" -DEXPECT=regex -DMAX_SECONDS=60 -P expect_failure.cmake
separate_arguments(_cmd UNIX_COMMAND "${COMMAND}")
if(NOT MAX_SECONDS)
  set(MAX_SECONDS 60)
endif()
string(TIMESTAMP _t0 "%s" UTC)
execute_process(COMMAND ${_cmd} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err
                TIMEOUT ${MAX_SECONDS})
string(TIMESTAMP _t1 "%s" UTC)
math(EXPR _secs "${_t1} - ${_t0}")
message("${_out}")
message("${_err}")
message("expect_failure: exit status '${_rc}' after ${_secs} s (limit ${MAX_SECONDS} s)")
if(_rc MATCHES "timeout" OR _secs GREATER_EQUAL MAX_SECONDS)
  message(FATAL_ERROR "expect_failure: the command did not end within ${MAX_SECONDS} s")
endif()
if("${_rc}" STREQUAL "0")
  message(FATAL_ERROR "expect_failure: the command succeeded but was expected to fail")
endif()
if(DEFINED EXPECT AND NOT "${EXPECT}" STREQUAL "")
  if(NOT "${_out}${_err}" MATCHES "${EXPECT}")
    message(FATAL_ERROR "expect_failure: the output does not match '${EXPECT}'")
  endif()
endif()
message("expect_failure: failed as expected")
