# CMake 3.25 knows no CUDA20 dialect (its NVIDIA-CUDA module stops at C++17), while nvcc 12+
# accepts -std=c++20. ember's CUDA targets carry the compile feature cuda_std_20; this macro
# teaches the current directory scope (and the ones added below it afterwards) that feature.
# It is a macro so that it sets variables in the caller's scope; later CMake versions that know
# the dialect are left alone. Used by EmberCuda.cmake and by the installed emberConfig.cmake.
macro(ember_cuda_std20_workaround)
  if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  if(NOT "cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  endif()
endmacro()
