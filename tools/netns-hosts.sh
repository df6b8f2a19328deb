#!/bin/bash
# Runs examples/ddp_train across three simulated hosts: network namespaces h1, h2, h3 on this
# machine, each joined by a veth pair to a fourth namespace that holds a Linux bridge (the switch);
# addresses 10.77.0.1-3 exist only inside the namespaces. Each host has its own UTS hostname
# (unshare --uts) so Open MPI sees three nodes; TCP only; mpirun (in h1) starts the remote daemons
# through a small rsh agent that runs the command in the other namespace. Checks:
#   1. -np 3 across h1 h2 h3 gives the same final_train_loss and test_accuracy as -np 3 on one host;
#      --zero 3 (FullyShardedDataParallel: all_gather and reduce_scatter over TCP) with -np 2 across
#      h1 h2 the same as -np 2 on one host;
#   2. a stopped remote rank (--fail-rank 2, on h3): the others time out (EMBER_DIST_TIMEOUT_S=2)
#      and abort the job, status 75;
#   3. the remote rank on h3 SIGKILLed mid-run: the job ends non-zero;
#   4. a cut link: h3's switch port is taken down mid-run (its rank alive but unreachable). Measured
#      (Open MPI 4.1.4): the ranks on h1 and h2 print the DistributedError ~2 s after the cut and
#      call MPI_Abort(75), but mpirun cannot reach h3's daemon and waits until `mpirun --timeout`
#      ends it (status 75); h3's rank times out the same way and exits by itself, h3's orted stays
#      (until TCP gives up, ~15 min). Checked: the error within 10 s of the cut, status 75 through
#      --timeout, the cut-off rank gone; the leftover processes are listed and killed.
# Every command is bounded by `timeout`; on exit (also on failure or a signal) the processes left
# in the namespaces are killed and the namespaces (with their links) deleted. ~30 s on 2 cores.
# Needs root and `ip netns`; prints "SKIPPED: <reason>" otherwise.
#   tools/netns-hosts.sh <build-dir>
set -u
BUILD=${1:?usage: netns-hosts.sh <build-dir>}
BUILD=$(cd "$BUILD" && pwd)
EXE=$BUILD/examples/ddp_train
[ "$(id -u)" = 0 ] || { echo "SKIPPED: needs root"; exit 0; }
command -v ip >/dev/null && command -v unshare >/dev/null || { echo "SKIPPED: needs ip and unshare"; exit 0; }
[ -x "$EXE" ] || { echo "SKIPPED: $EXE not built"; exit 0; }
# Namespaces left by an earlier run that was SIGKILLed (its pid no longer runs).
for n in $(ip netns list 2>/dev/null | grep -o '^ember_\(sw\|h[123]\)_[0-9]*'); do
  [ -d "/proc/${n##*_}" ] && continue
  for p in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done; ip netns del "$n" 2>/dev/null
done
SW=ember_sw_$$; HN=(ember_h1_$$ ember_h2_$$ ember_h3_$$)
WORK=$(mktemp -d)
reap() { for n; do for p in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done; done; }
cleanup() {
  trap - EXIT INT TERM
  reap "${HN[@]}" "$SW"; sleep 0.2
  for n in "${HN[@]}" "$SW"; do ip netns del "$n" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "FAILED: interrupted"; exit 1' INT TERM
ip netns add "$SW" || { echo "SKIPPED: ip netns add failed"; exit 0; }
ip -n "$SW" link add br0 type bridge forward_delay 0 stp_state 0 || { echo "SKIPPED: no bridge"; exit 0; }
ip -n "$SW" link set lo up; ip -n "$SW" link set br0 up
for i in 1 2 3; do
  n=${HN[$((i - 1))]}
  ip netns add "$n" || { echo "SKIPPED: ip netns add failed"; exit 0; }
  ip -n "$SW" link add p$i type veth peer name eth0 netns "$n" || { echo "SKIPPED: no veth"; exit 0; }
  ip -n "$SW" link set p$i master br0; ip -n "$SW" link set p$i up
  ip -n "$n" addr add 10.77.0.$i/24 dev eth0; ip -n "$n" link set eth0 up; ip -n "$n" link set lo up
done
# The rsh agent: `agent [options] <host> <command...>`; runs the command in that host's namespace.
cat > "$WORK/agent" <<AGENT
#!/bin/bash
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
case \$host in 10.77.0.[123]) i=\${host##*.};; *) echo "agent: unknown host \$host" >&2; exit 1;; esac
exec ip netns exec ember_h\${i}_$$ unshare --uts /bin/sh -c "hostname h\$i; \$*"
AGENT
chmod +x "$WORK/agent"
printf '10.77.0.1 slots=1\n10.77.0.2 slots=1\n10.77.0.3 slots=1\n' > "$WORK/hosts"
printf '10.77.0.1 slots=1\n10.77.0.2 slots=1\n' > "$WORK/hosts2"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The settings that change numerics travel to the remote ranks (only those that are set).
PASS=""
for v in OPENBLAS_CORETYPE OMP_NUM_THREADS OPENBLAS_NUM_THREADS; do [ -n "${!v+x}" ] && PASS="$PASS -x $v"; done
TCP="--map-by node --mca plm_rsh_agent $WORK/agent --mca btl tcp,self
  --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24$PASS"
MPI="mpirun -np 3 --hostfile $WORK/hosts $TCP"
MPI2="mpirun -np 2 --hostfile $WORK/hosts2 $TCP"
in_h1() { timeout -k 5 "$1" ip netns exec "${HN[0]}" unshare --uts /bin/sh -c 'hostname h1; shift; exec "$@"' sh x "${@:2}"; }
# final_train_loss and test_accuracy of ddp_train's JSON line (the rest is timing).
result() { grep -o '"final_train_loss": [0-9.e+-]*\|"test_accuracy": [0-9.e+-]*' | tr '\n' ' '; }
# Seconds since $1 (an $EPOCHREALTIME), one decimal.
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
# The pid of ddp_train in h3's namespace, waiting up to 10 s for it.
h3_rank() {
  local i p
  for i in $(seq 1 100); do
    for p in $(ip netns pids "${HN[2]}"); do [ "$(cat /proc/$p/comm 2>/dev/null)" = ddp_train ] && { echo "$p"; return; }; done
    sleep 0.1
  done
}
ARGS="--epochs 1 --seed 3"
status=0
hosts=$(in_h1 60 $MPI hostname 2>&1 | sort | tr '\n' ' ')
echo "hostnames: $hosts"
[ "$hosts" = "h1 h2 h3 " ] || { echo "FAILED: the ranks do not run on h1, h2 and h3"; exit 1; }

# 1. Equality with the one-host run.
one=$(timeout -k 5 120 mpirun -np 3 --oversubscribe --mca btl self,vader $EXE $ARGS 2>&1 | result)
three=$(in_h1 120 $MPI $EXE $ARGS 2>"$WORK/err" | result)
echo "one host:    $one"; echo "three hosts: $three"
if [ -n "$one" ] && [ "$one" = "$three" ]; then echo "ok: equal"; else echo "FAILED: differ"; cat "$WORK/err"; status=1; fi
one=$(timeout -k 5 120 mpirun -np 2 --oversubscribe --mca btl self,vader $EXE $ARGS --zero 3 2>&1 | result)
two=$(in_h1 120 $MPI2 $EXE $ARGS --zero 3 2>"$WORK/err" | result)
echo "--zero 3, one host: $one"; echo "--zero 3, two hosts: $two"
if [ -n "$one" ] && [ "$one" = "$two" ]; then echo "ok: equal"; else echo "FAILED: differ"; cat "$WORK/err"; status=1; fi

# 2. A rank that stops (--fail-rank 2, on h3): the others time out (EMBER_DIST_TIMEOUT_S=2, passed
# with -x) and abort the job: status 75 within 60 s.
t0=$EPOCHREALTIME
in_h1 90 $MPI -x EMBER_DIST_TIMEOUT_S=2 $EXE --epochs 1 --fail-rank 2 >"$WORK/out" 2>&1; rc=$?; t=$(since $t0)
echo "stopped remote rank: status $rc after $t s"
if [ $rc = 75 ] && [ ${t%.*} -lt 60 ]; then echo "ok: aborted"; else echo "FAILED: expected 75 within 60 s"; tail -20 "$WORK/out"; status=1; fi
reap "${HN[@]}"

# 3. The remote rank on h3 SIGKILLed mid-run: the job must end non-zero within 60 s.
t0=$EPOCHREALTIME
in_h1 90 $MPI $EXE --epochs 200 >"$WORK/out" 2>&1 &
job=$!
victim=$(h3_rank)
sleep 1
[ -n "$victim" ] && kill -9 "$victim"
wait $job; rc=$?; t=$(since $t0)
echo "killed remote rank (pid ${victim:-none}): status $rc after $t s"
if [ -n "$victim" ] && [ $rc != 0 ] && [ $rc != 124 ] && [ ${t%.*} -lt 60 ]; then echo "ok: job ended"; else echo "FAILED: expected a non-zero end within 60 s"; tail -20 "$WORK/out"; status=1; fi
reap "${HN[@]}"

# 4. A cut link: h3's port on the switch goes down 1 s into the run (h3's eth0 stays up, without
# carrier; its rank keeps running, unreachable). mpirun cannot reach h3's daemon after the abort,
# so `mpirun --timeout` bounds the job (the outer timeout only backs it up).
MT=10
t0=$EPOCHREALTIME
in_h1 40 $MPI --timeout $MT -x EMBER_DIST_TIMEOUT_S=2 $EXE --epochs 200 >"$WORK/out" 2>&1 &
job=$!
victim=$(h3_rank)
sleep 1
early=$(grep -c DistributedError "$WORK/out")
tc=$EPOCHREALTIME
ip -n "$SW" link set p3 down
t_err=""; t_gone=""
while kill -0 $job 2>/dev/null; do
  [ -z "$t_err" ] && grep -q "DistributedError.*timed out" "$WORK/out" && t_err=$(since $tc)
  [ -z "$t_gone" ] && [ -n "$victim" ] && ! kill -0 "$victim" 2>/dev/null && t_gone=$(since $tc)
  sleep 0.2
done
wait $job; rc=$?; t=$(since $t0)
[ -z "$t_err" ] && grep -q "DistributedError.*timed out" "$WORK/out" && t_err=$(since $tc)
[ -z "$t_gone" ] && [ -n "$victim" ] && ! kill -0 "$victim" 2>/dev/null && t_gone="$(since $tc) (or earlier)"
left=""; for p in $(ip netns pids "${HN[2]}"); do left="$left $(cat /proc/$p/comm 2>/dev/null)"; done
echo "cut link (h3, pid ${victim:-none}): error after ${t_err:-never} s, status $rc after $t s," \
  "$(grep -q 'time limit for job execution has been reached' "$WORK/out" && echo "through mpirun --timeout $MT" || echo "mpirun ended by itself");" \
  "cut-off rank gone after ${t_gone:-never} s; left in h3:${left:- nothing}"
if [ -n "$victim" ] && [ "$early" = 0 ] && [ -n "$t_err" ] && [ ${t_err%.*} -lt 10 ]; then echo "ok: the survivors timed out"
else echo "FAILED: expected a DistributedError (timed out) within 10 s of the cut, none before"; tail -20 "$WORK/out"; status=1; fi
if [ $rc = 75 ] && [ ${t%.*} -lt $((MT + 10)) ]; then echo "ok: job ended with 75"
else echo "FAILED: expected status 75 within $((MT + 10)) s"; tail -20 "$WORK/out"; status=1; fi
if [ -n "$t_gone" ]; then echo "ok: the cut-off rank exited"; else echo "FAILED: the cut-off rank still runs"; status=1; fi

[ $status = 0 ] && echo "all checks passed"
exit $status
