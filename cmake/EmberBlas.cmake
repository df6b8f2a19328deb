# Finds a BLAS library (OpenBLAS preferred) for ember's CPU matmul and wires it into a target.
#
# Used twice: by ember's own build (EMBER_BLAS_TARGET unset: the `ember_header_only` target of the
# build tree, which ember::ember links) and by the installed emberConfig.cmake (EMBER_BLAS_TARGET =
# ember::header_only), so that the library is found again on the consumer's machine instead of
# being baked into the exported target as an absolute path. Sets EMBER_HAVE_CBLAS to ON or OFF.
#
# ember calls the BLAS through its standard Fortran symbols (sgemm_, dgemm_; see
# backend/cpu/gemm.hpp), so only the library is needed, no cblas.h. EMBER_HAVE_CBLAS=1 is defined
# for every consumer of the target alike, so that every translation unit of a program sees the
# same gemm (no ODR mix). Without a BLAS, ember uses its plain loop GEMM (correct, slower).
if(NOT EMBER_BLAS_TARGET)
  set(EMBER_BLAS_TARGET ember_header_only)
endif()

# Debian and Ubuntu install OpenBLAS built three ways side by side (libopenblas0-pthread, -openmp,
# -serial), and libopenblas.so.0 names the pthread build unless the alternatives say otherwise.
# That build's idle threads spin (sched_yield) after each GEMM beside ember's OpenMP threads (on 2
# cores a transformer step took 2-2.5x as long, docs/performance.md). When ember's kernels use OpenMP (EMBER_BLAS_OPENMP_WANTED,
# set by the includer), the OpenMP build is preferred where it is installed: one thread pool for
# both, as PyTorch has. It is linked by its full path; CMake puts its folder on the build tree's
# RUNPATH, so the loader takes it rather than the alternatives' libopenblas.so.0. A program
# installed elsewhere needs that folder on its RUNPATH too (CMake's INSTALL_RPATH).
# -DEMBER_BLAS_OPENMP=OFF keeps whatever find_package(BLAS) finds.
set(_ember_blas_openmp_lib "")
if(EMBER_BLAS_OPENMP_WANTED AND NOT (DEFINED EMBER_BLAS_OPENMP AND NOT EMBER_BLAS_OPENMP)
   AND NOT DEFINED BLAS_LIBRARIES AND CMAKE_LIBRARY_ARCHITECTURE)
  find_library(EMBER_OPENBLAS_OPENMP_LIBRARY NAMES openblas libopenblas.so.0
               PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp NO_DEFAULT_PATH
               DOC "The OpenMP build of OpenBLAS (Debian: libopenblas0-openmp), preferred when ember uses OpenMP")
  if(EMBER_OPENBLAS_OPENMP_LIBRARY)
    set(_ember_blas_openmp_lib "${EMBER_OPENBLAS_OPENMP_LIBRARY}")
  endif()
endif()

if(_ember_blas_openmp_lib)
  set(BLAS_FOUND TRUE)
  set(BLAS_LIBRARIES "${_ember_blas_openmp_lib}")
  set(EMBER_BLAS_IS_OPENMP ON)
else()
  set(EMBER_BLAS_IS_OPENMP OFF)
  set(_ember_saved_bla_vendor "${BLA_VENDOR}")
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS QUIET)
  if(NOT BLAS_FOUND)
    unset(BLA_VENDOR)
    find_package(BLAS QUIET)
  endif()
  set(BLA_VENDOR "${_ember_saved_bla_vendor}")
  unset(_ember_saved_bla_vendor)
endif()
unset(_ember_blas_openmp_lib)

if(BLAS_FOUND)
  set(EMBER_HAVE_CBLAS ON)
  get_target_property(_ember_blas_imported ${EMBER_BLAS_TARGET} IMPORTED)
  if(_ember_blas_imported)
    # The installed package: the library found here, on the consumer's machine.
    set_property(TARGET ${EMBER_BLAS_TARGET} APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS EMBER_HAVE_CBLAS=1)
    set_property(TARGET ${EMBER_BLAS_TARGET} APPEND PROPERTY INTERFACE_LINK_LIBRARIES "${BLAS_LIBRARIES}")
  else()
    # The build tree: nothing of this is exported (emberConfig.cmake finds the library again).
    target_compile_definitions(${EMBER_BLAS_TARGET} INTERFACE $<BUILD_INTERFACE:EMBER_HAVE_CBLAS=1>)
    target_link_libraries(${EMBER_BLAS_TARGET} INTERFACE "$<BUILD_INTERFACE:${BLAS_LIBRARIES}>")
  endif()
  unset(_ember_blas_imported)
  if(NOT ember_FIND_QUIETLY)
    list(GET BLAS_LIBRARIES 0 _ember_blas_first)
    if(EMBER_BLAS_IS_OPENMP)
      message(STATUS "ember: CPU matmul through BLAS ${_ember_blas_first} (OpenBLAS's OpenMP build)")
    else()
      message(STATUS "ember: CPU matmul through BLAS ${_ember_blas_first}")
    endif()
    unset(_ember_blas_first)
  endif()
else()
  set(EMBER_HAVE_CBLAS OFF)
  message(STATUS "ember: no BLAS found (install libopenblas-dev); CPU matmul uses the plain fallback GEMM")
endif()
