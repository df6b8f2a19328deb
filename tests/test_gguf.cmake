# The Python reference (tests/interop/check_gguf.py: gguf-py, llama.cpp's own GGUF package).
target_compile_definitions(test_gguf PRIVATE
  EMBER_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
  EMBER_PYTHON_EXE="${EMBER_PYTHON_EXE}")
