#!/usr/bin/env bash
# shellcheck disable=SC2317  # the functions run through on_both
# A link that goes down for less than the collectives' timeout and comes back: the run goes on
# and ends as the uninterrupted run does, bit for bit. fsdp-train `tiny` on cluster.sh's two
# hosts, one rank each, under torchrun (gloo) and under one mpirun across the hosts (mpi): each
# first runs uninterrupted, then again with host 0's end of the link set down once 3 steps are in
# the metrics and set up DOWN_S seconds later.
#
#   bash scripts/run.sh build && bash bench/cluster/link_flap.sh [PROFILE] [DOWN_S] [TIMEOUT_S]
#
# PROFILE defaults to 1g, DOWN_S to 5, TIMEOUT_S (fsdp-train's --timeout-s; more than DOWN_S) to
# 30. Prints each run's exit status and how long its slowest step took, and compares the losses
# and gradient norms (compare_losses.py). Needs root. Environment: as lib.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=bench/cluster/lib.sh
. bench/cluster/lib.sh
profile="${1:-1g}"
down_s="${2:-5}"
timeout_s="${3:-30}"
[ "$down_s" -lt "$timeout_s" ] || { echo "link_flap.sh: DOWN_S must be under TIMEOUT_S" >&2; exit 2; }
scratch_dir_removed_on_exit
flags=(--model tiny --global-batch 8 --seq-len 32 --seed 11 --steps 12 --log-every 1 --quiet
       --timeout-s "$timeout_s")

gloo_rank() {  # HOST; needs $metrics
  torchrun_on "$1" 1 "$bin" "${flags[@]}" --metrics "$metrics"
}
mpi_job() {  # HOST; the one mpirun runs from host 0
  if [ "$1" = 0 ]; then mpirun_across 1 "$bin" --backend mpi "${flags[@]}" --metrics "$metrics"; fi
}

# Sets the link down once $metrics holds 3 steps, and up again down_s seconds later.
flap_when_training() {
  for _ in $(seq 600); do
    if [ -f "$metrics" ] && [ "$(wc -l < "$metrics")" -ge 3 ]; then break; fi
    sleep 0.1
  done
  ip -n fsdpcl-h0 link set fsdpcl-v0 down
  say "link down after step $(wc -l < "$metrics")"
  sleep "$down_s"
  ip -n fsdpcl-h0 link set fsdpcl-v0 up
  say "link up again"
}

bash "$cluster" up "$profile" | sed "s/^/   /" >&2
status=0
for launch in gloo mpi; do
  job=gloo_rank
  [ "$launch" = mpi ] && job=mpi_job
  for run in steady flap; do
    metrics="$out/${launch}_$run.jsonl"
    say "$launch ($job), $run: ${flags[*]}"
    flapper=""
    if [ "$run" = flap ]; then
      flap_when_training &
      flapper=$!
    fi
    rc=0
    on_both "$job" || rc=$?
    [ -z "$flapper" ] || wait "$flapper"
    slowest="$("$PYTHON" -c 'import json, sys; print(max(json.loads(l)["step_s"] for l in open(sys.argv[1])))' "$metrics" 2>/dev/null || echo "n/a")"
    say "$launch, $run: exit $rc, $(wc -l < "$metrics" 2>/dev/null || echo 0) steps, slowest step ${slowest} s"
    [ "$rc" = 0 ] || status=1
  done
  bench/cluster/compare_losses.py "$out/${launch}_steady.jsonl" \
    "$launch, link down ${down_s} s=$out/${launch}_flap.jsonl" || status=1
done
exit "$status"
