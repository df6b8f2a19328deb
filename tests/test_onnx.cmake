# The Python reference (tests/interop/check_onnx.py: onnx's checker and onnxruntime).
target_compile_definitions(test_onnx PRIVATE
  EMBER_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
  EMBER_PYTHON_EXE="${EMBER_PYTHON_EXE}")
