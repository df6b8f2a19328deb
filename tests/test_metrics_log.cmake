# The Python reference reader (the tensorboard package in the venv that tools/python-env.sh makes).
target_compile_definitions(test_metrics_log PRIVATE EMBER_PYTHON_EXE="${EMBER_PYTHON_EXE}")
