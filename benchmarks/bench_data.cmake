# bench_data (a plain main, no Google Benchmark): Fashion-MNIST as PNG files versus LMDB, HDF5 (when
# found: cmake/EmberHdf5.cmake) and TFRecord through data::DataLoader with 0/1/2 workers, and the
# data wait with emulated compute. Needs zlib, libpng, libjpeg and liblmdb; the PyTorch twin is
# bench_data_torch.py (not run by the tests).
find_package(ZLIB QUIET)
find_package(PNG QUIET)
find_package(JPEG QUIET)
find_library(EMBER_LMDB_LIBRARY NAMES lmdb)
find_path(EMBER_LMDB_INCLUDE_DIR lmdb.h)
if(ZLIB_FOUND AND PNG_FOUND AND JPEG_FOUND AND EMBER_LMDB_LIBRARY AND EMBER_LMDB_INCLUDE_DIR)
  add_executable(bench_data ${CMAKE_CURRENT_LIST_DIR}/bench_data.cpp)
  target_include_directories(bench_data PRIVATE ${EMBER_LMDB_INCLUDE_DIR})
  target_link_libraries(bench_data PRIVATE ember::ember ZLIB::ZLIB PNG::PNG JPEG::JPEG ${EMBER_LMDB_LIBRARY})
  include(EmberHdf5)
  if(TARGET ember_hdf5)
    target_link_libraries(bench_data PRIVATE ember_hdf5)
  endif()
else()
  message(STATUS "ember: bench_data needs zlib, libpng, libjpeg and liblmdb: not built")
endif()
