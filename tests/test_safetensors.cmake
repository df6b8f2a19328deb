# Fixtures (tests/interop) and the Python reference for the live interop test.
target_compile_definitions(test_safetensors PRIVATE
  EMBER_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
  EMBER_PYTHON_EXE="${EMBER_PYTHON_EXE}")
