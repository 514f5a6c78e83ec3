#!/usr/bin/env bash
# Faults on a real mpirun across the two hosts of cluster.sh: fsdp-train on the mpi backend, one
# rank per host, started by one mpirun on host 0 (lib.sh's mpirun_across), and once it has
# trained a few steps:
# - host: every process on host 1 is killed (its rank and Open MPI's daemon), as a host that
#   dies;
# - rank: only host 1's rank is killed; its daemon lives and reports it;
# - link: host 0's end of the link is set down and stays down.
# For each, how long after the fault mpirun exited, its exit status, and each rank's last
# lines (mpirun --output-filename: each host's daemon writes its ranks' output to files, so a
# rank's message survives a link that cannot carry it to mpirun).
#
#   bash scripts/run.sh build && bash bench/cluster/mpi_faults.sh [PROFILE] [TIMEOUT_S] [FAULTS]
#
# PROFILE defaults to 1g, TIMEOUT_S (fsdp-train's --timeout-s) to 10, FAULTS to "host rank link".
# mpirun is given 3 x TIMEOUT_S + 30 s before it is called hung and killed. The cluster is made
# per fault and removed after. Needs root.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=bench/cluster/lib.sh
. bench/cluster/lib.sh
profile="${1:-1g}"
timeout_s="${2:-10}"
faults="${3:-host rank link}"
scratch_dir_removed_on_exit
flags=(--model tiny --global-batch 8 --seq-len 32 --seed 11 --steps 1000000 --log-every 1
       --timeout-s "$timeout_s")

# Pids of host 1's processes named NAME (pgrep by exact name, within that namespace only).
host1_pids() {
  local pid
  for pid in $(ip netns pids fsdpcl-h1); do
    if [ -z "$1" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ]; then echo "$pid"; fi
  done
}

for fault in $faults; do
  bash "$cluster" up "$profile" >/dev/null
  dir="$out/$fault"
  mkdir -p "$dir"
  metrics="$dir/metrics.jsonl"
  say "$fault: mpirun (2 hosts x 1) $bin --backend mpi ${flags[*]} --output-filename ..."
  # shellcheck disable=SC2016  # expanded by the inner bash
  ( rc=0
    timeout -k 5 $((3 * timeout_s + 30)) bash -c '
      cd "$1"; d="$2"; shift 2; . bench/cluster/lib.sh; mpirun_across 1 -x FSDP_FLIGHT_RECORDER_DIR="$d" --output-filename "$@"' \
      _ "$PWD" "$dir" "$dir/ranks" "$bin" --backend mpi "${flags[@]}" --metrics "$metrics" \
      > "$dir/mpirun.out" 2>&1 || rc=$?
    echo "$rc" > "$dir/rc"
    date +%s.%N > "$dir/end" ) &
  job=$!
  for _ in $(seq 600); do
    if [ -f "$metrics" ] && [ "$(wc -l < "$metrics")" -ge 3 ]; then break; fi
    sleep 0.1
  done
  if ! [ -f "$metrics" ] || [ "$(wc -l < "$metrics")" -lt 3 ]; then
    cat "$dir/mpirun.out" >&2
    exit 1
  fi
  at="$(date +%s.%N)"
  case "$fault" in
    host)
      # shellcheck disable=SC2046  # pids, one a word
      kill -9 $(host1_pids "") ;;
    rank)
      # shellcheck disable=SC2046
      kill -9 $(host1_pids fsdp-train) ;;
    link) ip -n fsdpcl-h0 link set fsdpcl-v0 down ;;
  esac
  while [ ! -s "$dir/end" ]; do sleep 0.1; done
  wait "$job" 2>/dev/null || true
  end="$(cat "$dir/end")"
  echo "### fault: $fault"
  echo "mpirun exited $(awk -v a="$at" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s after it, status $(cat "$dir/rc") (124: killed as hung)"
  echo "steps trained: $(wc -l < "$metrics")"
  echo "--- mpirun's own output (its first lines from Open MPI, or a crash's first lines)"
  grep -v -E '^\s*$|socket.cpp|^step |^fsdp-train: (model|[0-9])|^-+$' "$dir/mpirun.out" | head -n 8 || true
  for f in "$dir"/ranks/1/rank.*/stderr; do
    [ -f "$f" ] || continue
    echo "--- $(basename "$(dirname "$f")") stderr, last written $(awk -v a="$at" -v b="$(stat -c %.9Y "$f")" 'BEGIN { printf "%.1f", b - a }') s after the fault (lines naming a collective or a timeout)"
    grep -E "timed out|all-gather|reduce-scatter|all_gather|reduce_scatter|all_reduce|rank [0-9]|MPI" "$f" | head -n 6 || true
  done
  for h in 0 1; do
    echo "processes left on host $h: $(for p in $(ip netns pids "fsdpcl-h$h"); do cat "/proc/$p/comm"; done | tr '\n' ' ')"
  done
  bash "$cluster" down
done
