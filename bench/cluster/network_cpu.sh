#!/usr/bin/env bash
# shellcheck disable=SC2317  # the functions run through on_both
# How much compute a collective between the hosts takes from the cores: a single-threaded matmul
# loop on each host of cluster.sh, alone and then while gloo's all-gathers and reduce-scatters
# run across the link (fsdp-comm-bench, one rank per host), and the fraction of the loop's speed
# lost meanwhile. That fraction is a hardware file's network_cpu_fraction (fsdp-plan: compute
# beside a hidden collective between nodes runs that much slower; [Note: hidden collectives take
# CPU within a node]).
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

# matmul_loop HOST TAG: lib.sh's matmul_on for $seconds, its GFLOP/s written to $out/TAG_HOST.
matmul_loop() { matmul_on "$1" "$seconds" > "$out/$2_$1"; }
idle_loop() { matmul_loop "$1" idle; }
# The collectives start first and outlast the loop: half its length and 2 s each, the loop
# starting 3 s in.
loaded_loop() {
  rank_of_two_on "$1" 29503 build/fsdp-comm-bench --backend gloo \
    --collectives all_gather,reduce_scatter \
    --min-bytes "$bytes" --max-bytes "$bytes" --iters 100000 --warmup 1 \
    --time-budget-s $((seconds / 2 + 2)) --timeout-s 300 --output "$out/bench_$1.json" >/dev/null &
  local bench=$!
  sleep 3
  matmul_loop "$1" loaded
  wait "$bench"
}

bash "$cluster" up "$profile" | sed "s/^/   /" >&2
say "one matmul loop a host, ${seconds} s, idle"
on_both idle_loop
say "the same while fsdp-comm-bench --backend gloo --collectives all_gather,reduce_scatter --min-bytes $bytes --max-bytes $bytes runs across the link"
on_both loaded_loop
bash "$cluster" down

"$PYTHON" - "$out" "$profile" "$bytes" <<'PY'
import sys
out, profile, size = sys.argv[1:]
print(f"{profile}: single-threaded matmul GFLOP/s per host, idle and beside gloo's {size} "
      "all-gathers and reduce-scatters across the link")
print("| host | idle | beside the collectives | speed lost (network_cpu_fraction) |")
print("|---|---|---|---|")
lost = []
for h in (0, 1):
    idle = float(open(f"{out}/idle_{h}").read())
    loaded = float(open(f"{out}/loaded_{h}").read())
    lost.append(1 - loaded / idle)
    print(f"| {h} | {idle:.2f} | {loaded:.2f} | {lost[-1]:.3f} |")
print(f"mean speed lost: {sum(lost) / 2:.3f}")
PY
