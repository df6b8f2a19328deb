# FindNCCL: locates NCCL (header and library) and reports its version.
#
# Hints, searched first: NCCL_ROOT (CMake or environment variable) = a folder with include/nccl.h
# and lib/ (or lib64/), e.g. the site-packages/nvidia/nccl folder of the nvidia-nccl-cu13 wheel,
# which ships only the versioned libnccl.so.2 (no libnccl.so); then the CUDA toolkit's folders.
# Provides NCCL_FOUND, NCCL_VERSION, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_LIBRARY_DIR and the
# imported target NCCL::nccl.
set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${NCCL_DIR} $ENV{NCCL_DIR})
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}
  PATH_SUFFIXES include
  DOC "Folder of nccl.h")
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
  HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
  PATH_SUFFIXES lib lib64 lib/x64 lib/x86_64-linux-gnu
  DOC "NCCL library (libnccl.so or libnccl.so.2)")
unset(_nccl_hints)

unset(NCCL_VERSION)
if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_v REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  if(_nccl_v MATCHES "NCCL_MAJOR +([0-9]+)")
    set(_nccl_maj ${CMAKE_MATCH_1})
    string(REGEX MATCH "NCCL_MINOR +([0-9]+)" _ "${_nccl_v}")
    set(_nccl_min ${CMAKE_MATCH_1})
    string(REGEX MATCH "NCCL_PATCH +([0-9]+)" _ "${_nccl_v}")
    set(NCCL_VERSION "${_nccl_maj}.${_nccl_min}.${CMAKE_MATCH_1}")
  endif()
  unset(_nccl_v)
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)
if(NCCL_FOUND)
  get_filename_component(NCCL_LIBRARY_DIR "${NCCL_LIBRARY}" DIRECTORY)
  if(NOT TARGET NCCL::nccl)
    add_library(NCCL::nccl UNKNOWN IMPORTED)
    set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  endif()
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
