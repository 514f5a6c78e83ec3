#!/usr/bin/env bash
# Every collective on the gloo backend against the mpi backend, one after the other in one run,
# at W ranks on this host: fsdp-comm-bench's slowest-rank median per call and busbw, 1 KiB to
# 256 MiB, and the ratio mpi time / gloo time (below 1: mpi faster) for each of the mpi
# backend's algorithm choices asked for (FSDP_MPI_ALGO: auto, native, ring; see
# src/comm/mpi/mpi_algorithm.h).
#
#   cmake --build build --target fsdp-comm-bench && bash bench/comm_backends.sh [W] [max-bytes]
#
# Environment: MPI_ALGOS (default "auto"; e.g. "native ring auto", each one mpirun job, run in
# that order after gloo), COLLECTIVES (default every one, comma-separated), MPIRUN (default
# mpirun --allow-run-as-root --oversubscribe), PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
w="${1:-2}"
max="${2:-256M}"
algos="${MPI_ALGOS:-auto}"
mpirun="${MPIRUN:-mpirun --allow-run-as-root --oversubscribe}"
py="${PYTHON:-.venv/bin/python3}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
flags="--max-bytes $max --iters 100 --time-budget-s 2"
[ -z "${COLLECTIVES:-}" ] || flags="$flags --collectives $COLLECTIVES"
echo "== load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "== build/fsdp-comm-bench --nproc $w --backend gloo $flags" >&2
build/fsdp-comm-bench --nproc "$w" --backend gloo $flags --output "$out/gloo.json" > /dev/null
for algo in $algos; do
  echo "== load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  echo "== $mpirun -x FSDP_MPI_ALGO=$algo -np $w build/fsdp-comm-bench $flags" >&2
  env -u MASTER_ADDR -u MASTER_PORT $mpirun -x FSDP_MPI_ALGO="$algo" -np "$w" \
    build/fsdp-comm-bench $flags --output "$out/mpi-$algo.json" > /dev/null
done
echo "== load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$py" - "$out" $algos <<'PY'
import json, os, sys
out, algos = sys.argv[1], sys.argv[2:]
sides = ["gloo"] + [f"mpi-{a}" for a in algos]
runs = {s: json.load(open(os.path.join(out, s + ".json"))) for s in sides}
by = {s: {(m["collective"], m["size_bytes"]): m for m in r["results"]} for s, r in runs.items()}
print(f"W = {runs['gloo']['world_size']}, fp32; time: the slowest rank's median per call (us)")
print("| collective | size | " + " | ".join(sides) + " | " +
      " | ".join(f"{s} / gloo" for s in sides[1:]) + " |")
print("|---|---|" + "---|" * (2 * len(sides) - 1))
def size(b):
    for unit, scale in (("M", 2**20), ("K", 2**10)):
        if b >= scale and b % scale == 0:
            return f"{b // scale} {unit}iB"
    return f"{b} B"
for key in sorted(by["gloo"], key=lambda k: (k[0], k[1])):
    if any(key not in by[s] for s in sides):
        continue
    t = {s: by[s][key]["time_s"] for s in sides}
    print(f"| {key[0]} | {size(key[1])} | " + " | ".join(f"{t[s] * 1e6:,.1f}" for s in sides) +
          " | " + " | ".join(f"{t[s] / t['gloo']:.2f}" for s in sides[1:]) + " |")
print()
for s in sides:
    fits = ", ".join(f"{c} {f['alpha_s'] * 1e6:.1f} us + {f['beta_s_per_byte'] * 1e9:.3f} ns/B"
                     for c, f in sorted(runs[s]["fit"].items()) if f.get("points", 0) >= 2)
    print(f"{s} alpha-beta fits: {fits}")
PY
