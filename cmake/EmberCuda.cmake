# Decides whether to build the CUDA backend (EMBER_CUDA = AUTO / ON / OFF) and defines ember::cuda.
# ember::cuda is an INTERFACE target with one INTERFACE source, ember_cuda.cu: every executable
# that links it compiles that file with nvcc, which fills ember's kernel table at start-up.
include(CheckLanguage)
check_language(CUDA)
set(_ember_cuda_missing "")
if(NOT CMAKE_CUDA_COMPILER)
  list(APPEND _ember_cuda_missing "nvcc (CUDA toolkit)")
else()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  if(NOT DEFINED CMAKE_CUDA_RUNTIME_LIBRARY)
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  endif()
  enable_language(CUDA)
  # CMake 3.25 knows no CUDA20 dialect; nvcc 12+ accepts -std=c++20.
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  find_package(CUDAToolkit)
  if(NOT CUDAToolkit_FOUND)
    list(APPEND _ember_cuda_missing "CUDA toolkit libraries")
  endif()
  find_package(CUDNN)
  if(NOT CUDNN_FOUND)
    list(APPEND _ember_cuda_missing "cuDNN 9 (hint: -DCUDNN_ROOT=...)")
  endif()
  find_package(NCCL)
  if(NOT NCCL_FOUND)
    list(APPEND _ember_cuda_missing "NCCL 2 (hint: -DNCCL_ROOT=...)")
  endif()
endif()

if(_ember_cuda_missing)
  if(EMBER_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ember: EMBER_CUDA=ON but missing: ${_ember_cuda_missing}")
  endif()
  message(STATUS "ember: CUDA backend off; missing: ${_ember_cuda_missing}")
  return()
endif()

set(EMBER_HAVE_CUDA ON)
message(STATUS "ember: CUDA ${CUDAToolkit_VERSION}, cuDNN ${CUDNN_VERSION} (${CUDNN_LIBRARY}), "
               "NCCL ${NCCL_VERSION} (${NCCL_LIBRARY}), architectures ${CMAKE_CUDA_ARCHITECTURES}")
# ember::cuda_deps: the CUDA libraries and flags alone (for a project that compiles ember_cuda.cu
# once into a library of its own, as ember's tests do).
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
  $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include/ember/backend/cuda/ember_cuda.cu>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/ember/backend/cuda/ember_cuda.cu>)
