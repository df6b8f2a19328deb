# Runs a command that must end with one exact exit status within MAX_SECONDS (no process may
# hang), its output matching EXPECT and not matching REJECT (when given). For the MPI tests where
# a rank fails on purpose and mpirun must pass its status on.
#   cmake -DCOMMAND="mpiexec -n 2 prog exit" -DEXPECT_RC=7 -DEXPECT=regex -DREJECT=regex
#         -DMAX_SECONDS=60 -P expect_exit.cmake
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
message("expect_exit: exit status '${_rc}' after ${_secs} s (expected ${EXPECT_RC}, limit ${MAX_SECONDS} s)")
if(_rc MATCHES "timeout" OR _secs GREATER_EQUAL MAX_SECONDS)
  message(FATAL_ERROR "expect_exit: the command did not end within ${MAX_SECONDS} s (a rank hangs)")
endif()
if(NOT "${_rc}" STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "expect_exit: exit status '${_rc}', expected '${EXPECT_RC}'")
endif()
if(DEFINED EXPECT AND NOT "${EXPECT}" STREQUAL "" AND NOT "${_out}${_err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "expect_exit: the output does not match '${EXPECT}'")
endif()
if(DEFINED REJECT AND NOT "${REJECT}" STREQUAL "" AND "${_out}${_err}" MATCHES "${REJECT}")
  message(FATAL_ERROR "expect_exit: the output matches '${REJECT}'")
endif()
message("expect_exit: ended as expected")
