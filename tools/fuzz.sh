#!/usr/bin/env bash
# Builds every libFuzzer target tests/fuzz/fuzz_<name>.cpp with clang++ (AddressSanitizer and
# UndefinedBehaviorSanitizer, no recovery) and runs each for a bounded time over its committed
# seed corpus tests/fuzz/corpus/<name>/ (new inputs go to a scratch copy; the committed corpus is
# never changed). A crash, leak, timeout or sanitizer report fails the run and leaves the input in
# the output folder.
#   bash tools/fuzz.sh [seconds per target, default 30] [name ...]
#   EMBER_FUZZ_OUT=<folder> (default build-fuzz/), EMBER_FUZZ_JOBS=<targets at a time> (default 2)
#   EMBER_FUZZ_OPT=<optimisation> (default -O1, for long runs; CI's short runs use -O0: a target
#   that includes the tensor headers compiles the whole CPU backend, 27 s at -O0 against 90 s at -O1
#   under the sanitizers, and runs about 3x fewer inputs a second)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-30}
shift || true
out=${EMBER_FUZZ_OUT:-build-fuzz}
cxx=${EMBER_FUZZ_CXX:-clang++}
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "fuzz: SKIPPED: $cxx not found (Debian: clang, libclang-rt-14-dev)"
  exit 0
fi
mkdir -p "$out"
targets=()
if (($#)); then
  for n in "$@"; do targets+=("tests/fuzz/fuzz_$n.cpp"); done
else
  shopt -s nullglob
  targets=(tests/fuzz/fuzz_*.cpp)
fi
if ((${#targets[@]} == 0)); then
  echo "fuzz: no targets in tests/fuzz"
  exit 0
fi
# The libraries the readers use; linking one that a target does not need costs nothing.
libs=(-lz -llmdb -lpng -ljpeg -lpthread)
jobs=${EMBER_FUZZ_JOBS:-2}
# One target: build, run, and write its one-line result to $out/fuzz_<name>.result.
fuzz_one() {
  local src=$1 name bin work t0 runs
  name=$(basename "$src" .cpp)
  name=${name#fuzz_}
  bin="$out/fuzz_$name"
  rm -f "$out/fuzz_$name.result"
  if ! "$cxx" -std=c++20 -g "${EMBER_FUZZ_OPT:--O1}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
      -Iinclude "$src" -o "$bin" "${libs[@]}" >"$out/fuzz_$name.build.log" 2>&1; then
    echo "fuzz: $name: FAILED to build ($out/fuzz_$name.build.log)" >"$out/fuzz_$name.result"
    head -30 "$out/fuzz_$name.build.log" >>"$out/fuzz_$name.result"
    return 1
  fi
  work="$out/corpus_$name"
  rm -rf "$work"
  mkdir -p "$work"
  if [[ -d tests/fuzz/corpus/$name ]]; then
    cp -r "tests/fuzz/corpus/$name/." "$work/"
  fi
  t0=$SECONDS
  # -rss_limit_mb: a reader must not allocate what the bytes claim; -timeout: nor spin on them.
  if (cd "$out" && ASAN_OPTIONS=detect_leaks=1 "./fuzz_$name" -max_total_time="$seconds" \
        -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 "corpus_$name" >"fuzz_$name.log" 2>&1); then
    runs=$(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$out/fuzz_$name.log" | grep -o '[0-9]*$' || echo "?")
    echo "fuzz: $name: clean, $runs inputs in $((SECONDS - t0)) s" >"$out/fuzz_$name.result"
  else
    {
      echo "fuzz: $name: FAILED (log and input in $out/)"
      grep -E 'ERROR|SUMMARY|Test unit written' "$out/fuzz_$name.log" | head -20 || true
    } >"$out/fuzz_$name.result"
    return 1
  fi
}
# $jobs targets at a time (each builds on one core, then fuzzes on one core).
for src in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  fuzz_one "$src" &
done
wait || true
failed=0
for src in "${targets[@]}"; do
  name=$(basename "$src" .cpp)
  name=${name#fuzz_}
  if [[ -f $out/fuzz_$name.result ]]; then
    cat "$out/fuzz_$name.result"
    grep -q ': clean,' "$out/fuzz_$name.result" || failed=1
  else
    echo "fuzz: $name: FAILED (no result)"
    failed=1
  fi
done
exit "$failed"
