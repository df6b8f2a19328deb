# The Python reference (tests/interop/check_triton.py: tritonclient's ModelConfig schema, onnx and onnxruntime).
target_compile_definitions(test_triton PRIVATE
  EMBER_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
  EMBER_PYTHON_EXE="${EMBER_PYTHON_EXE}")
