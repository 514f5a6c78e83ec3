#!/usr/bin/env bash
# Per-unit overhead per training step, ours against PyTorch FSDP2, in one run: a model of many
# tiny units (Linear(64, 64) then LayerNorm, 64 units, batch 8, SGD, one intra-op thread per
# rank) timed without FSDP and with it at W = 1 and 2, each side on its own runtime
# (bench/unit_overhead.cpp, bench/reference/unit_overhead.py). Every configuration runs twice,
# the two sides alternating, so drift hits both alike. Overhead per unit = (median FSDP step -
# median no-FSDP step of the same side) / units.
#
#   cmake --build build --target unit-overhead && bash bench/unit_overhead.sh [UNITS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
units="${1:-64}"
steps="${2:-60}"
py="${FSDP_PYTHON:-.venv/bin/python3}"
torchrun="$(dirname "$py")/torchrun"
ours=build/bench/unit-overhead
ref=bench/reference/unit_overhead.py
flags="--units $units --steps $steps"
mpi="${MPI:-0}"
mpirun="${MPIRUN:-mpirun --allow-run-as-root --oversubscribe}"
out="$(mktemp)"
for repeat in 1 2; do
  "$ours" --no-fsdp $flags >> "$out"
  "$py" "$ref" --no-fsdp $flags >> "$out"
  for w in 1 2; do
    OMP_NUM_THREADS=1 "$torchrun" --standalone --nproc-per-node "$w" --no-python "$ours" $flags >> "$out"
    OMP_NUM_THREADS=1 "$torchrun" --standalone --nproc-per-node "$w" "$ref" $flags 2>/dev/null >> "$out"
    if [ "$mpi" = 1 ]; then
      env -u MASTER_ADDR -u MASTER_PORT $mpirun -np "$w" "$ours" $flags >> "$out"
    fi
  done
done
"$py" - "$out" "$units" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
units = int(sys.argv[2])
def median(side, fsdp, world):
    if not fsdp and side == "ours-mpi":
        side = "ours"  # the same program without FSDP: no backend involved
    return statistics.median(r["median_step_us"] for r in rows
                             if r["side"] == side and r["fsdp"] == fsdp and r["world"] == world)
print(f"{units} units of Linear(64, 64) + LayerNorm, batch 8; median step time in us "
      f"(median of two runs of each)")
print("| | no FSDP | W=1 | W=2 | overhead per unit, W=1 | W=2 |")
print("|---|---|---|---|---|---|")
over = {}
sides = ["ours", "fsdp2"] + (["ours-mpi"] if any(r["side"] == "ours-mpi" for r in rows) else [])
for side in sides:
    base, w1, w2 = median(side, False, 1), median(side, True, 1), median(side, True, 2)
    over[side] = ((w1 - base) / units, (w2 - base) / units)
    print(f"| {side} | {base:,.0f} | {w1:,.0f} | {w2:,.0f} | {over[side][0]:,.1f} | {over[side][1]:,.1f} |")
for side in [s for s in sides if s != "fsdp2"]:
    print(f"{side} / FSDP2 overhead per unit: W=1 {over[side][0] / over['fsdp2'][0]:.3f}, "
          f"W=2 {over[side][1] / over['fsdp2'][1]:.3f}")
PY
