#!/usr/bin/env bash
# shellcheck disable=SC2317  # the functions run through on_both
# How much compute a collective between the hosts takes from the cores: one thread's compute on
# each host of cluster.sh, alone and then while gloo's all-gathers and reduce-scatters run across
# the link (fsdp-comm-bench, one rank per host), and the fraction of its speed lost meanwhile.
# Two loops: lib.sh's matmul_on (a GPT-2 MLP matmul, compute-bound) and block_on (a GPT-2 block's
# forward and backward, matmuls and the memory-bound work between them). The block's fraction is
# a hardware file's network_cpu_fraction (fsdp-plan: compute beside a hidden collective between
# nodes runs that much slower; [Note: hidden collectives take CPU within a node]), since the
# planner's compute is the model's; the matmul's shows how much of it the copies' memory traffic
# adds.
#
#   bash scripts/run.sh build && bash bench/cluster/network_cpu.sh [PROFILE] [SECONDS] [BYTES]
#
# PROFILE defaults to 1g, SECONDS (each loop's length) to 20, BYTES (the collectives' size) to
# 32M, about one GPT-2 block's gather. Both hosts share this machine's cores, as in training on
# the cluster, so one loop a host is one a core. Needs root. Environment: PYTHON (as lib.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=bench/cluster/lib.sh
. bench/cluster/lib.sh
profile="${1:-1g}"
seconds="${2:-20}"
bytes="${3:-32M}"
scratch_dir_removed_on_exit

# run_loop HOST KIND TAG: lib.sh's KIND_on (matmul or block) for $seconds, its rate written to
# $out/KIND_TAG_HOST.
run_loop() { "$2_on" "$1" "$seconds" > "$out/$2_$3_$1"; }
idle_matmul() { run_loop "$1" matmul idle; }
idle_block() { run_loop "$1" block idle; }
# The collectives start first and outlast the loop: half its length and 2 s each, the loop
# starting 3 s in.
loaded() {
  rank_of_two_on "$1" 29503 build/fsdp-comm-bench --backend gloo \
    --collectives all_gather,reduce_scatter \
    --min-bytes "$bytes" --max-bytes "$bytes" --iters 100000 --warmup 1 \
    --time-budget-s $((seconds / 2 + 2)) --timeout-s 300 --output "$out/bench_$1.json" >/dev/null &
  local bench=$!
  sleep 3
  run_loop "$1" "$2" loaded
  wait "$bench"
}
loaded_matmul() { loaded "$1" matmul; }
loaded_block() { loaded "$1" block; }

bash "$cluster" up "$profile" | sed "s/^/   /" >&2
collectives="fsdp-comm-bench --backend gloo --collectives all_gather,reduce_scatter --min-bytes $bytes --max-bytes $bytes"
for kind in matmul block; do
  say "one $kind loop a host, ${seconds} s, idle"
  on_both "idle_$kind"
  say "the same while $collectives runs across the link"
  on_both "loaded_$kind"
done
bash "$cluster" down

"$PYTHON" - "$out" "$profile" "$bytes" <<'PY'
import sys
out, profile, size = sys.argv[1:]
print(f"{profile}: one thread's compute per host, idle and beside gloo's {size} all-gathers and "
      "reduce-scatters across the link")
print("| loop | host | idle | beside the collectives | speed lost |")
print("|---|---|---|---|---|")
lost = {}
for kind, unit in (("matmul", "GFLOP/s"), ("block", "tokens/s")):
    for h in (0, 1):
        idle = float(open(f"{out}/{kind}_idle_{h}").read())
        loaded = float(open(f"{out}/{kind}_loaded_{h}").read())
        lost.setdefault(kind, []).append(1 - loaded / idle)
        print(f"| {kind} ({unit}) | {h} | {idle:.2f} | {loaded:.2f} | {lost[kind][-1]:.3f} |")
mean = {kind: sum(v) / len(v) for kind, v in lost.items()}
print(f"mean speed lost: matmul {mean['matmul']:.3f}, "
      f"block {mean['block']:.3f} (network_cpu_fraction)")
PY
