# Decides whether to build against MPI (EMBER_MPI = AUTO / ON / OFF) and defines ember::mpi:
# ember::ember + MPI::MPI_CXX, for programs that use include/ember/dist/mpi.hpp
# (dist::MpiProcessGroup, the CPU collectives). Included by the top-level CMakeLists.txt; sets
# EMBER_HAVE_MPI. Open MPI on Debian/Ubuntu: apt-get install libopenmpi-dev openmpi-bin.
set(EMBER_HAVE_MPI OFF)
if(EMBER_MPI STREQUAL "OFF")
  message(STATUS "ember: MPI off (EMBER_MPI=OFF); ember::mpi is not defined")
  return()
endif()
if(EMBER_MPI STREQUAL "ON")
  find_package(MPI COMPONENTS CXX REQUIRED)
else()
  find_package(MPI COMPONENTS CXX QUIET)
endif()
if(NOT MPI_CXX_FOUND)
  message(STATUS "ember: MPI not found (Open MPI: libopenmpi-dev openmpi-bin); "
                 "ember::mpi, the MPI tests and bench_allreduce are not built")
  return()
endif()
add_library(ember_mpi INTERFACE)
add_library(ember::mpi ALIAS ember_mpi)
set_target_properties(ember_mpi PROPERTIES EXPORT_NAME mpi)
target_link_libraries(ember_mpi INTERFACE ember::ember MPI::MPI_CXX)
set(EMBER_HAVE_MPI ON)
# mpiexec for the multi-process tests and the benchmark.
if(NOT MPIEXEC_EXECUTABLE)
  message(STATUS "ember: MPI ${MPI_CXX_VERSION} found but no mpiexec; the multi-process tests are not registered")
else()
  message(STATUS "ember: MPI ${MPI_CXX_VERSION} (${MPIEXEC_EXECUTABLE}): ember::mpi")
endif()
