# The IDX and CSV readers decompress gzip with zlib; the npy test asks the reference Python's
# numpy for a file.
find_package(ZLIB REQUIRED)
target_link_libraries(test_data PRIVATE ZLIB::ZLIB)
target_compile_definitions(test_data PRIVATE EMBER_TEST_PYTHON="${EMBER_PYTHON_EXE}")
