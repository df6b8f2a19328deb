#!/usr/bin/env bash
# Compile time of ember's headers, in CPU seconds (user + sys) of the compiler: the tracker that
# keeps it from creeping back. Not a ctest test (the figures depend on the machine and its load);
# run it by hand, and compare trees side by side in one run (--baseline), never across runs.
#
#   benchmarks/compile_time.sh                                  this tree alone
#   benchmarks/compile_time.sh --baseline /path/to/other/ember  interleaved with another tree
#   benchmarks/compile_time.sh --runs 5 --no-examples           more runs, only the headline cases
#
# Cases (each file compiled to an object, -c, as a build does; "syntax" is -fsyntax-only):
#   quickstart -O0/-O2, header-only      examples/quickstart/main.cpp as plain g++ compiles it
#   quickstart -O0/-O2, compiled         the same with the compiled library's macro (CMake's default)
#   ember.hpp syntax, header-only/compiled   #include <ember/ember.hpp> alone
#   <example> -O0, compiled              every other examples/*/main.cpp (--no-examples: none)
# A tree from before the compiled library (EMBER_COMPILED_LIB) is measured in its own compiled
# mode (EMBER_CPU_BACKEND_COMPILED). The flags are CMake's on this machine (OpenMP, the BLAS and
# oneDNN macros when the libraries are installed); --cxx picks the compiler. Each case runs
# --runs times (default 3), the trees alternating, and the table shows the median of each and
# their ratio (this tree / baseline). The machine's other load inflates both sides alike.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
baseline=""
runs=3
cxx="${CXX:-g++}"
examples=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --baseline) baseline="$(cd "$2" && pwd)"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --cxx) cxx="$2"; shift 2 ;;
    --no-examples) examples=0; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "compile_time.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if ! [[ -x /usr/bin/time ]]; then
  echo "compile_time.sh: needs /usr/bin/time (Debian: apt-get install time)" >&2
  exit 2
fi

# CMake's definitions for ember's targets on this machine.
flags=(-std=c++20 -fopenmp -DEMBER_HAVE_CBLAS=1)
if [[ -f /usr/include/dnnl.hpp ]]; then
  flags+=(-DEMBER_HAVE_ONEDNN=1 -DEMBER_ONEDNN_GEMM=1)
fi

compiled_macro() {  # the macro of a tree's compiled mode
  if [[ -f "$1/include/ember/src/library_unit.hpp" ]]; then
    echo "-DEMBER_COMPILED_LIB=1"
  else
    echo "-DEMBER_CPU_BACKEND_COMPILED=1"
  fi
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
printf '#include <ember/ember.hpp>\n' > "$work/umbrella.cpp"

# The cases: name|source (relative to the tree)|mode|extra flags
cases=(
  "quickstart -O0, header-only|examples/quickstart/main.cpp|header|-O0"
  "quickstart -O2, header-only|examples/quickstart/main.cpp|header|-O2"
  "quickstart -O0, compiled|examples/quickstart/main.cpp|compiled|-O0"
  "quickstart -O2, compiled|examples/quickstart/main.cpp|compiled|-O2"
  "ember.hpp syntax, header-only|@umbrella|header|-fsyntax-only"
  "ember.hpp syntax, compiled|@umbrella|compiled|-fsyntax-only"
)
if [[ $examples == 1 ]]; then
  for main in "$here"/examples/*/main.cpp; do
    name="$(basename "$(dirname "$main")")"
    [[ $name == quickstart ]] && continue
    cases+=("$name -O0, compiled|examples/$name/main.cpp|compiled|-O0")
  done
fi

# CPU seconds of one compile of a case in a tree; "-" when that tree lacks the file or it fails.
measure() {
  local tree="$1" source="$2" mode="$3" extra="$4"
  local src="$tree/$source"
  [[ $source == @umbrella ]] && src="$work/umbrella.cpp"
  [[ -f $src ]] || { echo "-"; return; }
  local defs=()
  [[ $mode == compiled ]] && defs+=("$(compiled_macro "$tree")")
  local out="-c -o $work/out.o"
  [[ $extra == -fsyntax-only ]] && out=""
  # shellcheck disable=SC2086
  if /usr/bin/time -f "%U %S" -o "$work/time" "$cxx" "${flags[@]}" "${defs[@]}" $extra -I"$tree/include" \
       -I"$tree/examples" "$src" $out 2> "$work/err"; then
    awk '{printf "%.2f", $1 + $2}' "$work/time"
  else
    echo "compile_time.sh: $cxx failed on $src (tree $tree):" >&2
    head -5 "$work/err" >&2
    echo "-"
  fi
}

median() {  # median of the numbers given ("-" when there are none)
  printf '%s\n' "$@" | grep -v '^-$' | sort -g | awk '{v[NR]=$1} END {
    if (NR == 0) print "-"; else if (NR % 2) printf "%.2f", v[(NR + 1) / 2]; else printf "%.2f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

echo "compile_time.sh: $("$cxx" --version | head -1); $runs run(s) per case; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "this tree: $here"
[[ -n $baseline ]] && echo "baseline:  $baseline"
printf '\n%-34s %10s' "case (CPU seconds, median)" "this tree"
[[ -n $baseline ]] && printf ' %10s %7s' "baseline" "ratio"
printf '\n'
for c in "${cases[@]}"; do
  IFS='|' read -r name source mode extra <<< "$c"
  ours=()
  theirs=()
  for ((r = 0; r < runs; ++r)); do
    ours+=("$(measure "$here" "$source" "$mode" "$extra")")
    [[ -n $baseline ]] && theirs+=("$(measure "$baseline" "$source" "$mode" "$extra")")
  done
  m_ours="$(median "${ours[@]}")"
  printf '%-34s %10s' "$name" "$m_ours"
  if [[ -n $baseline ]]; then
    m_theirs="$(median "${theirs[@]}")"
    ratio="-"
    if [[ $m_ours != - && $m_theirs != - ]]; then
      ratio="$(awk -v a="$m_ours" -v b="$m_theirs" 'BEGIN { printf "%.2f", a / b }')"
    fi
    printf ' %10s %7s' "$m_theirs" "$ratio"
  fi
  printf '\n'
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
