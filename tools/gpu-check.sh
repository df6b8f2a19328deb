#!/usr/bin/env bash
# ember's GPU check (see /work/shared/device/NOTES.md): run from the repository root on the GPU check
# machine (one H200, no network, no Catch2/Benchmark/OpenBLAS/MPI installed; cuDNN and NCCL as
# Python wheels; PyTorch present):
#   bash tools/gpu-check.sh
# 1. prints nvidia-smi, the versions found and where cuDNN and NCCL came from;
# 2. configures (CUDA backend ON, sm_90, .device-deps as CMake prefix when present: made here by
#    /work/shared/device/prepare-deps.sh .device-deps) and builds with all cores;
# 3. runs the whole test suite; any test that says "SKIPPED: no GPU" fails the check loudly;
# 4. runs each benchmark that has a PyTorch twin and keeps the JSON;
# 5. ends with one short table: each step's result, tests passed/failed/skipped, and each
#    benchmark's time ratio to PyTorch.
# Logs and JSON go to $OUT when set (the device tool brings that folder back), else ./gpu-check-out.
# A failing step is recorded in the table; the script goes on with the steps that can still run and
# exits non-zero at the end if anything failed.
#
# Benchmark twins: benchmarks/<name>.py next to the Google Benchmark program benchmarks/<name>.cpp
# (built as <build>/benchmarks/<name>); benchmarks/bench_torch.py twins two programs, bench_core
# and bench_layers. The C++ program runs with --benchmark_out=<json> --benchmark_repetitions=5
# --benchmark_report_aggregates_only=true; the twin runs once as `python3 benchmarks/<name>.py
# --out <json>` and writes either Google Benchmark's JSON shape ({"benchmarks": [{"name": ...,
# "real_time": ..., "time_unit": "ns"|"us"|"ms"|"s"}]}) or {"<case>": milliseconds}, with each
# case's name equal to the C++ case's name (without "/real_time"). Ratio = ember time / PyTorch
# time per case, medians where there are repetitions; the table shows the geometric mean over
# matched cases (< 1: ember is faster). bench_allreduce_torch.py belongs to section 4b.
#
# Environment: OUT, EMBER_GPU_BUILD_DIR (default build-gpu), EMBER_GPU_JOBS (default: all cores),
# CUDNN_ROOT / NCCL_ROOT (skip the search), EMBER_CMAKE_ARGS (extra configure arguments),
# EMBER_BENCH_TIMEOUT (seconds per benchmark program, default 300).
set -u -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
root=$PWD
out=${OUT:-$root/gpu-check-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=${EMBER_GPU_BUILD_DIR:-build-gpu}
jobs=${EMBER_GPU_JOBS:-$(nproc)}
bench_timeout=${EMBER_BENCH_TIMEOUT:-300}
script_start=$SECONDS

# ---------------------------------------------------------------- the result table
rows=()       # "step|result|seconds|detail"
failures=0
record() { # record STEP RESULT SECONDS DETAIL
  rows+=("$1|$2|$3|$4")
  case $2 in ok | skipped | absent) ;; *) failures=$((failures + 1)) ;; esac
}
section() { printf '\n==== %s\n' "$*"; }
print_table() {
  printf '\n==== ember GPU check: %s | %s | commit %s\n' "$(date -u '+%Y-%m-%d %H:%M UTC')" "${gpu_name:-no GPU found}" "${commit:-?}"
  printf '%-22s %-9s %6s  %s\n' "step" "result" "time" "detail"
  local r step res secs detail
  for r in "${rows[@]}"; do
    IFS='|' read -r step res secs detail <<<"$r"
    printf '%-22s %-9s %5ss  %s\n' "$step" "$res" "$secs" "$detail"
  done
  printf 'logs and JSON: %s; total %ss; %s\n' "$out" "$((SECONDS - script_start))" \
    "$([[ $failures -eq 0 ]] && echo 'GPU CHECK PASSED' || echo "GPU CHECK FAILED ($failures)")"
}

# ---------------------------------------------------------------- 1. machine, versions, cuDNN and NCCL
section "machine"
if commit=$(git rev-parse --short HEAD 2>/dev/null); then
  git diff --quiet HEAD -- 2>/dev/null || commit="$commit+local changes"
else
  commit=unknown
fi
t0=$SECONDS
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi 2>&1 | tee "$out/nvidia-smi.txt"
  gpu_name=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
  record "gpu" ok $((SECONDS - t0)) "${gpu_name:-?}"
else
  echo "nvidia-smi not found"
  gpu_name=""
  record "gpu" FAILED $((SECONDS - t0)) "nvidia-smi not found"
fi

if ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13*/bin; do
    [[ -x $d/nvcc ]] && export PATH=$d:$PATH && break
  done
fi
python=$(command -v python3 || command -v python || true)

# Finds the folder holding include/<header> (a wheel's nvidia/<pkg>, or a system prefix).
find_root() { # find_root HEADER WHEEL_SUBDIR
  local header=$1 sub=$2 d f
  local -a dirs=()
  if [[ -n $python ]]; then
    # The wheel's own folder, when Python can import the namespace package.
    d=$("$python" -c "import importlib, sys
try:
    m = importlib.import_module('nvidia.$sub'); print(list(m.__path__)[0])
except Exception:
    pass" 2>/dev/null)
    [[ -n $d && -f $d/include/$header ]] && { echo "$d"; return 0; }
    while IFS= read -r d; do dirs+=("$d"); done < <("$python" -c "import site, sys
for p in site.getsitepackages() + [site.getusersitepackages()] + sys.path:
    print(p)" 2>/dev/null | sort -u)
  fi
  dirs+=(/usr/local/lib/python3*/dist-packages /usr/local/lib/python3*/site-packages /usr/lib/python3/dist-packages
         /opt/conda/lib/python3*/site-packages /root/.local/lib/python3*/site-packages)
  for d in "${dirs[@]}"; do
    [[ -d $d ]] || continue
    f=$(find "$d" -maxdepth 5 -name "$header" -path "*/include/*" 2>/dev/null | head -1)
    [[ -n $f ]] && { dirname "$(dirname "$f")"; return 0; }
  done
  for d in /usr/local/cuda /usr; do
    [[ -f $d/include/$header ]] && { echo "$d"; return 0; }
  done
  # Last resort: the whole machine, bounded in time.
  f=$(timeout 120 find / -xdev \( -path /proc -o -path /sys -o -path "$root" \) -prune -o -name "$header" -print 2>/dev/null | head -1)
  [[ -n $f ]] && { dirname "$(dirname "$f")"; return 0; }
  return 1
}
lib_dir_of() { # lib_dir_of ROOT LIBNAME -> the folder with ROOT's LIBNAME.so*
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

t0=$SECONDS
cudnn_root=${CUDNN_ROOT:-$(find_root cudnn.h cudnn || true)}
nccl_root=${NCCL_ROOT:-$(find_root nccl.h nccl || true)}
cudnn_lib=$([[ -n $cudnn_root ]] && lib_dir_of "$cudnn_root" libcudnn || true)
nccl_lib=$([[ -n $nccl_root ]] && lib_dir_of "$nccl_root" libnccl || true)
cudnn_ver=$(header_version "$cudnn_root/include/cudnn_version.h" CUDNN_ PATCHLEVEL)
[[ -z $cudnn_ver ]] && cudnn_ver=$(header_version "$cudnn_root/include/cudnn.h" CUDNN_ PATCHLEVEL)
nccl_ver=$(header_version "$nccl_root/include/nccl.h" NCCL_ PATCH)
for d in "$cudnn_lib" "$nccl_lib"; do
  [[ -n $d && :${LD_LIBRARY_PATH:-}: != *:$d:* ]] && export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done
deps_prefix=""
if [[ -d $root/.device-deps ]]; then
  deps_prefix=$root/.device-deps
  for d in "$deps_prefix/lib" "$deps_prefix/lib/x86_64-linux-gnu"; do
    [[ -d $d ]] && export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  done
fi

section "versions"
{
  echo "commit:      $commit"
  echo "nvcc:        $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\), \(V[0-9.]*\).*/\1 (\2)/p') $(command -v nvcc || echo 'NOT FOUND')"
  echo "cmake:       $(cmake --version 2>/dev/null | head -1)"
  echo "ninja:       $(ninja --version 2>/dev/null || echo 'not found')"
  echo "c++:         $(c++ --version 2>/dev/null | head -1)"
  echo "python:      $($python --version 2>&1) ($python)"
  echo "torch:       $($python -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version(), "GPU", torch.cuda.is_available())' 2>/dev/null || echo 'not importable')"
  echo "cuDNN:       ${cudnn_ver:-?} from ${cudnn_root:-NOT FOUND} (libraries: ${cudnn_lib:-NOT FOUND}: $(cd "${cudnn_lib:-/nonexistent}" 2>/dev/null && ls libcudnn.so* 2>/dev/null | tr '\n' ' '))"
  echo "NCCL:        ${nccl_ver:-?} from ${nccl_root:-NOT FOUND} (libraries: ${nccl_lib:-NOT FOUND}: $(cd "${nccl_lib:-/nonexistent}" 2>/dev/null && ls libnccl.so* 2>/dev/null | tr '\n' ' '))"
  [[ -n $python ]] && echo "wheels:      $($python -c 'import importlib.metadata as m
for d in m.distributions():
    n = d.metadata["Name"] or ""
    if n.startswith(("nvidia-cudnn", "nvidia-nccl", "nvidia-cublas", "nvidia-cuda-runtime")): print(n, d.version, end="; ")' 2>/dev/null)"
  echo "deps prefix: ${deps_prefix:-none (.device-deps absent: no Catch2 / Google Benchmark unless installed)}"
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
} | tee "$out/versions.txt"
if [[ -n $cudnn_root && -n $cudnn_lib && -n $nccl_root && -n $nccl_lib ]] && command -v nvcc >/dev/null; then
  record "toolchain" ok $((SECONDS - t0)) "nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), cuDNN ${cudnn_ver:-?}, NCCL ${nccl_ver:-?}"
else
  record "toolchain" FAILED $((SECONDS - t0)) "missing:$(command -v nvcc >/dev/null || echo ' nvcc')$([[ -n $cudnn_lib ]] || echo ' cuDNN')$([[ -n $nccl_lib ]] || echo ' NCCL')"
fi

# ---------------------------------------------------------------- 2. configure and build
section "configure"
cfg=(-S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
[[ -n $cudnn_root ]] && cfg+=("-DCUDNN_ROOT=$cudnn_root")
[[ -n $nccl_root ]] && cfg+=("-DNCCL_ROOT=$nccl_root")
[[ -n $deps_prefix ]] && cfg+=("-DCMAKE_PREFIX_PATH=$deps_prefix")
if [[ -n ${EMBER_CMAKE_ARGS:-} ]]; then
  read -r -a extra <<<"$EMBER_CMAKE_ARGS"
  cfg+=("${extra[@]}")
fi
echo "cmake ${cfg[*]}"
t0=$SECONDS
configured=0
if cmake "${cfg[@]}" >"$out/configure.log" 2>&1; then
  configured=1
  record "configure" ok $((SECONDS - t0)) "$(grep -m1 -o 'ember [0-9.]*: CUDA backend [A-Z]*, CBLAS [A-Z]*' "$out/configure.log")"
  grep -E '^-- ember' "$out/configure.log"
else
  tail -40 "$out/configure.log"
  record "configure" FAILED $((SECONDS - t0)) "see configure.log"
fi

section "build (-j$jobs)"
built=0
if ((configured)); then
  t0=$SECONDS
  if cmake --build "$build" -j"$jobs" >"$out/build.log" 2>&1; then
    built=1
    record "build" ok $((SECONDS - t0)) "all targets"
  else
    # Build what can be built, so that the tests that did compile still run.
    grep -E 'error|FAILED' "$out/build.log" | head -30
    cmake --build "$build" -j"$jobs" -- -k 0 >>"$out/build.log" 2>&1
    nfail=$(grep -c '^FAILED:' "$out/build.log")
    record "build" FAILED $((SECONDS - t0)) "$nfail failed build steps, see build.log"
    built=1
  fi
  tail -3 "$out/build.log"
else
  record "build" skipped 0 "not configured"
fi

# ---------------------------------------------------------------- 3. tests, GPU on
section "tests"
if ((built)); then
  t0=$SECONDS
  ctest_jobs=$((jobs < 8 ? jobs : 8))
  ctest --test-dir "$build" -j"$ctest_jobs" --timeout 900 -V --output-junit "$out/ctest-junit.xml" \
    >"$out/ctest.log" 2>&1
  ctest_rc=$?
  secs=$((SECONDS - t0))
  # Summary lines of ctest: "  12/80 Test  #5: name ......   Passed    0.20 sec"
  passed=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* +Passed +[0-9.]+ sec' "$out/ctest.log")
  skipped=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*\*\*\*Skipped|^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Skipped ' "$out/ctest.log")
  total=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$out/ctest.log")
  failed=$((total - passed - skipped))
  nogpu=$(grep -c 'SKIPPED: no GPU' "$out/ctest.log")
  grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$out/ctest.log" | grep -v ' Passed ' | head -40
  grep -E '^[0-9]+% tests passed|^Total Test time' "$out/ctest.log"
  if ((nogpu > 0)); then
    echo
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    echo "!!! $nogpu test outputs say 'SKIPPED: no GPU' ON A GPU MACHINE: the CUDA backend did not"
    echo "!!! register or found no device. The GPU tests did not run."
    grep -o 'SKIPPED: no GPU[^"]*' "$out/ctest.log" | sort | uniq | head -10
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    record "tests: GPU ran" FAILED 0 "$nogpu outputs say 'SKIPPED: no GPU'"
  else
    record "tests: GPU ran" ok 0 "no test output says 'SKIPPED: no GPU'"
  fi
  if ((ctest_rc == 0 && failed == 0 && total > 0)); then res=ok; else res=FAILED; fi
  record "tests" "$res" "$secs" "passed $passed, failed $failed, skipped $skipped (of $total); ctest.log"
else
  record "tests" skipped 0 "nothing built"
fi

# ---------------------------------------------------------------- 4. benchmarks with a PyTorch twin
section "benchmarks"
shopt -s nullglob
twins=(benchmarks/*.py)
shopt -u nullglob
if ((${#twins[@]} == 0)); then
  record "benchmarks" absent 0 "no benchmarks/*.py twin yet"
fi
# bench_torch.py twins two programs (bench_core, bench_layers): its one JSON is compared with each.
# bench_allreduce_torch.py is not a Google Benchmark twin (section 4b runs it).
for py in "${twins[@]}"; do
  pyname=$(basename "$py" .py)
  case $pyname in
    bench_torch) programs=(bench_core bench_layers) ;;
    bench_allreduce_torch) continue ;;
    *) programs=("$pyname") ;;
  esac
  torch_json=$out/$pyname.torch.json
  echo "-- $python $py --out $torch_json"
  t0=$SECONDS
  timeout "$bench_timeout" "$python" "$py" --out "$torch_json" >"$out/$pyname.torch.log" 2>&1
  rc_t=$?
  for name in "${programs[@]}"; do
  exe=$build/benchmarks/$name
  if [[ ! -x $exe ]]; then
    record "bench $name" FAILED 0 "$exe not built"
    continue
  fi
  echo "-- $exe"
  timeout "$bench_timeout" "$exe" --benchmark_out="$out/$name.ember.json" --benchmark_out_format=json \
    --benchmark_repetitions=5 --benchmark_report_aggregates_only=true >"$out/$name.ember.log" 2>&1
  rc_e=$?
  if ((rc_e != 0 || rc_t != 0)); then
    record "bench $name" FAILED $((SECONDS - t0)) "exit ember $rc_e, torch $rc_t (see $name.ember.log, $pyname.torch.log)"
    continue
  fi
  ratio=$("$python" - "$out/$name.ember.json" "$torch_json" "$out/$name.ratios.txt" <<'PY'
import json, math, sys
scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
def times(path):
    data = json.load(open(path))
    if "benchmarks" not in data:  # bench_torch.py writes {name: milliseconds}
        return {k: float(v) * 1e-3 for k, v in data.items()}
    t = {}
    for r in data["benchmarks"]:  # medians when there are repetitions, else the plain runs
        name = r.get("run_name", r["name"]).replace("/real_time", "")
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
    for n in common:
        f.write(f"{n}\tember {e[n]*1e6:.2f} us\ttorch {p[n]*1e6:.2f} us\tratio {e[n]/p[n]:.3f}\n")
if not common:
    print("no matching case names")
else:
    g = math.exp(sum(math.log(e[n] / p[n]) for n in common) / len(common))
    worst = max(common, key=lambda n: e[n] / p[n])
    print(f"{g:.3f} (geomean of {len(common)} cases; worst {worst} {e[worst]/p[worst]:.2f})")
PY
  )
  if [[ $ratio == [0-9]* ]]; then
    record "bench $name" ok $((SECONDS - t0)) "ember/PyTorch time $ratio"
  else
    record "bench $name" FAILED $((SECONDS - t0)) "${ratio:-ratio not computed}"
  fi
  t0=$SECONDS
  done
done

# ---------------------------------------------------------------- 4b. all-reduce bandwidth, NCCL
# bench_allreduce_nccl (one rank on cuda:0, then --single-process over every visible GPU) and its
# PyTorch twin (torchrun, one process per GPU), up to 256 MiB; the tables go to allreduce.*.log.
# Detail: algbw and busbw of the largest size (busbw is 0 for one rank).
section "all-reduce bandwidth (NCCL)"
allreduce_max=${EMBER_ALLREDUCE_MAX_BYTES:-256M}
allreduce_run() { # allreduce_run STEP LOG COMMAND...
  local step=$1 log=$2 t0=$SECONDS rc
  shift 2
  echo "-- $*"
  timeout "$bench_timeout" "$@" >"$out/$log" 2>&1
  rc=$?
  cat "$out/$log"
  if ((rc == 0)) && grep -qE '^ +[0-9]+ .* ok$' "$out/$log" && ! grep -q WRONG "$out/$log"; then
    record "$step" ok $((SECONDS - t0)) "$(awk '/^ +[0-9]/ {s=$1; a=$5; b=$6} END {printf "%g MiB: algbw %s GB/s, busbw %s GB/s", s/1048576, a, b}' "$out/$log")"
  else
    record "$step" FAILED $((SECONDS - t0)) "exit $rc$(grep -q WRONG "$out/$log" && echo ', WRONG values'); see $log"
  fi
}
ar_exe=$build/benchmarks/bench_allreduce_nccl
if [[ -x $ar_exe ]]; then
  allreduce_run "allreduce nccl 1 rank" allreduce.ember.log "$ar_exe" --backend nccl --max-bytes "$allreduce_max"
  allreduce_run "allreduce nccl single" allreduce.ember-single.log "$ar_exe" --single-process --max-bytes "$allreduce_max"
else
  record "allreduce nccl" FAILED 0 "$ar_exe not built"
fi
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
allreduce_run "allreduce torch" allreduce.torch.log "$python" -m torch.distributed.run --standalone \
  --nproc_per_node="$((ngpu > 0 ? ngpu : 1))" benchmarks/bench_allreduce_torch.py --max-bytes "$allreduce_max"

print_table | tee "$out/summary.txt"
((failures == 0))
