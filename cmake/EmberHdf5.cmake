# HDF5 (optional) for ember's HDF5 datasets (include/ember/data/hdf5.hpp, header-only: whoever
# includes it links HDF5's C library, as with LMDB; ember::ember does not). When the C library is
# found, the interface target ember_hdf5 carries it and EMBER_HAVE_HDF5=1; the tests, pack_dataset
# and bench_hdf5 link it where it exists. Found by name (FindHDF5 needs the C language enabled,
# which ember, a C++ project, does not); Debian's serial build lives under hdf5/serial.
# Included from several folders: once.
include_guard(GLOBAL)
find_path(EMBER_HDF5_INCLUDE_DIR hdf5.h PATH_SUFFIXES hdf5/serial)
find_library(EMBER_HDF5_LIBRARY NAMES hdf5_serial hdf5 PATH_SUFFIXES hdf5/serial)
if(EMBER_HDF5_INCLUDE_DIR AND EMBER_HDF5_LIBRARY)
  add_library(ember_hdf5 INTERFACE)
  target_include_directories(ember_hdf5 INTERFACE ${EMBER_HDF5_INCLUDE_DIR})
  target_link_libraries(ember_hdf5 INTERFACE ${EMBER_HDF5_LIBRARY})
  target_compile_definitions(ember_hdf5 INTERFACE EMBER_HAVE_HDF5=1)
  message(STATUS "ember: HDF5 found (${EMBER_HDF5_LIBRARY}): HDF5 datasets on")
else()
  message(STATUS "ember: HDF5 not found (Debian: libhdf5-dev): HDF5 datasets off")
endif()
