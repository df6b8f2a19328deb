# HDF5 datasets (data/hdf5.hpp): HDF5's C library when found (cmake/EmberHdf5.cmake; without it
# every case says SKIPPED), h5py through the Python interpreter for the fixtures and the read-back
# check (tests/interop/hdf5_fixtures.py), and Fashion-MNIST's IDX files for the packing comparison.
include(EmberHdf5)
if(TARGET ember_hdf5)
  target_link_libraries(test_data_hdf5 PRIVATE ember_hdf5)
endif()
target_compile_definitions(test_data_hdf5 PRIVATE
  EMBER_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
  EMBER_PYTHON_EXE="${EMBER_PYTHON_EXE}")
find_package(ZLIB REQUIRED)  # the IDX reader (Fashion-MNIST)
target_link_libraries(test_data_hdf5 PRIVATE ZLIB::ZLIB)
