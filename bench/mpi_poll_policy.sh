#!/usr/bin/env bash
# How the mpi backend's progress thread should wait for a collective (FSDP_MPI_POLL: spin,
# yield or backoff), measured where it matters: training steps, with W ranks on this machine's
# 2 cores (W = 4 is oversubscribed, so a spinning thread takes a core from some rank's
# compute), and the per-unit overhead benchmark, whose 64 tiny units make the step pure
# collective latency. Each policy runs twice, the policies alternating, so drift hits all alike.
#
#   cmake --build build --target fsdp-train unit-overhead && bash bench/mpi_poll_policy.sh [model] [steps]
#
# Reported per W and policy: the median step time over steps 3..N of both runs, tokens/s from
# it and the median exposed communication (fsdp-train --metrics); the unit benchmark's median
# step. Environment: MPIRUN (default mpirun --allow-run-as-root --oversubscribe), PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-small}"
steps="${2:-8}"
mpirun="${MPIRUN:-mpirun --allow-run-as-root --oversubscribe}"
py="${PYTHON:-.venv/bin/python3}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
shape="--model $model --global-batch 8 --seq-len 128 --seed 1234 --steps $steps --quiet"
for w in 2 4; do
  for run in a b; do
    for policy in spin yield backoff; do
      echo "== FSDP_MPI_POLL=$policy $mpirun -np $w build/fsdp-train $shape" >&2
      env -u MASTER_ADDR -u MASTER_PORT FSDP_MPI_POLL=$policy $mpirun -np "$w" \
        build/fsdp-train $shape --metrics "$out/train_${w}_${policy}_${run}.jsonl"
      env -u MASTER_ADDR -u MASTER_PORT FSDP_MPI_POLL=$policy $mpirun -np "$w" \
        build/bench/unit-overhead --units 64 --steps 40 > "$out/units_${w}_${policy}_${run}.json"
    done
  done
done
"$py" - "$out" "$model" "$steps" <<'PY'
import json, os, statistics, sys
out, model, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def lines(name):
    return [json.loads(l) for l in open(os.path.join(out, name)) if l.startswith("{")]
print(f"{model}, 8 x 128 tokens per step, medians over steps 3..{steps} of two runs; "
      "64-unit benchmark: median step of two runs")
print("| W | FSDP_MPI_POLL | step time (s) | tokens/s | exposed comm (s) | 64-unit step (us) |")
print("|---|---|---|---|---|---|")
for w in (2, 4):
    for policy in ("spin", "yield", "backoff"):
        rows = [x for r in "ab" for x in lines(f"train_{w}_{policy}_{r}.jsonl")[2:]]
        step = statistics.median(x["step_s"] for x in rows)
        exposed = statistics.median(x["exposed_comm_s"] for x in rows)
        units = statistics.median(lines(f"units_{w}_{policy}_{r}.json")[0]["median_step_us"]
                                  for r in "ab")
        print(f"| {w} | {policy} | {step:.3f} | {8 * 128 / step:.0f} | {exposed:.3f} | {units:,.0f} |")
PY
