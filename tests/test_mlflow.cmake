# The Python reference reader (tests/interop/read_mlflow_run.py: mlflow-skinny's MlflowClient, in
# the venv that tools/python-env.sh makes).
target_compile_definitions(test_mlflow PRIVATE
  EMBER_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
  EMBER_PYTHON_EXE="${EMBER_PYTHON_EXE}")
