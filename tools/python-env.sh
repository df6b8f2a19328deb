#!/usr/bin/env bash
# Makes (idempotently) the Python virtual environment that ember's interoperability tests use:
# the ecosystem's reference implementations, from PyPI (numpy, safetensors, tensorboard's event
# reader, onnx's checker and onnxruntime, gguf-py's reader, h5py, the tfrecord reader with crc32c,
# MLflow's client (mlflow-skinny) and Triton's model-config schema (tritonclient[grpc])). No
# PyTorch: the tests never need it.
# Prints the environment's python on the last line.
#   bash tools/python-env.sh            (EMBER_VENV=~/.cache/ember/venv by default)
# Without network or PyPI it prints a warning and the system python3; the tests that need a
# package then say "SKIPPED: <package> not importable" and ctest counts them as skipped.
set -uo pipefail
venv=${EMBER_VENV:-${HOME:-/tmp}/.cache/ember/venv}
packages=(numpy safetensors tensorboard onnx onnxruntime gguf h5py tfrecord crc32c mlflow-skinny 'tritonclient[grpc]')
want="${packages[*]}"
stamp="$venv/.ember-packages"
if [[ -x $venv/bin/python && -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
  echo "$venv/bin/python"
  exit 0
fi
if python3 -m venv "$venv" >&2 && "$venv/bin/python" -m pip install -q --disable-pip-version-check "${packages[@]}" >&2; then
  echo "$want" >"$stamp"
  echo "$venv/bin/python"
else
  echo "python-env: could not install ${want} into $venv; the interoperability tests will be skipped" >&2
  command -v python3
fi
