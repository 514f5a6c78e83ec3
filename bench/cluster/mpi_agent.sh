#!/usr/bin/env bash
# Open MPI's launch agent for the hosts of cluster.sh, in place of ssh:
#   mpirun --mca plm_rsh_agent bench/cluster/mpi_agent.sh --hostfile HOSTS ...
# mpirun calls it as ssh would be called, `mpi_agent.sh [ssh options] HOST COMMAND...`, to start
# its daemon (orted) on HOST; COMMAND is a line for the remote shell. HOST is a host's address
# (10.77.0.1 or .2) or index; the command runs in that host's namespace under sh.
set -euo pipefail
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done  # ssh options (-x, -p N): none apply
[ $# -ge 2 ] || { echo "mpi_agent.sh: usage: mpi_agent.sh HOST COMMAND..." >&2; exit 2; }
host="$1"
shift
exec bash "$(dirname "$0")/cluster.sh" exec "$host" sh -c "$*"
