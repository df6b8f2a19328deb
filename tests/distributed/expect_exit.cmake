# Runs one MPI test job and checks how it ended (ember_mpi_test in this folder's CMakeLists.txt):
# within MAX_SECONDS (no rank may hang), with exit status EXPECT_RC ("nonzero": any but 0), its
# output matching EXPECT and not matching REJECT (each when given).
#   cmake "-DCOMMAND=mpiexec -n 2 prog exit" -DEXPECT_RC=7 -DEXPECT=regex -DREJECT=regex
#         -DMAX_SECONDS=60 -P expect_exit.cmake
# COMMAND is split as a shell would split it (double quotes keep an argument with spaces whole).
separate_arguments(_cmd UNIX_COMMAND "${COMMAND}")
if(NOT MAX_SECONDS)
  set(MAX_SECONDS 60)
endif()
if(NOT DEFINED EXPECT_RC OR "${EXPECT_RC}" STREQUAL "")
  set(EXPECT_RC 0)
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
if(EXPECT_RC STREQUAL "nonzero")
  if("${_rc}" STREQUAL "0")
    message(FATAL_ERROR "expect_exit: the command succeeded but was expected to fail")
  endif()
elseif(NOT "${_rc}" STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "expect_exit: exit status '${_rc}', expected '${EXPECT_RC}'")
endif()
if(DEFINED EXPECT AND NOT "${EXPECT}" STREQUAL "" AND NOT "${_out}${_err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "expect_exit: the output does not match '${EXPECT}'")
endif()
if(DEFINED REJECT AND NOT "${REJECT}" STREQUAL "" AND "${_out}${_err}" MATCHES "${REJECT}")
  message(FATAL_ERROR "expect_exit: the output matches '${REJECT}'")
endif()
message("expect_exit: ended as expected")
