#!/usr/bin/env bash
# shellcheck disable=SC2317  # comm_gloo runs through on_both
# fsdp-comm-bench across the two hosts of cluster.sh, one rank per host: gloo, then the mpi
# backend once per FSDP_MPI_ALGO asked for, and the ratio mpi time / gloo time per collective
# and size (below 1: mpi faster).
#
#   cmake --build build --target fsdp-comm-bench && bash bench/cluster/comm_two_hosts.sh [PROFILE] [MAX_BYTES]
#
# PROFILE defaults to 1g, MAX_BYTES to 256M. The cluster is made, used and removed (it must not
# be up already). gloo's ranks start from torchrun's variables on each host, the mpi backend's
# under one mpirun across the hosts (lib.sh's mpirun_across). Needs root. Environment:
# MPI_ALGOS (default "native auto"; "" runs gloo alone), COLLECTIVES (default
# all_gather,reduce_scatter,all_reduce), KEEP_DIR (copy fsdp-comm-bench's JSON, with its
# alpha-beta fits, there: gloo.json is what a hardware file's collectives take), IN_HOST=N
# (also fsdp-comm-bench with N ranks within each host, both hosts at once, kept as
# in_host.json: as in HSDP's training, where both hosts' shard groups move their bytes at the
# same moments, on cores that here the two hosts share), IN_HOST_BUSY=1 (with IN_HOST: one
# single-threaded matmul loop per rank on each host while those run, as each rank of HSDP's
# training computes beside its shard group's collectives, whose copies and sums then share the
# cores with it), PYTHON (as lib.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=bench/cluster/lib.sh
. bench/cluster/lib.sh
profile="${1:-1g}"
max_bytes="${2:-256M}"
algos="${MPI_ALGOS-native auto}"
scratch_dir_removed_on_exit
flags=(--collectives "${COLLECTIVES:-all_gather,reduce_scatter,all_reduce}" --max-bytes "$max_bytes"
       --iters 20 --time-budget-s 1 --timeout-s 300)

bash "$cluster" up "$profile" | sed "s/^/   /" >&2
comm_gloo() {
  rank_of_two_on "$1" 29502 build/fsdp-comm-bench --backend gloo "${flags[@]}" \
    --output "$out/gloo.json" >/dev/null
}
say "load $(cut -d' ' -f1-3 /proc/loadavg); $profile: fsdp-comm-bench --backend gloo ${flags[*]}, one rank per host"
on_both comm_gloo
for algo in $algos; do
  say "load $(cut -d' ' -f1-3 /proc/loadavg); $profile: mpirun (2 hosts x 1) -x FSDP_MPI_ALGO=$algo fsdp-comm-bench ${flags[*]}"
  mpirun_across 1 -x FSDP_MPI_ALGO="$algo" build/fsdp-comm-bench "${flags[@]}" \
    --output "$out/mpi-$algo.json" >/dev/null
done
if [ -n "${IN_HOST:-}" ]; then
  busy=""
  [ "${IN_HOST_BUSY:-0}" = 1 ] && busy=" beside a matmul loop per rank"
  # busy_loops HOST: IN_HOST of lib.sh's matmul loops on HOST until $out/stop_HOST exists; their
  # pids in loop_pids.
  busy_loops() {
    local i
    loop_pids=()
    for ((i = 0; i < IN_HOST; i++)); do
      matmul_on "$1" 1e9 "$out/stop_$1" >/dev/null &
      loop_pids+=($!)
    done
  }
  comm_in_host() {
    local rc=0 loop_pids=() pid
    [ -n "$busy" ] && busy_loops "$1"
    on "$1" build/fsdp-comm-bench --nproc "$IN_HOST" --backend gloo "${flags[@]}" \
      --output "$out/in_host_$1.json" >/dev/null || rc=$?
    touch "$out/stop_$1"
    for pid in "${loop_pids[@]}"; do wait "$pid" || true; done
    return "$rc"
  }
  say "load $(cut -d' ' -f1-3 /proc/loadavg); fsdp-comm-bench --nproc $IN_HOST --backend gloo ${flags[*]} within each host, both at once$busy"
  on_both comm_in_host
  cp "$out/in_host_0.json" "$out/in_host.json"
fi
say "load $(cut -d' ' -f1-3 /proc/loadavg)"
bash "$cluster" down
if [ -n "${KEEP_DIR:-}" ]; then mkdir -p "$KEEP_DIR" && cp "$out"/*.json "$KEEP_DIR"/; fi

"$PYTHON" - "$out" "$profile" $algos <<'PY'
import json, os, sys
out, profile, algos = sys.argv[1], sys.argv[2], sys.argv[3:]
sides = ["gloo"] + [f"mpi-{a}" for a in algos]
by = {s: {(m["collective"], m["size_bytes"]): m["time_s"]
          for m in json.load(open(os.path.join(out, s + ".json")))["results"]} for s in sides}
def size(b):
    for unit, scale in (("M", 2**20), ("K", 2**10)):
        if b >= scale and b % scale == 0:
            return f"{b // scale} {unit}iB"
    return f"{b} B"
print(f"{profile}, W = 2 (2 hosts x 1 rank), fp32; time: the slowest rank's median per call (us)")
print("| collective | size | " + " | ".join(sides) + " | " +
      " | ".join(f"{s} / gloo" for s in sides[1:]) + " |")
print("|---|---|" + "---|" * (2 * len(sides) - 1))
for key in sorted(by["gloo"]):
    if any(key not in by[s] for s in sides):
        continue
    t = {s: by[s][key] for s in sides}
    print(f"| {key[0]} | {size(key[1])} | " + " | ".join(f"{t[s] * 1e6:,.0f}" for s in sides) +
          " | " + " | ".join(f"{t[s] / t['gloo']:.2f}" for s in sides[1:]) + " |")
PY
