#!/usr/bin/env bash
# Every collective on the gloo backend against the mpi backend, one after the other in one run,
# at W ranks on this host: fsdp-comm-bench's slowest-rank median per call and busbw, 1 KiB to
# 256 MiB, and the ratio gloo time / mpi time.
#
#   cmake --build build --target fsdp-comm-bench && bash bench/comm_backends.sh [W] [max-bytes]
#
# Environment: MPIRUN (default mpirun --allow-run-as-root --oversubscribe), PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
w="${1:-2}"
max="${2:-256M}"
mpirun="${MPIRUN:-mpirun --allow-run-as-root --oversubscribe}"
py="${PYTHON:-.venv/bin/python3}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
flags="--max-bytes $max --iters 100 --time-budget-s 2"
echo "== build/fsdp-comm-bench --nproc $w --backend gloo $flags" >&2
build/fsdp-comm-bench --nproc "$w" --backend gloo $flags --output "$out/gloo.json" > /dev/null
echo "== $mpirun -np $w build/fsdp-comm-bench $flags" >&2
env -u MASTER_ADDR -u MASTER_PORT $mpirun -np "$w" build/fsdp-comm-bench $flags \
  --output "$out/mpi.json" > /dev/null
"$py" - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
runs = {b: json.load(open(os.path.join(out, b + ".json"))) for b in ("gloo", "mpi")}
by = {b: {(m["collective"], m["size_bytes"]): m for m in r["results"]} for b, r in runs.items()}
w = runs["mpi"]["world_size"]
print(f"W = {w}, fp32; time: the slowest rank's median per call")
print("| collective | size | gloo (us) | mpi (us) | gloo / mpi | gloo busbw (GB/s) | mpi busbw (GB/s) |")
print("|---|---|---|---|---|---|---|")
def size(b):
    for unit, scale in (("M", 2**20), ("K", 2**10)):
        if b >= scale and b % scale == 0:
            return f"{b // scale} {unit}iB"
    return f"{b} B"
for key in sorted(by["mpi"], key=lambda k: (k[0], k[1])):
    if key not in by["gloo"]:
        continue
    g, m = by["gloo"][key], by["mpi"][key]
    print(f"| {key[0]} | {size(key[1])} | {g['time_s'] * 1e6:,.1f} | {m['time_s'] * 1e6:,.1f} | "
          f"{g['time_s'] / m['time_s']:,.1f} | {g['busbw_gbs']:.3f} | {m['busbw_gbs']:.3f} |")
print()
for b in ("gloo", "mpi"):
    fits = ", ".join(f"{c} {f['alpha_s'] * 1e6:.1f} us + {f['beta_s_per_byte'] * 1e9:.3f} ns/B"
                     for c, f in sorted(runs[b]["fit"].items()) if f.get("points", 0) >= 2)
    print(f"{b} alpha-beta fits: {fits}")
PY
