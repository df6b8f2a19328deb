# Decides whether to build the CUDA backend (EMBER_CUDA = AUTO / ON / OFF) and defines
# ember::cuda_deps and ember::cuda. Included by the top-level CMakeLists.txt; sets EMBER_HAVE_CUDA.
#
# ember::cuda_deps: the CUDA runtime, cuBLAS/cuBLASLt, cuDNN and NCCL, and the CUDA C++20 dialect,
#   for a project that compiles include/ember/backend/cuda/ember_cuda.cu once into a library of its
#   own (as ember's tests do).
# ember::cuda: ember::cuda_deps plus ember_cuda.cu as an INTERFACE source: every executable that
#   links it compiles that file with nvcc, which fills ember's kernel table at start-up.
include(CheckLanguage)
include(EmberCudaStd)

set(_ember_cuda_missing "")
set(_ember_cuda_source "${CMAKE_CURRENT_SOURCE_DIR}/include/ember/backend/cuda/ember_cuda.cu")
get_property(_ember_enabled_languages GLOBAL PROPERTY ENABLED_LANGUAGES)

if(NOT EMBER_IS_TOP_LEVEL AND NOT "CUDA" IN_LIST _ember_enabled_languages)
  # A language enabled in a subdirectory is unusable in its parent, where the consumer's targets
  # that link ember::cuda live: the consumer must enable CUDA itself, before add_subdirectory(ember).
  list(APPEND _ember_cuda_missing
       "CUDA enabled by the parent project (project(<name> LANGUAGES CXX CUDA) before add_subdirectory(ember))")
else()
  if(NOT CMAKE_CUDA_COMPILER)
    check_language(CUDA)
  endif()
  if(NOT CMAKE_CUDA_COMPILER)
    list(APPEND _ember_cuda_missing "nvcc (CUDA toolkit: put nvcc on PATH or set CMAKE_CUDA_COMPILER)")
  endif()
endif()

if(NOT _ember_cuda_missing AND NOT EXISTS "${_ember_cuda_source}")
  list(APPEND _ember_cuda_missing "include/ember/backend/cuda/ember_cuda.cu (the CUDA backend source)")
endif()

if(NOT _ember_cuda_missing)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
    # `native` fails on a machine without a GPU; these are the data-centre GPUs ember targets.
    set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures to compile for")
  endif()
  if(NOT DEFINED CMAKE_CUDA_RUNTIME_LIBRARY)
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  endif()
  if(NOT "CUDA" IN_LIST _ember_enabled_languages)
    enable_language(CUDA)
  endif()
  ember_cuda_std20_workaround()
  if(NOT EMBER_IS_TOP_LEVEL)
    # The consumer's targets that link ember::cuda are compiled in the parent directory.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "${CMAKE_CUDA20_STANDARD_COMPILE_OPTION}" PARENT_SCOPE)
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "${CMAKE_CUDA20_EXTENSION_COMPILE_OPTION}" PARENT_SCOPE)
    set(CMAKE_CUDA_COMPILE_FEATURES "${CMAKE_CUDA_COMPILE_FEATURES}" PARENT_SCOPE)
  endif()

  find_package(CUDAToolkit)
  if(NOT CUDAToolkit_FOUND)
    list(APPEND _ember_cuda_missing "CUDA toolkit libraries (cudart, cuBLAS)")
  elseif(NOT TARGET CUDA::cublasLt)
    list(APPEND _ember_cuda_missing "cuBLASLt")
  endif()
  find_package(CUDNN 9)
  if(NOT CUDNN_FOUND)
    list(APPEND _ember_cuda_missing "cuDNN 9 (hint: -DCUDNN_ROOT=<folder with include/cudnn.h and lib/>)")
  endif()
  find_package(NCCL 2)
  if(NOT NCCL_FOUND)
    list(APPEND _ember_cuda_missing "NCCL 2 (hint: -DNCCL_ROOT=<folder with include/nccl.h and lib/>)")
  endif()
endif()

if(_ember_cuda_missing)
  list(JOIN _ember_cuda_missing "; " _ember_cuda_missing)
  if(EMBER_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ember: EMBER_CUDA=ON but missing: ${_ember_cuda_missing}")
  endif()
  message(STATUS "ember: CUDA backend off; missing: ${_ember_cuda_missing}")
  return()
endif()

set(EMBER_HAVE_CUDA ON)
message(STATUS "ember: CUDA ${CUDAToolkit_VERSION} (${CMAKE_CUDA_COMPILER}), cuDNN ${CUDNN_VERSION} (${CUDNN_LIBRARY}), "
               "NCCL ${NCCL_VERSION} (${NCCL_LIBRARY}), architectures ${CMAKE_CUDA_ARCHITECTURES}")

add_library(ember_cuda_deps INTERFACE)
add_library(ember::cuda_deps ALIAS ember_cuda_deps)
set_target_properties(ember_cuda_deps PROPERTIES EXPORT_NAME cuda_deps)
target_link_libraries(ember_cuda_deps INTERFACE ember CUDA::cudart CUDA::cublas CUDA::cublasLt CUDNN::cudnn NCCL::nccl)
target_compile_options(ember_cuda_deps INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
target_compile_features(ember_cuda_deps INTERFACE cuda_std_20)

add_library(ember_cuda INTERFACE)
add_library(ember::cuda ALIAS ember_cuda)
set_target_properties(ember_cuda PROPERTIES EXPORT_NAME cuda)
target_link_libraries(ember_cuda INTERFACE ember_cuda_deps)
target_sources(ember_cuda INTERFACE
  $<BUILD_INTERFACE:${_ember_cuda_source}>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/ember/backend/cuda/ember_cuda.cu>)
