# Image decoding (libpng, libjpeg-turbo) and packed datasets (liblmdb) for data/images.hpp and
# data/lmdb.hpp. CMake has modules for PNG and JPEG; LMDB is found by name.
find_package(PNG REQUIRED)
find_package(JPEG REQUIRED)
find_library(EMBER_LMDB_LIBRARY NAMES lmdb REQUIRED)
find_path(EMBER_LMDB_INCLUDE_DIR lmdb.h REQUIRED)
target_include_directories(test_data_packed PRIVATE ${EMBER_LMDB_INCLUDE_DIR})
target_link_libraries(test_data_packed PRIVATE PNG::PNG JPEG::JPEG ${EMBER_LMDB_LIBRARY})
