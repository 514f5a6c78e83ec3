#!/usr/bin/env bash
# shellcheck disable=SC2317  # the functions run through on_both
# fsdp-train against PyTorch FSDP2 on 2 hosts x 1 rank of cluster.sh, for each link profile, in
# one run; then fsdp-comm-bench across the hosts on gloo and on mpi.
#
#   bash scripts/run.sh build && bash bench/cluster/speed_two_hosts.sh [MODEL] [STEPS] [PROFILES] [MAX_BYTES]
#
# MODEL defaults to small, STEPS to 8, PROFILES to "1g 10g", MAX_BYTES (fsdp-comm-bench's largest
# size; 0 skips it) to 16M. Per profile the cluster is made, used and removed (it must not be up
# already). Both sides train the same initial weights on the same batches (as
# bench/fsdp2_side_by_side.sh: fsdp-train's --export and --dump-batches, read by
# bench/reference/fsdp2_reference.py through fsdp2_rank.py), GLOBAL_BATCH x 128 tokens per step
# (GLOBAL_BATCH defaults to 8), W = 2,
# one rank per host, alternately twice each (ours, FSDP2, ours, FSDP2). Both ranks of both sides
# are started from the same variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT;
# no LOCAL_WORLD_SIZE), so each uses one intra-op thread, as each rank of FSDP2 does (its
# cpu_count // W): the two hosts share this machine's cores. Reported: the median step time over
# steps 3..N of both runs, tokens/s from it, our exposed communication, the bytes each run sent
# on the link per step (the veth's counters), our collectives' time (comm_s: each process group's
# collectives from start to end, summed over groups) and the share of it exposed, and the ratio of
# tokens/s ours / FSDP2.
#
# PER_HOST=2 runs 2 ranks on each host (W = 4) as HSDP: each host's two ranks shard the model,
# the hosts replicate it (fsdp-train --strategy hybrid_shard --replicate 2, FSDP2 --replicate 2:
# both meshes are (2 replicas, 2 shards), ranks 0-1 on host 0), so the reduce-scatters and
# all-gathers stay in a host and only the all-reduce across replicas crosses the link.
#
# Needs root. Environment: FSDP_TRAIN_BIN, PYTHON (as lib.sh), PER_HOST (1 or 2; default 1),
# OURS_FLAGS (more fsdp-train flags for our side only, e.g. "--prefetch 2"; FSDP2 runs as it is),
# GLOBAL_BATCH (sequences per step, both sides; a larger one gives compute more time than the
# link's collectives take, where how much of them is hidden measures the overlap, not the link),
# FSDP2_ENV (VAR=value words for FSDP2's ranks only, e.g. to run them on the allocator fsdp-train
# links: "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
# MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1"; see docs/performance.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=bench/cluster/lib.sh
. bench/cluster/lib.sh
model="${1:-small}"
steps="${2:-8}"
profiles="${3:-1g 10g}"
max_bytes="${4:-16M}"
per_host="${PER_HOST:-1}"
case "$per_host" in
  1) ours_strategy=() theirs_strategy=() ;;
  2) ours_strategy=(--strategy hybrid_shard --replicate 2) theirs_strategy=(--replicate 2) ;;
  *) echo "speed_two_hosts.sh: PER_HOST must be 1 or 2, got '$per_host'" >&2; exit 2 ;;
esac
read -r -a ours_extra <<< "${OURS_FLAGS:-}"
read -r -a theirs_env <<< "${FSDP2_ENV:-}"
ours_strategy+=("${ours_extra[@]}")
world=$((2 * per_host))
scratch_dir_removed_on_exit
global_batch="${GLOBAL_BATCH:-8}"
shape=(--model "$model" --global-batch "$global_batch" --seq-len 128 --seed 1234 --quiet)

say "$bin --nproc 1 ${shape[*]} --steps 0 --export init/model.safetensors; --nproc 2 --steps $steps --dump-batches"
mkdir -p "$out/init"
"$bin" --nproc 1 "${shape[@]}" --steps 0 --export "$out/init/model.safetensors"
"$bin" --nproc "$world" "${shape[@]}" "${ours_strategy[@]}" --steps "$steps" \
  --dump-batches "$out/batches.bin" >/dev/null

# rank_env HOST LOCAL PORT: the variables of the LOCAL-th rank on HOST, of $world.
rank_env() {
  echo "RANK=$(($1 * per_host + $2)) WORLD_SIZE=$world LOCAL_RANK=$2 MASTER_ADDR=$host0 MASTER_PORT=$3"
}
# per_rank HOST FN: FN HOST LOCAL for each of the host's ranks at once; fails if one fails.
per_rank() {
  local pids=() local_rank rc=0
  for ((local_rank = 0; local_rank < per_host; local_rank++)); do
    "$2" "$1" "$local_rank" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  return "$rc"
}
ours_rank() {  # HOST LOCAL; needs $metrics
  # shellcheck disable=SC2046  # the variables, one a word
  on "$1" env $(rank_env "$1" "$2" 29500) "$bin" "${shape[@]}" "${ours_strategy[@]}" \
    --steps "$steps" --metrics "$metrics"
}
theirs_rank() {  # HOST LOCAL; needs $metrics
  # shellcheck disable=SC2046
  on "$1" env $(rank_env "$1" "$2" 29501) GLOO_SOCKET_IFNAME="fsdpcl-v$1" "${theirs_env[@]}" "$PYTHON" \
    bench/cluster/fsdp2_rank.py --mode fsdp2 --init "$out/init/model.safetensors" \
    --batches "$out/batches.bin" --metrics "$metrics" "${theirs_strategy[@]}" --quiet 2>&1 |
    { grep -v gpuGetDeviceCount || true; } >&2
}
ours() { per_rank "$1" ours_rank; }
theirs() { per_rank "$1" theirs_rank; }
# Runs side ($1) on both hosts; the link's bytes per step go to $out/$2.link.
run_side() {
  metrics="$out/$2.jsonl"
  local before
  before="$(link_tx_bytes 0)"
  on_both "$1"
  echo $((($(link_tx_bytes 0) - before) / steps)) > "$out/$2.link"
}

for profile in $profiles; do
  bash "$cluster" up "$profile" | sed "s/^/   /" >&2
  for run in a b; do
    say "$profile: ours, run $run (each host H, local rank L < $per_host: bash $cluster exec H env RANK=H*$per_host+L WORLD_SIZE=$world LOCAL_RANK=L MASTER_ADDR=$host0 MASTER_PORT=29500 $bin ${shape[*]} ${ours_strategy[*]} --steps $steps)"
    run_side ours "ours_${profile}_$run"
    say "$profile: FSDP2, run $run (each rank, as above: ... GLOO_SOCKET_IFNAME=fsdpcl-vH ${theirs_env[*]} $PYTHON bench/cluster/fsdp2_rank.py --mode fsdp2 --init ... --batches ... ${theirs_strategy[*]})"
    run_side theirs "fsdp2_${profile}_$run"
  done
  if [ "$max_bytes" != 0 ]; then
    bench_flags=(--collectives "all_gather,reduce_scatter,all_reduce" --max-bytes "$max_bytes"
                 --iters 20 --time-budget-s 1 --timeout-s 120)
    comm_gloo() {
      rank_of_two_on "$1" 29502 build/fsdp-comm-bench --backend gloo "${bench_flags[@]}" \
        --output "$out/comm_gloo_$profile.json" >/dev/null
    }
    say "$profile: fsdp-comm-bench --backend gloo ${bench_flags[*]}, one rank per host"
    on_both comm_gloo
    say "$profile: mpirun (2 hosts x 1) fsdp-comm-bench ${bench_flags[*]}"
    mpirun_across 1 build/fsdp-comm-bench "${bench_flags[@]}" --output "$out/comm_mpi_$profile.json" >/dev/null
  fi
  bash "$cluster" down
done

"$PYTHON" - "$out" "$model" "$steps" "$profiles" "$per_host" "$global_batch" <<'PY'
import json, os, statistics, sys
out, model, steps, profiles = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split()
batch = int(sys.argv[6])
per_host = int(sys.argv[5])
layout = f"W = {2 * per_host} (2 hosts x {per_host} rank{'s, HSDP' if per_host > 1 else ''})"

def load(name):
    path = os.path.join(out, name + ".jsonl")
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []

def summary(side, profile):
    rows = [x for r in "ab" for x in load(f"{side}_{profile}_{r}")[2:]]
    step_s = statistics.median(x["step_s"] for x in rows)
    link = [int(open(os.path.join(out, f"{side}_{profile}_{r}.link")).read()) for r in "ab"]
    exposed = statistics.median(x.get("exposed_comm_s", 0.0) for x in rows)
    comm = statistics.median(x.get("comm_s", 0.0) for x in rows)
    return dict(step_s=step_s, tps=batch * 128 / step_s, link=statistics.mean(link), exposed=exposed,
                comm=comm)

print(f"model {model}, {batch} x 128 tokens per step, {layout}, medians over steps "
      f"3..{steps} of two runs per side")
print("| link | side | step time (s) | tokens/s | host 0 sent on the link per step (MiB) | exposed comm (s) | comm (s) | exposed / comm |")
print("|---|---|---|---|---|---|---|---|")
ratios = []
for p in profiles:
    s = {side: summary(side, p) for side in ("ours", "fsdp2")}
    for side, name in (("ours", "fsdp-train"), ("fsdp2", "FSDP2")):
        x = s[side]
        if side == "ours":
            share = f"{x['exposed'] / x['comm']:.2f}" if x["comm"] > 0 else "n/a"
            comm = f"{x['exposed']:.3f} | {x['comm']:.3f} | {share}"
        else:
            comm = "n/a | n/a | n/a"
        print(f"| {p} | {name} | {x['step_s']:.3f} | {x['tps']:.0f} | {x['link'] / 2**20:.1f} | {comm} |")
    ratios.append((p, s["ours"]["tps"] / s["fsdp2"]["tps"]))
for p, r in ratios:
    print(f"{p}: tokens/s ours / FSDP2 {r:.3f}")

def size(b):
    for unit, scale in (("M", 2**20), ("K", 2**10)):
        if b >= scale and b % scale == 0:
            return f"{b // scale} {unit}iB"
    return f"{b} B"

for p in profiles:
    paths = {b: os.path.join(out, f"comm_{b}_{p}.json") for b in ("gloo", "mpi")}
    if not all(os.path.exists(x) for x in paths.values()):
        continue
    by = {b: {(m["collective"], m["size_bytes"]): m for m in json.load(open(x))["results"]}
          for b, x in paths.items()}
    print(f"\nfsdp-comm-bench, {p}, W = 2 (2 hosts x 1 rank), fp32; time: the slowest rank's median per call")
    print("| collective | size | gloo (us) | mpi (us) | gloo / mpi | gloo busbw (GB/s) | mpi busbw (GB/s) |")
    print("|---|---|---|---|---|---|---|")
    for key in sorted(by["mpi"]):
        if key not in by["gloo"]:
            continue
        g, m = by["gloo"][key], by["mpi"][key]
        print(f"| {key[0]} | {size(key[1])} | {g['time_s'] * 1e6:,.1f} | {m['time_s'] * 1e6:,.1f} | "
              f"{g['time_s'] / m['time_s']:.2f} | {g['busbw_gbs']:.3f} | {m['busbw_gbs']:.3f} |")
PY
