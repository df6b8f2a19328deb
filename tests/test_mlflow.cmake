# The Python reference reader (mlflow-skinny in the venv that tools/python-env.sh makes).
target_compile_definitions(test_mlflow PRIVATE EMBER_PYTHON_EXE="${EMBER_PYTHON_EXE}")
