#!/usr/bin/env bash
# The CPU test suite under the sanitizers (issue 14):
#   bash tools/sanitize.sh asan  [ctest -R regex]  every CPU test area built with AddressSanitizer +
#                                                  UndefinedBehaviorSanitizer (-fno-sanitize-recover:
#                                                  the first report fails the test), then ctest
#   bash tools/sanitize.sh tsan  [ctest -R regex]  the threaded test areas and ddp_train's thread
#                                                  ranks under ThreadSanitizer, over the default
#                                                  build's oneDNN path (see the tsan case below)
# Build folders: build-asan, build-tsan (EMBER_SANITIZE_BUILD_DIR overrides). CPU only (the CUDA
# runtime is not instrumented and there is no GPU here), no examples, benchmarks, header or
# package tests: those compile the same headers, and the examples' ctest entries would train
# for minutes at sanitizer speed. Threads for the build: EMBER_JOBS (default 2).
# Suppressions (tools/sanitize/*.supp) name third-party libraries only, never ember.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mode=${1:-}
shift || true
regex=${1:-}
jobs=${EMBER_JOBS:-2}
python=/root/.cache/ember/venv/bin/python
[[ -x $python ]] || python=$(command -v python3)

# The test areas that start threads: ThreadProcessGroup ranks, the data loader's workers, the
# asynchronous checkpoint writer, the device monitor's sampler, the profiler across threads, the
# Trainer's cancel token, and two trainings at once (test_threads).
# EMBER_SANITIZE_AREAS="test_a test_b" narrows either mode to those areas (.ci/run does, for time).
tsan_areas=(test_threads test_data_loader test_data_parallel test_checkpoint_manager test_device_monitor
            test_profiler test_trainer)
if [[ -n ${EMBER_SANITIZE_AREAS:-} ]]; then
  read -r -a tsan_areas <<<"$EMBER_SANITIZE_AREAS"
fi

case $mode in
  asan)
    build=${EMBER_SANITIZE_BUILD_DIR:-build-asan}
    flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g1"
    extra=()
    targets=()  # every test area, unless EMBER_SANITIZE_AREAS names some
    examples=()
    example_tests=""
    if [[ -n ${EMBER_SANITIZE_AREAS:-} ]]; then
      read -r -a targets <<<"$EMBER_SANITIZE_AREAS"
    fi
    # allocator_may_return_null: an absurd allocation returns null, as without ASan, and ember raises
    # OutOfMemory (tests/test_size_overflow.cpp checks that); by default ASan stops the program.
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:fast_unwind_on_malloc=0:allocator_may_return_null=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tools/sanitize/lsan.supp}
    ;;
  tsan)
    build=${EMBER_SANITIZE_BUILD_DIR:-build-tsan}
    flags="-fsanitize=thread -fno-omit-frame-pointer -g1"
    # ember's own OpenMP is off: GCC's libgomp is not instrumented, so TSan cannot see its team
    # barriers and would report every parallel_for. oneDNN stays on, as in every default build
    # (EMBER_SANITIZE_ONEDNN=OFF turns it off, for the im2col + BLAS path); docs/architecture.md,
    # "Threads and oneDNN", has what this checks and what it cannot.
    extra=(-DEMBER_OPENMP=OFF -DEMBER_BUILD_EXAMPLES=ON)
    [[ ${EMBER_SANITIZE_ONEDNN:-ON} == OFF ]] && extra+=(-DEMBER_ONEDNN=OFF)
    targets=()
    for area in "${tsan_areas[@]}"; do
      [[ -f tests/$area.cpp ]] && targets+=("$area")
    done
    # ddp_train's thread ranks (DataParallel + Adam, ZeRO-1, a failing rank): a CNN whose
    # convolutions, pooling and GEMMs run on every rank's thread at once.
    examples=(ddp_train)
    example_tests='^example\.ddp_train\.(smoke|zero|rank_failure)$'
    # Two ember threads, so that the fp32 convolutions take oneDNN as they do on any machine with
    # more than one core (backend/cpu/conv.hpp); OMP_NUM_THREADS=1 keeps libdnnl's own OpenMP
    # regions (libgomp, not instrumented) on the calling thread; OpenBLAS's pthreads pool starts at
    # one thread (ember gives it EMBER_NUM_THREADS; its workers touch ember's buffers only in
    # uninstrumented kernels, so TSan sees none of those accesses).
    export EMBER_NUM_THREADS=2 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tools/sanitize/tsan.supp}
    ;;
  *)
    echo "usage: bash tools/sanitize.sh asan|tsan [ctest -R regex]" >&2
    exit 2
    ;;
esac

# Optimisation: the tests at -O0 and the compiled CPU backend at -O1 (-O3 elsewhere). Instrumented
# code is slow to compile, and the more so the more it is optimised: on 2 cores the four areas of
# .ci/run's ASan phase took 505 s to build at -O1 / -O3 (2026-12-02) and run in seconds either
# way. The sanitizers find the same errors at -O0 (ASan's reports are, if anything, more precise).
start=$SECONDS
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBER_CUDA=OFF -DEMBER_MPI=OFF \
  -DEMBER_BUILD_EXAMPLES=OFF -DEMBER_BUILD_BENCHMARKS=OFF -DEMBER_HEADER_TESTS=OFF -DEMBER_PACKAGE_TESTS=OFF \
  -DEMBER_TEST_OPT=-O0 "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" \
  "-DEMBER_PYTHON=$python" "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=$flags" \
  "-DCMAKE_SHARED_LINKER_FLAGS=$flags" "${extra[@]}" >"$build.configure.log" 2>&1 || {
  cat "$build.configure.log"
  exit 1
}
if ((${#targets[@]})); then
  cmake --build "$build" -j"$jobs" --target "${targets[@]}" "${examples[@]}"
  # ctest only the areas built (their labels are their names).
  label=$(IFS='|'; echo "^(${targets[*]})\$")
  ctest_args=(-L "$label")
else
  cmake --build "$build" -j"$jobs"
  ctest_args=()
fi
built=$((SECONDS - start))
[[ -n $regex ]] && ctest_args+=(-R "$regex")
status=0
ctest --test-dir "$build" --output-on-failure -j"$jobs" "${ctest_args[@]}" || status=$?
# The examples' runs (their own ctest entries), unless a regex narrowed the run.
if [[ -n $example_tests && -z $regex ]]; then
  ctest --test-dir "$build" --output-on-failure -j"$jobs" -R "$example_tests" || status=$?
fi
echo "sanitize $mode: $( ((status == 0)) && echo clean || echo FAILED ); build ${built}s, total $((SECONDS - start))s"
exit "$status"
