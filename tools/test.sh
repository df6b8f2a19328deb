#!/usr/bin/env bash
# Builds ember and runs its whole test suite: the README's test command.
#   bash tools/test.sh
# Extra CMake arguments come from EMBER_CMAKE_ARGS (split on spaces), e.g.
#   EMBER_CMAKE_ARGS="-DEMBER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90" bash tools/test.sh
# EMBER_BUILD_DIR (default: build) and EMBER_JOBS (default: 2) change the folder and parallelism.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# On a fresh machine this is all the set-up there is: install what is missing (idempotent, and
# instant when everything is there), and find a CUDA toolkit installed in the usual place.
bash tools/install-deps.sh
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

# The Python reference packages (numpy, safetensors, tensorboard) for the interoperability tests,
# in a virtual environment; without them those tests report themselves skipped.
python=$(bash tools/python-env.sh | tail -n 1)

build=${EMBER_BUILD_DIR:-build}
jobs=${EMBER_JOBS:-2}
extra=()
if [[ -n ${EMBER_CMAKE_ARGS:-} ]]; then
  read -r -a extra <<<"$EMBER_CMAKE_ARGS"
fi

# Each step says how long it took (the build and the suite are most of CI's time).
t0=$SECONDS
set -x
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DEMBER_PYTHON=$python" "${extra[@]}"
{ set +x; } 2>/dev/null
echo "test.sh: configure took $((SECONDS - t0)) s"
t0=$SECONDS
set -x
cmake --build "$build" -j"$jobs"
{ set +x; } 2>/dev/null
echo "test.sh: build took $((SECONDS - t0)) s"
t0=$SECONDS
set -x
ctest --test-dir "$build" --output-on-failure -j"$jobs"
{ set +x; } 2>/dev/null
echo "test.sh: ctest took $((SECONDS - t0)) s"
