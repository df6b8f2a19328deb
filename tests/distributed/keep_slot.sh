#!/bin/sh
# keep_slot.sh <program> <args...>: runs the program as a child and, when a signal kills it, stays
# alive for 60 s instead of exiting. Under mpirun this hides a rank's death from the launcher (which
# would otherwise end the whole job at once), as a launcher that does not watch its ranks would:
# the surviving ranks must then notice by themselves (their collective timeout).
"$@"
status=$?
[ "$status" -gt 128 ] && sleep 60
exit "$status"
