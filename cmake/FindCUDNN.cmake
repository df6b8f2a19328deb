# FindCUDNN: locates cuDNN (header and library) and reports its version.
#
# Hints, searched first: CUDNN_ROOT (CMake or environment variable) = a folder with include/cudnn.h
# and lib/ (or lib64/), e.g. the site-packages/nvidia/cudnn folder of the nvidia-cudnn-cu13 wheel,
# which ships only the versioned libcudnn.so.9 (no libcudnn.so); then the CUDA toolkit's folders.
# Provides CUDNN_FOUND, CUDNN_VERSION, CUDNN_INCLUDE_DIR, CUDNN_LIBRARY, CUDNN_LIBRARY_DIR and the
# imported target CUDNN::cudnn. cuDNN 9 loads its sub-libraries (libcudnn_graph.so.9, ...) from
# the library's folder at run time: put CUDNN_LIBRARY_DIR on LD_LIBRARY_PATH if it is not a system one.
set(_cudnn_hints ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDNN_DIR} $ENV{CUDNN_DIR})
find_path(CUDNN_INCLUDE_DIR cudnn.h
  HINTS ${_cudnn_hints} ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}
  PATH_SUFFIXES include include/x86_64-linux-gnu
  DOC "Folder of cudnn.h")
find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 libcudnn.so.8 NAMES_PER_DIR
  HINTS ${_cudnn_hints} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
  PATH_SUFFIXES lib lib64 lib/x64 lib/x86_64-linux-gnu
  DOC "cuDNN library (libcudnn.so or libcudnn.so.<major>)")
unset(_cudnn_hints)

unset(CUDNN_VERSION)
foreach(_cudnn_h cudnn_version.h cudnn.h)
  if(CUDNN_INCLUDE_DIR AND EXISTS "${CUDNN_INCLUDE_DIR}/${_cudnn_h}")
    file(STRINGS "${CUDNN_INCLUDE_DIR}/${_cudnn_h}" _cudnn_v REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
    if(_cudnn_v MATCHES "CUDNN_MAJOR +([0-9]+)")
      set(_cudnn_maj ${CMAKE_MATCH_1})
      string(REGEX MATCH "CUDNN_MINOR +([0-9]+)" _ "${_cudnn_v}")
      set(_cudnn_min ${CMAKE_MATCH_1})
      string(REGEX MATCH "CUDNN_PATCHLEVEL +([0-9]+)" _ "${_cudnn_v}")
      set(CUDNN_VERSION "${_cudnn_maj}.${_cudnn_min}.${CMAKE_MATCH_1}")
      break()
    endif()
  endif()
endforeach()
unset(_cudnn_v)
unset(_cudnn_h)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR VERSION_VAR CUDNN_VERSION)
if(CUDNN_FOUND)
  get_filename_component(CUDNN_LIBRARY_DIR "${CUDNN_LIBRARY}" DIRECTORY)
  if(NOT TARGET CUDNN::cudnn)
    add_library(CUDNN::cudnn UNKNOWN IMPORTED)
    set_target_properties(CUDNN::cudnn PROPERTIES IMPORTED_LOCATION "${CUDNN_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
  endif()
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
