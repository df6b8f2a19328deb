# ember's package test package.find_wheel_layout: builds, from the cuDNN and NCCL this build found,
# the layout of their Python wheels (nvidia/cudnn/{include,lib}, nvidia/nccl/{include,lib}, with
# only the versioned libcudnn.so.9 / libnccl.so.2, as on the GPU check machine), then checks that
# FindCUDNN.cmake and FindNCCL.cmake find them there through CUDNN_ROOT and NCCL_ROOT. Run with -P:
#   -DBINARY_DIR= -DGENERATOR= -DSOURCE_DIR=<find_wheel project> -DEMBER_CMAKE_DIR=
#   -DCUDNN_INCLUDE_DIR= -DCUDNN_LIBRARY= -DNCCL_INCLUDE_DIR= -DNCCL_LIBRARY=
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${BINARY_DIR}")
set(_site "${BINARY_DIR}/site-packages/nvidia")

function(make_wheel name include_dir library header_glob lib_glob)
  set(_root "${_site}/${name}")
  file(MAKE_DIRECTORY "${_root}/include" "${_root}/lib")
  file(WRITE "${_root}/__init__.py" "")
  file(GLOB _headers "${include_dir}/${header_glob}")
  file(COPY ${_headers} DESTINATION "${_root}/include")
  get_filename_component(_real "${library}" REALPATH)
  get_filename_component(_libdir "${_real}" DIRECTORY)
  file(GLOB _libs "${_libdir}/${lib_glob}")
  set(_n 0)
  foreach(_lib IN LISTS _libs)
    get_filename_component(_fname "${_lib}" NAME)
    if(_fname MATCHES "\\.so\\.[0-9]+$")  # versioned names only, as in the wheels
      file(CREATE_LINK "${_lib}" "${_root}/lib/${_fname}" SYMBOLIC)
      math(EXPR _n "${_n} + 1")
    endif()
  endforeach()
  if(_n EQUAL 0)
    message(FATAL_ERROR "no versioned ${lib_glob} next to ${library}")
  endif()
endfunction()
make_wheel(cudnn "${CUDNN_INCLUDE_DIR}" "${CUDNN_LIBRARY}" "cudnn*.h" "libcudnn*.so.*")
make_wheel(nccl "${NCCL_INCLUDE_DIR}" "${NCCL_LIBRARY}" "nccl*.h" "libnccl.so.*")

execute_process(COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${BINARY_DIR}/build" -G "${GENERATOR}"
                        "-DEMBER_CMAKE_DIR=${EMBER_CMAKE_DIR}" "-DCUDNN_ROOT=${_site}/cudnn" "-DNCCL_ROOT=${_site}/nccl"
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
message("${_out}")
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "FindCUDNN / FindNCCL failed on the wheel layout")
endif()
