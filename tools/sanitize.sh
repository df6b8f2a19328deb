#!/usr/bin/env bash
# The CPU test suite under the sanitizers:
#   bash tools/sanitize.sh asan  [ctest -R regex]  every CPU test area built with AddressSanitizer +
#                                                  UndefinedBehaviorSanitizer (-fno-sanitize-recover:
#                                                  the first report fails the test), then ctest
#   bash tools/sanitize.sh tsan  [ctest -R regex]  the threaded test areas and ddp_train's thread
#                                                  ranks under ThreadSanitizer, over the default
#                                                  build's oneDNN path, g++ with ember's OpenMP off
#   bash tools/sanitize.sh tsan-openmp [regex]     the same with OpenMP on everywhere: clang++ and
#                                                  LLVM's libomp, which ThreadSanitizer understands,
#                                                  hosting ember's, oneDNN's and OpenBLAS's threads
# (docs/architecture.md, "Threads and oneDNN", says what each checks and what it cannot.)
# Build folders: build-asan, build-tsan, build-tsan-openmp (EMBER_SANITIZE_BUILD_DIR overrides).
# CPU only (the CUDA runtime is not instrumented and there is no GPU here); no benchmarks, header
# or package tests: those compile the same headers. Of the examples, the TSan modes run only
# ddp_train's thread ranks (the others would train for minutes at sanitizer speed). Threads for
# the build: EMBER_JOBS (default 2).
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
# Trainer's cancel token, two trainings at once (test_threads), fully sharded ranks and their
# sharded checkpoints.
# EMBER_SANITIZE_AREAS="test_a test_b" narrows either mode to those areas (.ci/run does, for time).
tsan_areas=(test_threads test_data_loader test_data_parallel test_checkpoint_manager test_device_monitor
            test_profiler test_trainer test_fsdp test_sharded_checkpoint)
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
    example_labels=()
    test_env=()
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
    # Two ember threads, so that the fp32 convolutions take oneDNN as they do on any machine with
    # more than one core (backend/cpu/conv.hpp); OMP_NUM_THREADS=1 keeps libdnnl's own OpenMP
    # regions (libgomp, not instrumented) on the calling thread; OpenBLAS's pthreads pool starts at
    # one thread (ember gives it EMBER_NUM_THREADS; its workers touch ember's buffers only in
    # uninstrumented kernels, so TSan sees none of those accesses).
    export EMBER_NUM_THREADS=2 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
    test_env=()
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tools/sanitize/tsan.supp}
    ;;
  tsan-openmp)
    # The default build's threading whole: ember's parallel_for, oneDNN's and OpenBLAS's OpenMP
    # regions on several threads. GCC's libgomp is invisible to TSan, LLVM's libomp is not: ember
    # is built with clang++ -fopenmp=libomp, and libdnnl and OpenBLAS's OpenMP build, which were
    # linked against libgomp, find libomp under libgomp's name (a link in the build folder on
    # LD_LIBRARY_PATH; libomp implements libgomp's entry points for this). Archer, libomp's TSan
    # tool, is loaded when installed (Debian: libomp-14-dev).
    build=${EMBER_SANITIZE_BUILD_DIR:-build-tsan-openmp}
    cxx=${EMBER_SANITIZE_CXX:-clang++}
    command -v "$cxx" >/dev/null || { echo "sanitize tsan-openmp: $cxx not found (Debian: clang, libomp-14-dev)" >&2; exit 1; }
    # LLVM's lib folder beside the compiler (Debian: /usr/lib/llvm-14/lib).
    libomp=$(readlink -f "$(dirname "$(readlink -f "$(command -v "$cxx")")")/../lib/libomp.so" || true)
    [[ -f $libomp ]] || { echo "sanitize tsan-openmp: $cxx has no libomp (Debian: libomp-14-dev)" >&2; exit 1; }
    flags="-fsanitize=thread -fno-omit-frame-pointer -g1"
    extra=(-DCMAKE_CXX_COMPILER="$cxx" -DEMBER_BUILD_EXAMPLES=ON)
    mkdir -p "$build/libgomp-is-libomp"
    ln -sf "$libomp" "$build/libgomp-is-libomp/libgomp.so.1"
    shim=$(cd "$build/libgomp-is-libomp" && pwd)
    test_env=("LD_LIBRARY_PATH=$shim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")  # for the tests only
    archer="$(dirname "$libomp")/libarcher.so"
    [[ -f $archer ]] && test_env+=("OMP_TOOL_LIBRARIES=$archer")
    # Two threads everywhere (ember gives OpenBLAS its count). ignore_noninstrumented_modules:
    # libomp's own locks are not instrumented (Archer asks for it); TSan then also ignores what
    # libdnnl, OpenBLAS and libomp do through its interceptors (memset, malloc), and still checks
    # every access of ember's, on every thread, OpenMP's workers included.
    export EMBER_NUM_THREADS=2 OMP_NUM_THREADS=2
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$PWD/tools/sanitize/tsan.supp}
    ;;
  *)
    echo "usage: bash tools/sanitize.sh asan|tsan|tsan-openmp [ctest -R regex]" >&2
    exit 2
    ;;
esac
if [[ $mode == tsan* ]]; then
  targets=()
  for area in "${tsan_areas[@]}"; do
    [[ -f tests/$area.cpp ]] && targets+=("$area")
  done
  # ddp_train's thread ranks (DataParallel + Adam, ZeRO-1, a failing rank): a CNN whose
  # convolutions, pooling and GEMMs run on every rank's thread at once. Their ctest entries carry
  # the label example_threads (examples/CMakeLists.txt).
  examples=(ddp_train)
  example_labels=(example_threads)
fi

# Optimisation: the tests at -O0 and the compiled CPU backend at -O1 (-O3 elsewhere). Instrumented
# code is slow to compile, and the more so the more it is optimised: on 2 cores the four areas of
# .ci/run's ASan phase took 505 s to build at -O1 / -O3 and run in seconds either
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
  # ctest only the areas built (their labels are their names) and the examples' runs.
  labels=("${targets[@]}" "${example_labels[@]}")
  label=$(IFS='|'; echo "^(${labels[*]})\$")
  ctest_args=(-L "$label")
else
  cmake --build "$build" -j"$jobs"
  ctest_args=()
fi
built=$((SECONDS - start))
[[ -n $regex ]] && ctest_args+=(-R "$regex")
status=0
env "${test_env[@]}" ctest --test-dir "$build" --output-on-failure -j"$jobs" "${ctest_args[@]}" || status=$?
echo "sanitize $mode: $( ((status == 0)) && echo clean || echo FAILED ); build ${built}s, total $((SECONDS - start))s"
exit "$status"
