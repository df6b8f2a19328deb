#!/bin/bash
# Runs examples/ddp_train across two simulated hosts: network namespaces on this machine, linked
# by a veth pair (10.77.0.1 and 10.77.0.2, addresses only inside the namespaces), each with its own
# UTS hostname (unshare --uts) so Open MPI sees two nodes; TCP only; mpirun starts the remote
# daemon through a small rsh agent that runs the command in the other namespace. Every run is
# bounded by `timeout`. Needs root and `ip netns`; prints "SKIPPED: <reason>" otherwise.
#   tools/netns-hosts.sh <build-dir>
set -u
BUILD=${1:?usage: netns-hosts.sh <build-dir>}
BUILD=$(cd "$BUILD" && pwd)
EXE=$BUILD/examples/ddp_train
[ "$(id -u)" = 0 ] || { echo "SKIPPED: needs root"; exit 0; }
command -v ip >/dev/null && command -v unshare >/dev/null || { echo "SKIPPED: needs ip and unshare"; exit 0; }
[ -x "$EXE" ] || { echo "SKIPPED: $EXE not built"; exit 0; }
N1=ember_h1_$$; N2=ember_h2_$$
WORK=$(mktemp -d)
cleanup() { ip netns del "$N1" 2>/dev/null; ip netns del "$N2" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
ip netns add "$N1" 2>/dev/null && ip netns add "$N2" || { echo "SKIPPED: ip netns add failed"; exit 0; }
ip link add veth_a$$ netns "$N1" type veth peer name veth_b$$ netns "$N2" || { echo "SKIPPED: no veth"; exit 0; }
ip -n "$N1" addr add 10.77.0.1/24 dev veth_a$$; ip -n "$N2" addr add 10.77.0.2/24 dev veth_b$$
for n in "$N1" "$N2"; do ip -n "$n" link set lo up; done
ip -n "$N1" link set veth_a$$ up; ip -n "$N2" link set veth_b$$ up
# The rsh agent: `agent [options] <host> <command...>`; runs the command in that host's namespace.
cat > "$WORK/agent" <<AGENT
#!/bin/bash
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
case \$host in 10.77.0.1) ns=$N1; name=h1;; *) ns=$N2; name=h2;; esac
exec ip netns exec \$ns unshare --uts /bin/sh -c "hostname \$name; \$*"
AGENT
chmod +x "$WORK/agent"
printf '10.77.0.1 slots=1\n10.77.0.2 slots=1\n' > "$WORK/hosts"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The settings that change numerics travel to the remote rank (only those that are set).
PASS=""
for v in OPENBLAS_CORETYPE OMP_NUM_THREADS OPENBLAS_NUM_THREADS; do [ -n "${!v+x}" ] && PASS="$PASS -x $v"; done
MPI="mpirun -np 2 --hostfile $WORK/hosts --map-by node --mca plm_rsh_agent $WORK/agent --mca btl tcp,self
  --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24$PASS"
in_h1() { timeout "$1" ip netns exec "$N1" unshare --uts /bin/sh -c 'hostname h1; shift; exec "$@"' sh x "${@:2}"; }
# final_train_loss and test_accuracy of ddp_train's JSON line (the rest is timing).
result() { grep -o '"final_train_loss": [0-9.e+-]*\|"test_accuracy": [0-9.e+-]*' | tr '\n' ' '; }
ARGS="--epochs 1 --seed 3"
status=0
hosts=$(in_h1 60 $MPI hostname 2>&1 | sort | tr '\n' ' ')
echo "hostnames: $hosts"
[ "$hosts" = "h1 h2 " ] || { echo "FAILED: the ranks do not run on h1 and h2"; exit 1; }
one=$(timeout 120 mpirun -np 2 --oversubscribe --mca btl self,vader $EXE $ARGS 2>&1 | result)
two=$(in_h1 120 $MPI $EXE $ARGS 2>"$WORK/err" | result)
echo "one host:  $one"; echo "two hosts: $two"
if [ -n "$one" ] && [ "$one" = "$two" ]; then echo "ok: equal"; else echo "FAILED: differ"; cat "$WORK/err"; status=1; fi

# A rank that stops (--fail-rank 1, on h2): the survivor times out (EMBER_DIST_TIMEOUT_S=2, passed
# with -x) and aborts the job: status 75 within 60 s.
t0=$(date +%s)
in_h1 90 $MPI -x EMBER_DIST_TIMEOUT_S=2 $EXE --epochs 1 --fail-rank 1 >"$WORK/out" 2>&1; rc=$?; t=$(( $(date +%s) - t0 ))
echo "stopped remote rank: status $rc after $t s"
if [ $rc = 75 ] && [ $t -lt 60 ]; then echo "ok: aborted"; else echo "FAILED: expected 75 within 60 s"; tail -20 "$WORK/out"; status=1; fi

# A remote rank SIGKILLed mid-run (the ddp_train process in h2's namespace): the job must end
# non-zero within 60 s.
t0=$(date +%s)
in_h1 90 $MPI $EXE --epochs 200 >"$WORK/out" 2>&1 &
job=$!
victim=""
for i in $(seq 1 100); do
  for p in $(ip netns pids "$N2"); do [ "$(cat /proc/$p/comm 2>/dev/null)" = ddp_train ] && victim=$p; done
  [ -n "$victim" ] && break; sleep 0.1
done
sleep 1
[ -n "$victim" ] && kill -9 "$victim"
wait $job; rc=$?; t=$(( $(date +%s) - t0 ))
echo "killed remote rank (pid ${victim:-none}): status $rc after $t s"
if [ -n "$victim" ] && [ $rc != 0 ] && [ $rc != 124 ] && [ $t -lt 60 ]; then echo "ok: job ended"; else echo "FAILED: expected a non-zero end within 60 s"; tail -20 "$WORK/out"; status=1; fi
[ $status = 0 ] && echo "all checks passed"
exit $status
