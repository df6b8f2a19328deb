# TFRecord files may be gzip-compressed (zlib); the reference is the PyPI `tfrecord` package, run
# through tests/interop/make_tfrecord_fixtures.py.
find_package(ZLIB REQUIRED)
target_link_libraries(test_data_tfrecord PRIVATE ZLIB::ZLIB)
target_compile_definitions(test_data_tfrecord PRIVATE
  EMBER_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
  EMBER_PYTHON_EXE="${EMBER_PYTHON_EXE}")
