#!/usr/bin/env bash
# ember's GPU check (docs/gpu-status.md says how to run it and what each step costs). The GPU
# machine (one H200) is lent for minutes: one command runs at most 10 minutes, at most 8 files come
# back from $OUT, and the last 12,000 characters printed. So this script
#   - has a deadline (EMBER_GPU_DEADLINE, default 520 s from its start), checked before each step:
#     a step gets at most the time left, a step that cannot fit is skipped, and the table is printed
#     in every case (also on SIGTERM/SIGINT, from a trap);
#   - runs the steps in the order of information per minute: device report; build the GPU targets
#     only (the CMake target ember_gpu); test_backend_parity alone; the other tests labelled `gpu`;
#     the PyTorch twin, then the `_cuda` benchmark cases (3 repetitions); the one-rank all-reduce
#     with a small maximum size; the CPU suite only with the time left; the table;
#   - keeps every log under <build>/gpu-check/ and writes at most 7 files to $OUT: summary.txt (the
#     table), versions.txt, failures.txt (the failed tests' output, cut), one ratio file per
#     PyTorch-twinned program (bench_core.ratios.txt, bench_layers.ratios.txt) and logs.tar.gz.
#
# Modes:
#   bash tools/gpu-check.sh            on the GPU machine, from the repository root
#   bash tools/gpu-check.sh --prepare  here, before a device run: makes .device-deps (Catch2,
#       Google Benchmark, nlohmann-json, libpng, libjpeg, LMDB, zlib headers: what the machine lacks) and
#       .device-data (the digits CSV, the license texts, Fashion-MNIST, and the commit in
#       .device-data/commit, since no .git travels); carry both
#   bash tools/gpu-check.sh --dry-run  on a machine without a GPU (CI does this): cuDNN and NCCL laid
#       out as their Python wheels lay them out, BLAS and MPI off, the prefix made by --prepare; every
#       step runs in its no-GPU form (or is listed with what it would run), and the run fails if a
#       build breaks, the table is not reached, or the file or time limits are not kept
#
# Environment: OUT (default ./gpu-check-out), EMBER_GPU_BUILD_DIR (build-gpu; dry run: build-gpu-dry),
# EMBER_GPU_JOBS (all cores), EMBER_GPU_DEADLINE (seconds, 520), EMBER_GPU_PYTHON (the Python with
# PyTorch; default: python3 on PATH), EMBER_TEST_TIMEOUT (per test, 120),
# EMBER_GPU_SANITIZE (compute-sanitizer tools to run the gpu tests under, e.g. "memcheck racecheck";
# default none) and EMBER_GPU_SANITIZE_SECONDS (240),
# EMBER_BENCH_TIMEOUT (per benchmark program, 90), EMBER_GPU_BENCH_PROGRAMS (the benchmark programs
# to run, space-separated; default all), EMBER_ALLREDUCE_MAX_BYTES (16M), CUDNN_ROOT /
# NCCL_ROOT (skip the search), EMBER_CMAKE_ARGS (extra configure arguments), and the data paths
# EMBER_DIGITS_CSV, EMBER_TEXT_DIR, EMBER_FASHION_MNIST_DIR (default: .device-data when carried).
set -u -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
root=$PWD
script_start=$SECONDS

mode=gpu
case ${1:-} in
  "") ;;
  --dry-run) mode=dry ;;
  --prepare) mode=prepare ;;
  -h | --help) sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: bash tools/gpu-check.sh [--dry-run | --prepare]" >&2; exit 2 ;;
esac

# ================================================================ --prepare (on this machine)
# Copies a Debian package's files (keeping their /usr-relative paths) into a CMake prefix.
copy_package() { # copy_package PKG DEST
  local f
  dpkg -L "$1" 2>/dev/null | while read -r f; do
    [[ -f $f && $f == /usr/* && $f != /usr/share/doc/* && $f != /usr/share/man/* ]] || continue
    mkdir -p "$2/${f%/*}" && cp -a "$f" "$2/$f"
  done
}
prepare() { # prepare DEPS_DIR DATA_DIR
  local deps=$1 data=$2 pkg
  rm -rf "$deps" "$data"
  mkdir -p "$deps" "$data"
  for pkg in catch2 libbenchmark-dev libbenchmark1debian nlohmann-json3-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || { echo "prepare: Debian package $pkg is not installed" >&2; return 1; }
    copy_package "$pkg" "$deps"
  done
  # What the data tests and examples find with REQUIRED (tests/test_data_*.cmake): the headers and
  # Debian's own libraries (libjpeg.so.62 is not Ubuntu's libjpeg.so.8; the programs load these
  # through CMake's build RPATH, nothing else sees them).
  for pkg in libpng-dev libpng16-16 libjpeg62-turbo-dev libjpeg62-turbo liblmdb-dev liblmdb0; do
    if dpkg -s "$pkg" >/dev/null 2>&1; then copy_package "$pkg" "$deps"; else echo "prepare: $pkg not installed: not carried"; fi
  done
  # zlib: headers only, and libz.so pointing at the machine's own libz.so.1 (every Ubuntu has it):
  # no second libz is shipped to shadow the system's one.
  mkdir -p "$deps/usr/include" "$deps/usr/lib"
  cp -a /usr/include/zlib.h /usr/include/zconf.h "$deps/usr/include/"
  ln -sfn /lib/x86_64-linux-gnu/libz.so.1 "$deps/usr/lib/libz.so"
  cp -a "$deps"/usr/. "$deps"/ && rm -rf "${deps:?}"/usr
  # Debian keeps some headers in the multiarch folder (libjpeg-turbo's jconfig.h, which defines
  # JPEG_LIB_VERSION): put them beside the rest, or jpeglib.h from the prefix picks up the GPU
  # machine's own /usr/include/x86_64-linux-gnu/jconfig.h (Ubuntu's libjpeg 8) and the library
  # carried (62) refuses the caller ("Wrong JPEG library version", seen on the H200 machine).
  local multiarch
  for multiarch in "$deps"/include/*-linux-gnu; do
    [[ -d $multiarch ]] && cp -a "$multiarch"/. "$deps"/include/
  done
  # The data the examples read from Debian packages here (docs/gpu-status.md).
  local digits=/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz
  [[ -f $digits ]] && cp -a "$digits" "$data/digits.csv.gz"
  [[ -d /usr/share/common-licenses ]] && cp -aL /usr/share/common-licenses "$data/licenses"
  [[ -d /usr/share/datasets/fashion-mnist ]] && cp -aL /usr/share/datasets/fashion-mnist "$data/fashion-mnist"
  local commit
  if commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null); then
    git -C "$root" diff --quiet HEAD -- 2>/dev/null || commit="$commit+local-changes"
    echo "$commit $(git -C "$root" log -1 --format=%cd --date=iso-strict 2>/dev/null)" >"$data/commit"
  fi
  # What configure REQUIRES that the GPU machine may lack (it has no Debian -dev packages).
  local missing
  missing=$(grep -rhoE 'find_package\([A-Za-z_0-9]+[^)]*REQUIRED' --include=CMakeLists.txt --include='*.cmake' \
              "$root/CMakeLists.txt" "$root/cmake" "$root/tests" "$root/examples" "$root/benchmarks" 2>/dev/null |
            sed -E 's/find_package\(([A-Za-z_0-9]+).*/\1/' | sort -u |
            grep -vxE 'Threads|Catch2|nlohmann_json|ZLIB|PNG|JPEG|LMDB|CUDAToolkit|CUDNN|NCCL|MPI|ember' || true)
  [[ -n $missing ]] && echo "prepare: WARNING: configure also REQUIRES: $(echo $missing) (not in .device-deps)"
  echo "prepare: $deps $(du -sh "$deps" | cut -f1), $data $(du -sh "$data" | cut -f1)$([[ -f $data/commit ]] && echo ", commit $(cut -d' ' -f1 "$data/commit")")"
}
if [[ $mode == prepare ]]; then
  prepare "$root/.device-deps" "$root/.device-data" || exit 1
  grep -qxF '/.device-data/' "$root/.git/info/exclude" 2>/dev/null || echo /.device-data/ >>"$root/.git/info/exclude"
  echo "prepare: carry .device-deps and .device-data: run(command='bash tools/gpu-check.sh', carry=['.device-deps', '.device-data'], timeout_s=600)"
  exit 0
fi

# ================================================================ set-up
deadline=$((script_start + ${EMBER_GPU_DEADLINE:-520}))
reserve=12  # seconds kept back for the table, failures.txt and the archive
build=${EMBER_GPU_BUILD_DIR:-$([[ $mode == dry ]] && echo build-gpu-dry || echo build-gpu)}
jobs=${EMBER_GPU_JOBS:-$(nproc)}
test_timeout=${EMBER_TEST_TIMEOUT:-120}
bench_timeout=${EMBER_BENCH_TIMEOUT:-90}
allreduce_max=${EMBER_ALLREDUCE_MAX_BYTES:-16M}
out=${OUT:-$root/gpu-check-out}
mkdir -p "$out" && out=$(cd "$out" && pwd)
rm -f "$out"/summary.txt "$out"/versions.txt "$out"/failures.txt "$out"/*.ratios.txt "$out"/logs.tar.gz  # an earlier run's
work=$root/$build/gpu-check  # every log, JSON and junit file; archived into $out/logs.tar.gz
rm -rf "$work" && mkdir -p "$work"
max_out_files=7

# ---------------------------------------------------------------- the result table
rows=()  # "step|result|seconds|detail"; result: ok, FAILED, skipped, deadline, dry
failures=0
record() { # record STEP RESULT SECONDS DETAIL
  rows+=("$1|$2|$3|$4")
  [[ $2 == FAILED ]] && failures=$((failures + 1))
  printf '  -> %s: %s (%ss) %s\n' "$1" "$2" "$3" "$4"
}
left() { echo $((deadline - reserve - SECONDS)); }
section() { printf '\n==== %s [%ss, %ss left]\n' "$*" "$((SECONDS - script_start))" "$(left)"; }
# fits STEP MIN_SECONDS: true when at least MIN_SECONDS are left, else records the skip.
fits() {
  if (($(left) < $2)); then
    record "$1" deadline 0 "not run: $(left)s left, needs ${2}s"
    return 1
  fi
}
# limit MAX: the time a step may take, MAX or what is left.
limit() { local l; l=$(left); echo $(($1 < l ? $1 : l)); }

# run_step LOG LIMIT CMD...: runs CMD in the background under `timeout` (its own process group:
# a timeout kills ctest's or mpirun's children too), so that the TERM trap can run while it does.
child=""
run_step() {
  local log=$1 lim=$2 rc
  shift 2
  echo "-- $* (limit ${lim}s, log ${log#"$root"/})"
  timeout -k 5 "$lim" "$@" >"$log" 2>&1 &
  child=$!
  wait "$child"
  rc=$?
  child=""
  return $rc
}
timed_out() { (($1 == 124 || $1 == 137)); }

gpu_name="" commit=""
published=0
print_table() {
  printf '\n==== ember GPU check%s: %s | %s | commit %s\n' "$([[ $mode == dry ]] && echo ' (DRY RUN: no GPU)')" \
    "$(date -u '+%Y-%m-%d %H:%M UTC')" "${gpu_name:-no GPU}" "${commit:-?}"
  printf '%-24s %-8s %5s  %s\n' step result time detail
  local r step res secs detail
  for r in "${rows[@]}"; do
    IFS='|' read -r step res secs detail <<<"$r"
    printf '%-24s %-8s %4ss  %.150s\n' "$step" "$res" "$secs" "$detail"
  done
  printf 'total %ss (deadline %ss); files in OUT: %s\n' "$((SECONDS - script_start))" "$((deadline - script_start))" \
    "$(cd "$out" && ls | tr '\n' ' ')"
  if ((failures == 0)); then echo "GPU CHECK ${mode^^}: PASSED"; else echo "GPU CHECK ${mode^^}: FAILED ($failures)"; fi
}

# failures.txt: each failed or timed-out test's name and the end of its output, from the junit files.
write_failures() {
  local py
  py=$(command -v python3 || true)
  if [[ -z $py ]]; then
    grep -hE '\*\*\*Failed|\*\*\*Timeout|\*\*\*Exception|Not Run' "$work"/ctest-*.log >"$out/failures.txt" 2>/dev/null
    return
  fi
  "$py" - "$out/failures.txt" "$work"/ctest-*.xml <<'PY' 2>/dev/null
import sys, xml.etree.ElementTree as ET
out, files = sys.argv[1], sys.argv[2:]
lines = []
for path in files:
    try:
        cases = ET.parse(path).getroot().iter("testcase")
    except Exception as e:
        lines.append(f"{path}: unreadable ({e})")
        continue
    for c in cases:
        out_text = c.findtext("system-out") or ""
        missing = c.get("status") == "notrun" and "find executable" in out_text
        if missing or c.get("status") in ("fail", "failed") or c.find("failure") is not None or c.find("error") is not None:
            text = (c.findtext("system-out") or "").strip().splitlines()
            lines.append(f"==== {c.get('name')} ({path.rsplit('/', 1)[-1]}, {c.get('time')} s)")
            lines.extend(text[-40:])
with open(out, "w") as f:
    f.write("\n".join(lines[:4000]) + "\n" if lines else "no failed tests\n")
PY
}

# Copies the results to $OUT: never more than $max_out_files files.
publish() {
  ((published)) && return
  published=1
  print_table >"$out/summary.txt"
  write_failures
  # logs.tar.gz: every log; cut to the last 1 MiB of each if the archive would pass 15 MiB.
  tar -czf "$out/logs.tar.gz" -C "$work/.." gpu-check 2>/dev/null
  if (($(stat -c %s "$out/logs.tar.gz" 2>/dev/null || echo 0) > 15 * 1024 * 1024)); then
    find "$work" -type f -size +1M -exec sh -c 'tail -c 1048576 "$1" >"$1.cut" && mv "$1.cut" "$1"' _ {} \;
    tar -czf "$out/logs.tar.gz" -C "$work/.." gpu-check 2>/dev/null
  fi
  local n
  n=$(find "$out" -maxdepth 1 -type f | wc -l)
  if ((n > max_out_files)); then
    record "output files" FAILED 0 "$n files in OUT (limit $max_out_files)"
    print_table >"$out/summary.txt"
  fi
}

on_signal() {
  trap - TERM INT
  [[ -n $child ]] && kill -TERM "$child" 2>/dev/null && wait "$child" 2>/dev/null
  record "interrupted" FAILED "$((SECONDS - script_start))" "SIG$1 at ${SECONDS}s: the rest was not run"
  publish
  print_table
  exit 143
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

# ---------------------------------------------------------------- the plan (also the dry run's list)
section "plan ($mode)"
cat <<EOF
  1 versions       nvidia-smi; nvcc, cuDNN and NCCL (wheels or system), torch, deps prefix -> versions.txt
  2 configure      cmake -DEMBER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DEMBER_BLAS=OFF -DEMBER_MPI=OFF, no header/package tests
  3 device report  build and run ember_device_report (driver, libraries loaded, devices, memory pools)
  4 build          cmake --build $build --target ember_gpu -j$jobs (GPU tests, benchmarks, quickstart, all-reduce)
  5 parity         ctest -L '^test_backend_parity\$' (every kernel against the CPU), ${test_timeout}s per test
  6 gpu tests      ctest -L '^gpu\$' -LE '^test_backend_parity\$', ${test_timeout}s per test
 6b sanitize       only with EMBER_GPU_SANITIZE='memcheck racecheck': the gpu tests under compute-sanitizer
  7 bench torch    python3 benchmarks/bench_torch.py (CUDA events), ${bench_timeout}s
  8 bench <prog>   each benchmark program, --benchmark_filter=_cuda --benchmark_repetitions=3, ${bench_timeout}s each
  9 allreduce      bench_allreduce_nccl one rank and --single-process, up to $allreduce_max
 10 cpu suite      only with time left: build the rest, ctest -LE '^gpu\$' without examples
 11 table          summary.txt, versions.txt, failures.txt, ratio files, logs.tar.gz -> $out
EOF

# ---------------------------------------------------------------- dry run: no GPU, wheels faked
if [[ $mode == dry ]]; then
  section "dry run set-up"
  t0=$SECONDS
  # cuDNN and NCCL where their wheels put them (site-packages/nvidia/<pkg>/{include,lib}, versioned
  # .so files only), made from the toolkit's copies; found through Python as on the GPU machine.
  dry_dir=$root/$build/dry-setup  # outside $work: not archived
  rm -rf "$dry_dir"
  wheels=$dry_dir/site-packages
  ok=1
  for spec in "cudnn:cudnn*.h:libcudnn*.so.[0-9]" "nccl:nccl*.h:libnccl.so.[0-9]"; do
    IFS=: read -r pkg hdr lib <<<"$spec"
    mkdir -p "$wheels/nvidia/$pkg/include" "$wheels/nvidia/$pkg/lib"
    src_inc=$(dirname "$(find /usr/local/cuda/include /usr/include -maxdepth 1 -name "$pkg.h" 2>/dev/null | head -1)" 2>/dev/null)
    src_lib=$(dirname "$(find -L /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu -maxdepth 1 -name "$lib" 2>/dev/null | head -1)" 2>/dev/null)
    if [[ -z $src_inc || -z $src_lib || $src_inc == . || $src_lib == . ]]; then ok=0; continue; fi
    for f in "$src_inc"/$hdr; do ln -sfn "$f" "$wheels/nvidia/$pkg/include/"; done
    for f in "$src_lib"/$lib; do ln -sfn "$(readlink -f "$f")" "$wheels/nvidia/$pkg/lib/$(basename "$f")"; done
  done
  export PYTHONPATH=$wheels${PYTHONPATH:+:$PYTHONPATH}
  # The prefix the GPU machine gets (Catch2, Google Benchmark, nlohmann-json, zlib headers) and
  # its data folder, made as --prepare makes them.
  if prepare "$dry_dir/device-deps" "$dry_dir/device-data" >"$work/prepare.log" 2>&1; then
    dry_deps=$dry_dir/device-deps dry_data=$dry_dir/device-data
    record "dry: set-up" ok $((SECONDS - t0)) "wheel layout in ${wheels#"$root"/}; $(tail -1 "$work/prepare.log" | cut -c1-100)"
  else
    dry_deps="" dry_data=""
    record "dry: set-up" FAILED $((SECONDS - t0)) "--prepare failed: $(tail -1 "$work/prepare.log")"
  fi
  ((ok)) || record "dry: wheel layout" FAILED 0 "no cuDNN/NCCL to lay out here"
fi

# ---------------------------------------------------------------- 1. versions
section "versions"
t0=$SECONDS
if [[ -f $root/.device-data/commit ]]; then
  commit=$(cut -d' ' -f1 "$root/.device-data/commit")
elif commit=$(git rev-parse --short HEAD 2>/dev/null); then
  git diff --quiet HEAD -- 2>/dev/null || commit="$commit+local-changes"
else
  commit="unknown (no .git and no .device-data/commit: run --prepare before the device run)"
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout 30 nvidia-smi >"$work/nvidia-smi.txt" 2>&1
  gpu_name=$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
fi
if ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13*/bin; do
    [[ -x $d/nvcc ]] && export PATH=$d:$PATH && break
  done
fi
python=${EMBER_GPU_PYTHON:-$(command -v python3 || command -v python || true)}  # the one with torch

# The folder holding include/<header>: a wheel's nvidia/<pkg> (through Python), else a system prefix.
find_root() { # find_root HEADER WHEEL_SUBDIR
  local header=$1 sub=$2 d f
  if [[ -n $python ]]; then
    d=$("$python" -c "import importlib
try:
    m = importlib.import_module('nvidia.$sub'); print(list(m.__path__)[0])
except Exception:
    pass" 2>/dev/null)
    [[ -n $d && -f $d/include/$header ]] && { echo "$d"; return 0; }
    while IFS= read -r d; do
      [[ -f $d/nvidia/$sub/include/$header ]] && { echo "$d/nvidia/$sub"; return 0; }
    done < <("$python" -c "import site, sys
for p in site.getsitepackages() + [site.getusersitepackages()] + sys.path: print(p)" 2>/dev/null)
  fi
  [[ $mode == dry ]] && return 1  # the dry run checks the wheel path, not the system one
  for d in /usr/local/cuda /usr; do
    [[ -f $d/include/$header ]] && { echo "$d"; return 0; }
  done
  f=$(timeout 60 find / -xdev \( -path /proc -o -path /sys -o -path "$root" \) -prune -o -name "$header" -print 2>/dev/null | head -1)
  [[ -n $f ]] && { dirname "$(dirname "$f")"; return 0; }
  return 1
}
lib_dir_of() { # lib_dir_of ROOT LIBNAME
  local d
  for d in "$1/lib" "$1/lib64" "$1/lib/x86_64-linux-gnu" "$1/targets/x86_64-linux/lib"; do
    compgen -G "$d/$2.so*" >/dev/null && { echo "$d"; return 0; }
  done
  return 1
}
header_version() { # header_version FILE PREFIX PATCHNAME
  awk -v p="$2" -v pat="$3" '$1=="#define" && $2==p"MAJOR"{a=$3} $1=="#define" && $2==p"MINOR"{b=$3}
      $1=="#define" && $2==p pat{c=$3} END{if(a!="") print a"."b"."c}' "$1" 2>/dev/null
}
cudnn_root=${CUDNN_ROOT:-$(find_root cudnn.h cudnn || true)}
nccl_root=${NCCL_ROOT:-$(find_root nccl.h nccl || true)}
cudnn_lib=$([[ -n $cudnn_root ]] && lib_dir_of "$cudnn_root" libcudnn || true)
nccl_lib=$([[ -n $nccl_root ]] && lib_dir_of "$nccl_root" libnccl || true)
cudnn_ver=$(header_version "$cudnn_root/include/cudnn_version.h" CUDNN_ PATCHLEVEL)
[[ -z $cudnn_ver ]] && cudnn_ver=$(header_version "$cudnn_root/include/cudnn.h" CUDNN_ PATCHLEVEL)
nccl_ver=$(header_version "$nccl_root/include/nccl.h" NCCL_ PATCH)
# cuDNN 9 loads its sub-libraries from its own folder at run time: both go on LD_LIBRARY_PATH. The
# deps prefix does not (its libraries reach the programs through CMake's build RPATH).
for d in "$cudnn_lib" "$nccl_lib"; do
  [[ -n $d && :${LD_LIBRARY_PATH:-}: != *:$d:* ]] && export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done
deps_prefix=""
[[ -d $root/.device-deps ]] && deps_prefix=$root/.device-deps
[[ $mode == dry ]] && deps_prefix=${dry_deps:-}

# The examples' data (their Debian packages are missing there): the carried copies.
data=$root/.device-data
[[ $mode == dry ]] && data=${dry_data:-$data}
[[ -z ${EMBER_DIGITS_CSV:-} && -f $data/digits.csv.gz ]] && export EMBER_DIGITS_CSV=$data/digits.csv.gz
[[ -z ${EMBER_TEXT_DIR:-} && -d $data/licenses ]] && export EMBER_TEXT_DIR=$data/licenses
[[ -z ${EMBER_FASHION_MNIST_DIR:-} && -d $data/fashion-mnist ]] && export EMBER_FASHION_MNIST_DIR=$data/fashion-mnist

{
  echo "mode:        $mode; commit $commit; $(date -u '+%Y-%m-%d %H:%M:%S UTC'); $(nproc) cores"
  echo "gpu:         ${gpu_name:-none (nvidia-smi: $(command -v nvidia-smi || echo 'not found'))}"
  echo "nvcc:        $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\), \(V[0-9.]*\).*/\1 (\2)/p') $(command -v nvcc || echo 'NOT FOUND')"
  echo "cmake:       $(cmake --version 2>/dev/null | head -1); ninja $(ninja --version 2>/dev/null || echo 'not found')"
  echo "c++:         $(c++ --version 2>/dev/null | head -1)"
  echo "python:      $($python --version 2>&1) ($python)"
  echo "torch:       $(timeout 60 "$python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version(), "GPU", torch.cuda.is_available())' 2>/dev/null || echo 'not importable')"
  echo "cuDNN:       ${cudnn_ver:-?} from ${cudnn_root:-NOT FOUND} (${cudnn_lib:-no lib}: $(cd "${cudnn_lib:-/nonexistent}" 2>/dev/null && ls libcudnn.so* 2>/dev/null | tr '\n' ' '))"
  echo "NCCL:        ${nccl_ver:-?} from ${nccl_root:-NOT FOUND} (${nccl_lib:-no lib}: $(cd "${nccl_lib:-/nonexistent}" 2>/dev/null && ls libnccl.so* 2>/dev/null | tr '\n' ' '))"
  echo "deps prefix: ${deps_prefix:-none (no .device-deps: Catch2 / Google Benchmark must be installed)}"
  echo "data:        digits ${EMBER_DIGITS_CSV:-unset}; text ${EMBER_TEXT_DIR:-unset}; fashion-mnist ${EMBER_FASHION_MNIST_DIR:-unset}"
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  [[ -f $work/nvidia-smi.txt ]] && sed -n '1,20p' "$work/nvidia-smi.txt"
} >"$out/versions.txt"
sed -n '1,11p' "$out/versions.txt"
have_toolchain=0
if [[ -n $cudnn_lib && -n $nccl_lib ]] && command -v nvcc >/dev/null; then
  have_toolchain=1
  record "versions" ok $((SECONDS - t0)) "nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), cuDNN ${cudnn_ver:-?}, NCCL ${nccl_ver:-?}"
else
  record "versions" FAILED $((SECONDS - t0)) "missing:$(command -v nvcc >/dev/null || echo ' nvcc')$([[ -n $cudnn_lib ]] || echo ' cuDNN')$([[ -n $nccl_lib ]] || echo ' NCCL')"
fi
[[ $mode == gpu && -z $gpu_name ]] && record "gpu" FAILED 0 "nvidia-smi found no GPU"

# ---------------------------------------------------------------- 2. configure
section "configure"
cfg=(-S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
     -DEMBER_BLAS=OFF -DEMBER_MPI=OFF -DEMBER_HEADER_TESTS=OFF -DEMBER_PACKAGE_TESTS=OFF)
[[ -n $cudnn_root ]] && cfg+=("-DCUDNN_ROOT=$cudnn_root")
[[ -n $nccl_root ]] && cfg+=("-DNCCL_ROOT=$nccl_root")
[[ -n $deps_prefix ]] && cfg+=("-DCMAKE_PREFIX_PATH=$deps_prefix")
[[ -n $python ]] && cfg+=("-DEMBER_PYTHON=$python")
if [[ -n ${EMBER_CMAKE_ARGS:-} ]]; then
  read -r -a extra <<<"$EMBER_CMAKE_ARGS"
  cfg+=("${extra[@]}")
fi
configured=0
t0=$SECONDS
if ! ((have_toolchain)); then
  record "configure" skipped 0 "no CUDA toolchain (versions)"
elif fits configure 20; then
  run_step "$work/configure.log" "$(limit 120)" cmake "${cfg[@]}"
  rc=$?
  if ((rc == 0)); then
    configured=1
    record "configure" ok $((SECONDS - t0)) "$(grep -m1 -o 'CUDA backend [A-Z]*, CBLAS [A-Z]*' "$work/configure.log")"
  else
    grep -E 'CMake Error|Could NOT find|missing' "$work/configure.log" | head -8
    record "configure" FAILED $((SECONDS - t0)) "exit $rc: $(grep -m1 -E 'Could NOT find|CMake Error' "$work/configure.log")"
  fi
fi

# ---------------------------------------------------------------- 3. device report
section "device report"
t0=$SECONDS
report=$build/tools/device_report/ember_device_report
if ((configured)) && fits "device report" 30; then
  run_step "$work/build-report.log" "$(limit 120)" cmake --build "$build" --target ember_device_report -j"$jobs"
  rc=$?
  if ((rc != 0)); then
    record "device report" FAILED $((SECONDS - t0)) "build exit $rc (build-report.log)"
  else
    report_args=()
    [[ $mode == dry ]] && report_args=(--allow-no-gpu)
    run_step "$work/device-report.txt" "$(limit 30)" "$report" "${report_args[@]}"
    rc=$?
    cat "$work/device-report.txt"
    { echo; cat "$work/device-report.txt"; } >>"$out/versions.txt"
    detail=$(grep -m1 '^result' "$work/device-report.txt" | sed 's/^result *: //')
    if ((rc == 0)); then record "device report" ok $((SECONDS - t0)) "$detail"
    else record "device report" FAILED $((SECONDS - t0)) "exit $rc: $detail; $(grep -m1 '^devices' "$work/device-report.txt")"; fi
  fi
elif ! ((configured)); then
  record "device report" skipped 0 "not configured"
fi

# The steps that need the build, listed as not run (the table names every step).
skip_built_steps() { # skip_built_steps REASON
  local step
  for step in parity "gpu tests" "bench torch" "bench <programs>" allreduce; do
    record "$step" deadline 0 "not run: $1"
  done
}

# ---------------------------------------------------------------- 4. build the GPU targets
section "build (ember_gpu, -j$jobs)"
built=0
t0=$SECONDS
if ((configured)) && fits build 60; then
  lim_build=$(limit 400)
  run_step "$work/build.log" "$lim_build" cmake --build "$build" --target ember_gpu -j"$jobs" -- -k 0
  rc=$?
  built=1
  if ((rc == 0)); then
    record "build" ok $((SECONDS - t0)) "ember_gpu: $(grep -c '^\[' "$work/build.log") steps"
  else
    grep -E '^FAILED:|error:' "$work/build.log" | head -12
    if timed_out $rc && [[ $mode == dry ]]; then
      # A slow or shared machine, not a broken check: what needs the build is listed, not run.
      built=0
      record "build" deadline $((SECONDS - t0)) "cut after ${lim_build}s: $(grep -c '^\[' "$work/build.log") steps done; $(grep -c '^FAILED:' "$work/build.log") failed"
      skip_built_steps "the build was cut by the deadline"
    else
      timed_out $rc && why="cut by the deadline" || why="$(grep -c '^FAILED:' "$work/build.log") failed build steps"
      record "build" FAILED $((SECONDS - t0)) "exit $rc: $why (build.log); what built still runs"
    fi
  fi
elif ! ((configured)); then
  record "build" skipped 0 "not configured"
else
  skip_built_steps "the build did not fit"
fi

# ---------------------------------------------------------------- 5, 6. tests
# run_ctest STEP NAME MIN ARGS...: one ctest run with its own log and junit file.
run_ctest() {
  local step=$1 name=$2 min=$3 rc secs total passed skipped failed nogpu
  shift 3
  fits "$step" "$min" || return
  t0=$SECONDS
  run_step "$work/ctest-$name.log" "$(limit 400)" ctest --test-dir "$build" -V --timeout "$test_timeout" \
    --output-junit "$work/ctest-$name.xml" "$@"
  rc=$?
  secs=$((SECONDS - t0))
  total=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$work/ctest-$name.log")
  passed=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* +Passed +[0-9.]+ sec' "$work/ctest-$name.log")
  skipped=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*Skipped' "$work/ctest-$name.log")
  failed=$((total - passed - skipped))  # failed, timed out, or not run (its executable was not built)
  nogpu=$(grep -c 'SKIPPED: no GPU' "$work/ctest-$name.log")
  grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$work/ctest-$name.log" | grep -vE ' Passed |Skipped' | head -15
  local detail="passed $passed, failed $failed, skipped $skipped of $total"
  timed_out $rc && detail="$detail; CUT by the deadline"
  if [[ $mode == gpu ]] && ((nogpu > 0)); then
    grep -o 'SKIPPED: no GPU.*' "$work/ctest-$name.log" | sort | uniq -c | sort -rn | head -3
    record "$step" FAILED "$secs" "$detail; $nogpu say 'SKIPPED: no GPU' ON A GPU MACHINE: $(grep -m1 -o 'SKIPPED: no GPU ([^;]*' "$work/ctest-$name.log")"
  elif ((total == 0)); then
    record "$step" FAILED "$secs" "no tests found (exit $rc)"
  elif ((failed > 0)) || { ((rc != 0)) && [[ $mode == gpu ]]; }; then
    record "$step" FAILED "$secs" "$detail (failures.txt)"
  else
    [[ $mode == dry ]] && detail="$detail (no GPU: skips expected)"
    record "$step" "$([[ $mode == dry ]] && echo dry || echo ok)" "$secs" "$detail"
  fi
}
if ((built)); then
  section "parity (test_backend_parity)"
  run_ctest parity parity 20 -L '^test_backend_parity$'
  section "gpu tests (label gpu)"
  run_ctest "gpu tests" gpu 30 -L '^gpu$' -LE '^test_backend_parity$' -j "$((jobs < 8 ? jobs : 8))"
elif ! ((configured)); then
  record "tests" skipped 0 "nothing built"
fi

# ---------------------------------------------------------------- 6b. compute-sanitizer (on request)
# EMBER_GPU_SANITIZE="memcheck racecheck": the GPU-labelled tests again, each under NVIDIA's
# compute-sanitizer with that tool (memcheck: out-of-bounds and misaligned device accesses, leaks of
# device memory, errors of CUDA calls; racecheck: shared-memory hazards between a block's threads),
# parity first, for at most EMBER_GPU_SANITIZE_SECONDS (240) split over the tools; a test cut by it
# is counted as not run. A test fails when the tool reports an error (--error-exitcode).
sanitize_tools=${EMBER_GPU_SANITIZE:-}
if [[ -z $sanitize_tools ]]; then
  record "compute-sanitizer" skipped 0 "not asked (EMBER_GPU_SANITIZE='memcheck racecheck')"
elif ! ((built)); then
  record "compute-sanitizer" skipped 0 "nothing built"
elif ! command -v compute-sanitizer >/dev/null 2>&1; then
  record "compute-sanitizer" "$([[ $mode == dry ]] && echo dry || echo FAILED)" 0 "compute-sanitizer not on PATH"
else
  section "compute-sanitizer ($sanitize_tools)"
  # The tests' commands, parity's first, from ctest's own description of them.
  ctest --test-dir "$build" -L '^gpu$' --show-only=json-v1 >"$work/gpu-tests.json" 2>/dev/null
  "$python" - "$work/gpu-tests.json" >"$work/gpu-tests.cmds" <<'PY'
import json, shlex, sys
tests = json.load(open(sys.argv[1])).get("tests", [])
def labels(t):
    return [v for p in t.get("properties", []) if p.get("name") == "LABELS" for v in p.get("value", [])]
tests.sort(key=lambda t: "test_backend_parity" not in labels(t))
for t in tests:
    if t.get("command"):
        print(t["name"].replace("\t", " ") + "\t" + shlex.join(t["command"]))
PY
  read -r -a tools <<<"$sanitize_tools"
  budget=$(( ${EMBER_GPU_SANITIZE_SECONDS:-240} / ${#tools[@]} ))
  for tool in "${tools[@]}"; do
    fits "sanitize $tool" 20 || continue
    t0=$SECONDS ran=0 bad=0 total=0 bad_names=""
    log=$work/sanitize-$tool.log
    : >"$log"
    while IFS=$'\t' read -r name cmd; do
      total=$((total + 1))
      used=$((SECONDS - t0))
      ((used < budget && $(left) > 20)) || continue
      lim=$(limit $((budget - used < test_timeout * 4 ? budget - used : test_timeout * 4)))
      echo "==== $name" >>"$log"
      rc=0
      timeout -k 5 "$lim" compute-sanitizer --tool "$tool" --error-exitcode 86 --print-limit 20 \
        bash -c "$cmd" >>"$log" 2>&1 || rc=$?
      timed_out $rc && { echo "==== $name: cut after ${lim}s" >>"$log"; continue; }
      ran=$((ran + 1))
      if ((rc != 0)); then
        bad=$((bad + 1))
        bad_names+="${bad_names:+, }$name"
        echo "==== $name: FAILED (exit $rc)" >>"$log"
      fi
    done <"$work/gpu-tests.cmds"
    detail="$ran of $total tests ran, $bad with errors$([[ -n $bad_names ]] && echo ": ${bad_names:0:100}")"
    record "sanitize $tool" "$( ((bad > 0)) && echo FAILED || { [[ $mode == dry ]] && echo dry || echo ok; })" \
      $((SECONDS - t0)) "$detail"
  done
fi

# ---------------------------------------------------------------- 7, 8. benchmarks
# Twins: benchmarks/bench_torch.py times bench_core's and bench_layers' CUDA cases in PyTorch;
# benchmarks/<name>.py twins the program <name> (same case names, {case: ms} or Google Benchmark
# JSON). Ratio = ember time / PyTorch time per case (< 1: ember is faster), medians.
ratio() { # ratio EMBER_JSON TORCH_JSON RATIO_FILE -> prints "geomean ..." or a reason
  "$python" - "$@" <<'PY'
import json, math, sys
scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
def times(path):
    data = json.load(open(path))
    if "benchmarks" not in data:  # {case: milliseconds, "errors": {...}}
        return {k: float(v) * 1e-3 for k, v in data.items() if isinstance(v, (int, float))}
    t = {}
    for r in data["benchmarks"]:
        if r.get("error_occurred"):
            continue
        name = r.get("run_name", r["name"]).replace("/manual_time", "").replace("/real_time", "")
        sec = float(r["real_time"]) * scale.get(r.get("time_unit", "ns"), 1e-9)
        if r.get("run_type") == "aggregate":
            if r.get("aggregate_name") == "median":
                t[name] = sec
        else:
            t.setdefault(name, sec)
    return t
e, p = times(sys.argv[1]), times(sys.argv[2])
common = sorted(set(e) & set(p))
with open(sys.argv[3], "w") as f:
    f.write("case\tember_us\ttorch_us\tember/torch\n")
    for n in common:
        f.write(f"{n}\t{e[n]*1e6:.1f}\t{p[n]*1e6:.1f}\t{e[n]/p[n]:.3f}\n")
if common:
    g = math.exp(sum(math.log(e[n] / p[n]) for n in common) / len(common))
    worst = max(common, key=lambda n: e[n] / p[n])
    print(f"geomean {g:.3f} over {len(common)} cases; worst {worst} {e[worst]/p[worst]:.2f}")
else:
    print("no case measured on both sides")
PY
}
bench_errors() { # the error rows of a Google Benchmark JSON file
  "$python" -c "import json,sys
d=json.load(open(sys.argv[1])); e=[b['name'] for b in d.get('benchmarks',[]) if b.get('error_occurred')]
print(len(e), 'error rows' + (': ' + ', '.join(e[:3]) if e else ''))" "$1" 2>/dev/null
}
shopt -s nullglob
programs=()
for exe in "$build"/benchmarks/bench_*; do
  [[ -x $exe && -f $exe ]] || continue
  # Google Benchmark programs only (the plain-main ones take other arguments): those linked with it.
  [[ $(ldd "$exe" 2>/dev/null) == *libbenchmark.so* ]] || continue
  # EMBER_GPU_BENCH_PROGRAMS="bench_core bench_layers": only these (a second run in the same
  # session, when the device time left is short).
  if [[ -n ${EMBER_GPU_BENCH_PROGRAMS:-} && " $EMBER_GPU_BENCH_PROGRAMS " != *" ${exe##*/} "* ]]; then
    record "bench ${exe##*/}" skipped 0 "not in EMBER_GPU_BENCH_PROGRAMS"
    continue
  fi
  programs+=("${exe##*/}")
done
shopt -u nullglob
torch_json=$work/bench_torch.torch.json
if ((built)); then
  section "bench torch (PyTorch twin)"
  t0=$SECONDS
  if [[ ! -f benchmarks/bench_torch.py ]]; then
    record "bench torch" skipped 0 "no benchmarks/bench_torch.py"
  elif fits "bench torch" 30; then
    run_step "$work/bench_torch.log" "$(limit "$bench_timeout")" env PYTHONUNBUFFERED=1 "$python" benchmarks/bench_torch.py --out "$torch_json"
    rc=$?
    if ((rc == 0)); then
      record "bench torch" ok $((SECONDS - t0)) "$("$python" -c "import json,sys; print(len(json.load(open(sys.argv[1]))), 'cases')" "$torch_json" 2>/dev/null)"
    elif ((rc == 3)) && [[ $mode == dry ]]; then
      record "bench torch" dry $((SECONDS - t0)) "$(head -1 "$work/bench_torch.log")"
    else
      record "bench torch" FAILED $((SECONDS - t0)) "exit $rc$(timed_out $rc && echo ' (timeout)'): $(grep -m1 -E 'FAILED|Error|SKIPPED' "$work/bench_torch.log" | cut -c1-100)"
    fi
  fi
  for name in "${programs[@]}"; do
    section "bench $name (_cuda cases)"
    fits "bench $name" 20 || continue
    t0=$SECONDS
    json=$work/$name.ember.json
    run_step "$work/$name.log" "$(limit "$bench_timeout")" "$build/benchmarks/$name" --benchmark_filter=_cuda \
      --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
      --benchmark_out="$json" --benchmark_out_format=json
    rc=$?
    twin=""
    case $name in bench_core | bench_layers) twin=$torch_json ;; *) [[ -f benchmarks/$name.py ]] && twin=$work/$name.torch.json ;; esac
    if [[ -n $twin && $twin != "$torch_json" ]] && ((rc == 0)) && fits "bench $name twin" 20; then
      run_step "$work/$name.torch.log" "$(limit "$bench_timeout")" "$python" "benchmarks/$name.py" --out "$twin"
    fi
    if [[ $mode == dry ]]; then
      if ((rc == 0)) && grep -q 'Failed to match any benchmarks\|No benchmarks' "$work/$name.log"; then
        record "bench $name" dry $((SECONDS - t0)) "ran: no _cuda cases without a GPU (expected)"
      elif ((rc == 0)); then
        record "bench $name" FAILED $((SECONDS - t0)) "_cuda cases ran without a GPU?"
      else
        record "bench $name" FAILED $((SECONDS - t0)) "exit $rc ($name.log)"
      fi
      continue
    fi
    if ((rc == 0)) && grep -q 'Failed to match any benchmarks\|No benchmarks' "$work/$name.log"; then
      record "bench $name" skipped $((SECONDS - t0)) "no _cuda cases (a CPU-only program)"
      continue
    fi
    if ((rc != 0)) || [[ ! -s $json ]]; then
      record "bench $name" FAILED $((SECONDS - t0)) "exit $rc$(timed_out $rc && echo ' (timeout)'); $name.log"
      continue
    fi
    errs=$(bench_errors "$json")
    if [[ -n $twin && -s $twin ]]; then
      r=$(ratio "$json" "$twin" "$work/$name.ratios.txt")
      cp "$work/$name.ratios.txt" "$out/" 2>/dev/null
      res=ok
      [[ $errs != 0\ * || $r != geomean* ]] && res=FAILED
      record "bench $name" $res $((SECONDS - t0)) "ember/torch $r; $errs"
    else
      res=ok
      [[ $errs != 0\ * ]] && res=FAILED
      record "bench $name" $res $((SECONDS - t0)) "no PyTorch twin$([[ -n $twin ]] && echo ' (twin failed)'); $errs"
    fi
  done
fi
# Never more than two ratio files in OUT (the rest are in logs.tar.gz): the file limit holds
# whatever twins are added.
for f in "$out"/*.ratios.txt; do
  case ${f##*/} in bench_core.ratios.txt | bench_layers.ratios.txt | "*.ratios.txt") ;; *) rm -f "$f" ;; esac
done

# ---------------------------------------------------------------- 9. all-reduce (NCCL), one GPU
# A smoke test of the path on one GPU (busbw is 0 for one rank); the tables stay in the logs.
allreduce() { # allreduce STEP LOG CMD...
  local step=$1 log=$2 rc
  shift 2
  fits "$step" 15 || return
  t0=$SECONDS
  run_step "$work/$log" "$(limit 60)" "$@"
  rc=$?
  if ((rc == 0)) && grep -qE '^ +[0-9]+ .* ok$' "$work/$log" && ! grep -q WRONG "$work/$log"; then
    record "$step" ok $((SECONDS - t0)) "$(awk '/^ +[0-9]/ {s=$1; a=$5; b=$6} END {printf "%g MiB: algbw %s GB/s, busbw %s", s/1048576, a, b}' "$work/$log")"
  elif [[ $mode == dry ]]; then
    record "$step" dry $((SECONDS - t0)) "exit $rc without a GPU: $(grep -m1 -iE 'error|device' "$work/$log" | cut -c1-90)"
  else
    record "$step" FAILED $((SECONDS - t0)) "exit $rc$(grep -q WRONG "$work/$log" && echo ', WRONG values'); $log"
  fi
}
ar=$build/benchmarks/bench_allreduce_nccl
if ((built)); then
  section "all-reduce (NCCL, up to $allreduce_max)"
  if [[ -x $ar ]]; then
    allreduce "allreduce 1 rank" allreduce-1rank.log "$ar" --backend nccl --max-bytes "$allreduce_max"
    allreduce "allreduce single-proc" allreduce-single.log "$ar" --single-process --max-bytes "$allreduce_max"
  else
    record "allreduce" FAILED 0 "bench_allreduce_nccl not built"
  fi
fi

# ---------------------------------------------------------------- 10. the CPU suite, with the time left
section "cpu suite (time left: $(left)s)"
if [[ $mode == dry ]]; then
  record "cpu suite" dry 0 "not run in the dry run (CI runs the CPU suite); on the GPU: build all, ctest -LE '^gpu\$' -E '^example\\.'"
elif ((built)) && fits "cpu suite" 150; then
  t0=$SECONDS
  run_step "$work/build-all.log" "$(($(limit 400) - 60))" cmake --build "$build" -j"$jobs" -- -k 0
  rc=$?
  record "cpu build" "$( ((rc == 0)) && echo ok || echo FAILED)" $((SECONDS - t0)) "exit $rc$(timed_out $rc && echo ' (deadline)')"
  run_ctest "cpu suite" cpu 40 -LE '^gpu$' -E '^example\.' -j "$((jobs < 8 ? jobs : 8))"
fi

# ---------------------------------------------------------------- 11. the table
trap - TERM INT
publish
n_out=$(find "$out" -maxdepth 1 -type f | wc -l)
big=$(find "$out" -maxdepth 1 -type f -size +16M | wc -l)
total=$((SECONDS - script_start))
if [[ $mode == dry ]]; then
  # The dry run's own checks: the limits the GPU machine sets.
  ((n_out > max_out_files || big > 0)) && record "dry: limits" FAILED 0 "$n_out files in OUT, $big over 16 MiB"
  ((SECONDS > deadline)) && record "dry: limits" FAILED 0 "${total}s, past the ${EMBER_GPU_DEADLINE:-520}s deadline"
  ((n_out <= max_out_files && big == 0 && SECONDS <= deadline)) &&
    record "dry: limits" ok 0 "$n_out files in OUT (<= $max_out_files, none over 16 MiB), ${total}s <= $((deadline - script_start))s"
  print_table >"$out/summary.txt"
fi
print_table
((failures == 0))
