#!/usr/bin/env bash
# ember against PyTorch on the CPU: runs bench_vs_torch (ember) and bench_vs_torch.py
# (PyTorch) interleaved, ROUNDS rounds at each thread count, the order of the programs rotating
# every round, and prints the median seconds and the ratio table (PyTorch time / ember time; above
# 1: ember is faster), with the STREAM-like copy bandwidth measured in the same run and the share
# of it that LayerNorm, softmax and add reach.
#
#   benchmarks/vs_torch.sh --ember build/benchmarks/bench_vs_torch --python /path/to/torch/python \
#       [--before /other/build/benchmarks/bench_vs_torch] [--rounds 5] [--threads "1 2"] [--min-time 1]
#
# --before: a second ember build (e.g. of an older commit) run in the same interleaving; its column
# and ratio are printed too. OPENBLAS_CORETYPE is left as the environment has it; OPENBLAS_NUM_THREADS
# and OMP_NUM_THREADS are set to the thread count of each run (an ember without set_num_threads
# only has the BLAS's threads).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ember="" before="" python="" rounds=5 threads="1 2" min_time=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --ember) ember=$2; shift 2 ;;
    --before) before=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --min-time) min_time=$2; shift 2 ;;
    *) echo "vs_torch.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -x $ember ]] || { echo "vs_torch.sh: --ember must name the bench_vs_torch program, got '$ember'" >&2; exit 2; }
[[ -n $python ]] || { echo "vs_torch.sh: --python must name a Python with torch" >&2; exit 2; }
"$python" -c "import torch" || { echo "vs_torch.sh: $python cannot import torch (pip install torch)" >&2; exit 2; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
progs=(ember torch)
[[ -n $before ]] && progs=(before ember torch)
echo "vs_torch: $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
echo "vs_torch: torch $("$python" -c 'import torch; print(torch.__version__)'), rounds $rounds, threads $threads, min-time $min_time s"
for ((r = 0; r < rounds; ++r)); do
  for t in $threads; do
    n=${#progs[@]}
    for ((i = 0; i < n; ++i)); do
      p=${progs[$(((i + r) % n))]}
      case $p in
        ember) cmd=("$ember" --threads "$t" --min-time "$min_time") ;;
        before) cmd=("$before" --threads "$t" --min-time "$min_time") ;;
        torch) cmd=("$python" "$here/bench_vs_torch.py" --threads "$t" --min-time "$min_time") ;;
      esac
      OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t "${cmd[@]}" | sed "s/^/$p /" >>"$out/results"
    done
  done
  echo "vs_torch: round $((r + 1))/$rounds done ($(date -u +%T), load $(cut -d' ' -f1 /proc/loadavg))" >&2
done

python3 - "$out/results" "$threads" <<'EOF'
import statistics, sys
rows = {}
cores = {}
gemms = {}
for line in open(sys.argv[1]):
    f = line.split()
    if f[1] == "blas_core":
        cores[f[0]] = f[2]
        continue
    if f[1] == "gemm_library":
        gemms[f[0]] = " ".join(f[2:])
        continue
    rows.setdefault((f[0], f[1], int(f[2])), []).append(float(f[3]))
threads = [int(t) for t in sys.argv[2].split()]
med = {k: statistics.median(v) for k, v in rows.items()}
progs = sorted({k[0] for k in rows}, key=["before", "ember", "torch"].index)
names = []
for k in rows:
    if k[1] not in names and k[1] != "copy_GBps":
        names.append(k[1])
print("BLAS kernel (openblas_get_corename): " + ", ".join(f"{p}: {c}" for p, c in cores.items()))
if gemms:
    print("fp32 GEMM: " + ", ".join(f"{p}: {g}" for p, g in gemms.items()))
hdr = "| workload | " + " | ".join(f"{p} s ({t}t)" for t in threads for p in progs)
hdr += " | " + " | ".join(f"torch/ember ({t}t)" for t in threads)
if "before" in progs:
    hdr += " | " + " | ".join(f"torch/before ({t}t)" for t in threads)
print(hdr + " |")
print("|---" * (hdr.count("|")) + "|")
for n in names:
    cells = [f"{med.get((p, n, t), float('nan')):.4g}" for t in threads for p in progs]
    cells += [f"{med[('torch', n, t)] / med[('ember', n, t)]:.2f}" for t in threads]
    if "before" in progs:
        cells += [f"{med[('torch', n, t)] / med[('before', n, t)]:.2f}" for t in threads]
    print(f"| {n} | " + " | ".join(cells) + " |")
# Bytes each memory-bound workload must move at least (float32): read x + write y (forward),
# read x, gy + write gx (backward; the statistics or y are recomputed or read once more).
mb = {"layernorm_fwd": 2 * 8192 * 1024 * 4, "softmax_fwd": 2 * 8192 * 1024 * 4, "add_16M": 3 * (1 << 24) * 4,
      "layernorm_fwd_bwd": 5 * 8192 * 1024 * 4, "softmax_fwd_bwd": 5 * 8192 * 1024 * 4}
for t in threads:
    bw = statistics.median(rows[("ember", "copy_GBps", t)])
    parts = []
    for n, b in mb.items():
        for p in progs:
            if (p, n, t) in med:
                parts.append(f"{p} {n} {b / med[(p, n, t)] / 1e9:.1f} GB/s ({100 * b / med[(p, n, t)] / 1e9 / bw:.0f}%)")
    print(f"copy bandwidth at {t} thread(s): {bw:.1f} GB/s (median of the rounds); " + "; ".join(parts))
EOF
