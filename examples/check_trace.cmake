# ctest example.digits_mlp.profile: runs a short digits_mlp with --profile and checks that the
# Chrome trace file appears and holds "traceEvents", and that the step report was printed.
#   cmake -DEXE=<digits_mlp> -DTRACE=<path> -P check_trace.cmake
file(REMOVE "${TRACE}")  # a trace left by an earlier run must not pass the test
execute_process(COMMAND "${EXE}" --epochs 1 --device cpu --profile "${TRACE}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "digits_mlp --profile failed (${rc}):\n${out}\n${err}")
endif()
if(NOT EXISTS "${TRACE}")
  message(FATAL_ERROR "digits_mlp --profile wrote no trace at ${TRACE}:\n${out}")
endif()
file(READ "${TRACE}" trace)
string(FIND "${trace}" "\"traceEvents\"" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${TRACE} has no \"traceEvents\"")
endif()
string(FIND "${out}" "Trace: ${TRACE}" printed)
if(printed EQUAL -1)
  message(FATAL_ERROR "digits_mlp --profile did not print the trace's path:\n${out}")
endif()
message(STATUS "trace ok: ${TRACE}")
