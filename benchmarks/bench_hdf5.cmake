# bench_hdf5 (a plain main): rows per second reading 70,000 28x28 images from HDF5 by index, HDF5's
# calls alone against data::Hdf5Dataset (its process-wide lock) from 1, 2 and 4 threads. Needs
# HDF5 (cmake/EmberHdf5.cmake) and zlib (Fashion-MNIST's IDX files). Run: ./bench_hdf5
include(EmberHdf5)
find_package(ZLIB QUIET)
if(TARGET ember_hdf5 AND ZLIB_FOUND)
  add_executable(bench_hdf5 ${CMAKE_CURRENT_LIST_DIR}/bench_hdf5.cpp)
  target_link_libraries(bench_hdf5 PRIVATE ember::ember ember_hdf5 ZLIB::ZLIB)
else()
  message(STATUS "ember: bench_hdf5 needs HDF5 (libhdf5-dev) and zlib: not built")
endif()
