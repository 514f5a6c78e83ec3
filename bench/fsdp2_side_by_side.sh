#!/usr/bin/env bash
# fsdp-train against PyTorch FSDP2 (fully_shard over gloo, bench/reference/fsdp2_reference.py)
# on this machine, in one run: same model, initial weights, batches, optimizer and W.
#
#   bash scripts/run.sh build && bash bench/fsdp2_side_by_side.sh [model] [steps] [worlds]
#
# model defaults to small, steps to 8, worlds to "1 2 4". For each W the two sides run
# alternately, twice each (ours, FSDP2, ours, FSDP2), on 8 x 128 tokens per step. Reported per W
# and side, from the --metrics files: the median step time over steps 3..N and tokens/s from
# it; each rank's peak resident memory (VmHWM, the largest over both runs); per rank and step,
# the bytes written to sockets (/proc/self/io wchar: what the collectives sent) and the payload
# of the all-gathers and reduce-scatters; for ours, the median exposed communication
# (exposed_comm_s). Both sides also run once without any FSDP (fsdp-train --no-fsdp, and plain
# PyTorch in one process), so compute alone can be read off, and the script measures each
# side's fixed footprint (peak RSS of a process that loads the libraries and builds the tiny
# model: fsdp-train --steps 0, python3 importing torch.distributed.fsdp).
#
# With MPI=1 (and a build with the mpi backend), ours also runs as an mpirun job on the mpi
# backend, alternating with the other two, and the summary adds its ratios to ours on gloo and
# to FSDP2. FSDP_MPI_POLL passes through to it (spin, yield or backoff; see docs/launching.md).
#
# Environment: FSDP_TRAIN_BIN (default ./build/fsdp-train), PYTHON (default: the python3 whose
# torch the build uses, as in scripts/run.sh), MPI (default 0), MPIRUN (default mpirun
# --allow-run-as-root --oversubscribe).
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-small}"
steps="${2:-8}"
worlds="${3:-1 2 4}"
bin="${FSDP_TRAIN_BIN:-./build/fsdp-train}"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python3 ]; then PYTHON=.venv/bin/python3; else PYTHON=python3; fi
fi
ref="bench/reference/fsdp2_reference.py"
mpi="${MPI:-0}"
mpirun="${MPIRUN:-mpirun --allow-run-as-root --oversubscribe}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
shape="--model $model --global-batch 8 --seq-len 128 --seed 1234"

echo "== $bin --nproc 1 $shape --steps 0 --quiet --export $out/init/model.safetensors" >&2
mkdir -p "$out/init"
$bin --nproc 1 $shape --steps 0 --quiet --export "$out/init/model.safetensors"

ours() {  # W run
  echo "== $bin --nproc $1 $shape --steps $steps --quiet --metrics $out/ours_w$1_$2.jsonl" >&2
  $bin --nproc "$1" $shape --steps "$steps" --quiet --metrics "$out/ours_w$1_$2.jsonl" \
    --dump-batches "$out/batches.bin"
}
ours_mpi() {  # W run
  echo "== $mpirun -np $1 $bin $shape --steps $steps --quiet --metrics $out/mpi_w$1_$2.jsonl" >&2
  env -u MASTER_ADDR -u MASTER_PORT $mpirun -np "$1" $bin $shape --steps "$steps" --quiet \
    --backend mpi --metrics "$out/mpi_w$1_$2.jsonl"
}
theirs() {  # W run [mode]
  local mode="${3:-fsdp2}"
  echo "== $PYTHON $ref --mode $mode --nproc $1 --init ... --batches ... --metrics $out/${mode}_w$1_$2.jsonl" >&2
  "$PYTHON" "$ref" --mode "$mode" --nproc "$1" --init "$out/init/model.safetensors" \
    --batches "$out/batches.bin" --metrics "$out/${mode}_w$1_$2.jsonl" --quiet 2>&1 \
    | { grep -v "gpuGetDeviceCount" || true; } >&2
}
for w in $worlds; do
  for run in a b; do
    ours "$w" $run
    if [ "$mpi" = 1 ]; then ours_mpi "$w" $run; fi
    theirs "$w" $run
  done
done
theirs 1 a single
echo "== $bin --no-fsdp $shape --steps $steps --quiet --metrics $out/ours_nofsdp_w1_a.jsonl" >&2
$bin --no-fsdp $shape --steps "$steps" --quiet --metrics "$out/ours_nofsdp_w1_a.jsonl"
/usr/bin/time -f "%M" -o "$out/ours_footprint_kb" $bin --no-fsdp --model tiny --steps 0 --quiet
"$PYTHON" -c "import torch, torch.distributed.fsdp
print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')))" \
  > "$out/fsdp2_footprint_kb"

"$PYTHON" - "$out" "$model" "$steps" "$worlds" <<'PY'
import json, os, statistics, sys
out, model, steps, worlds = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split()

def load(name):
    path = os.path.join(out, name + ".jsonl")
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []

def summary(side, w):
    runs = [load(f"{side}_w{w}_{r}") for r in "ab"]
    runs = [r for r in runs if r]
    rows = [x for r in runs for x in r[2:]]
    step_s = statistics.median(x["step_s"] for x in rows)
    last = [r[-1] for r in runs]
    nranks = len(last[0]["ranks"])
    rss = [max(l["ranks"][k]["peak_rss_bytes"] for l in last) for k in range(nranks)]
    sent = [statistics.median(x["ranks"][k]["sent_bytes"] for x in rows) for k in range(nranks)]
    exposed = statistics.median(x.get("exposed_comm_s", 0.0) for x in rows)
    r0 = last[0]["ranks"][0]
    return dict(step_s=step_s, tokens_per_s=8 * 128 / step_s, rss=rss, sent=sent,
                exposed=exposed, ag=r0.get("all_gather_bytes", 0),
                rs=r0.get("reduce_scatter_bytes", 0), loss=last[0]["loss"])

mib = lambda b: f"{b / 2**20:.0f}"
print(f"model {model}, 8 x 128 tokens per step, medians over steps 3..{steps} of two runs per side")
print("| W | side | step time (s) | tokens/s | peak RSS per rank (MiB) | sent per rank per step (MiB) "
      "| all-gather / reduce-scatter payload per step (MiB) | exposed comm (s) |")
print("|---|---|---|---|---|---|---|---|")
ratios, mpi_ratios = [], []
for w in worlds:
    sides = [("ours", "fsdp-train"), ("fsdp2", "FSDP2")]
    if load(f"mpi_w{w}_a"):
        sides.insert(1, ("mpi", "fsdp-train, mpi"))
    s = {side: summary(side, w) for side, _ in sides}
    for side, name in sides:
        x = s[side]
        exposed = f"{x['exposed']:.3f}" if side != "fsdp2" else "n/a"
        print(f"| {w} | {name} | {x['step_s']:.3f} | {x['tokens_per_s']:.0f} | "
              f"{' / '.join(mib(b) for b in x['rss'])} | "
              f"{' / '.join(f'{b / 2**20:.1f}' for b in x['sent'])} | "
              f"{x['ag'] / 2**20:.1f} / {x['rs'] / 2**20:.1f} | {exposed} |")
    ratios.append((w, s["ours"]["tokens_per_s"] / s["fsdp2"]["tokens_per_s"],
                   max(s["ours"]["rss"]) / max(s["fsdp2"]["rss"])))
    if "mpi" in s:
        m, g, f = s["mpi"], s["ours"], s["fsdp2"]
        mpi_ratios.append((w, m["tokens_per_s"] / g["tokens_per_s"],
                           m["tokens_per_s"] / f["tokens_per_s"],
                           m["exposed"] / g["exposed"] if g["exposed"] > 0 else float("nan")))
for name, label in (("ours_nofsdp_w1_a", "fsdp-train --no-fsdp"), ("single_w1_a", "PyTorch, no FSDP")):
    single = load(name)
    if single:
        st = statistics.median(x["step_s"] for x in single[2:])
        print(f"| 1 | {label} | {st:.3f} | {8 * 128 / st:.0f} | "
              f"{mib(single[-1]['ranks'][0]['peak_rss_bytes'])} | 0 | 0 / 0 | n/a |")
print()
footprint = {side: int(open(os.path.join(out, side + "_footprint_kb")).read()) * 1024
             for side in ("ours", "fsdp2")}
print(f"fixed footprint (libraries loaded, tiny model): fsdp-train {mib(footprint['ours'])} MiB, "
      f"python3 + torch {mib(footprint['fsdp2'])} MiB")
for w, t, m in ratios:
    print(f"W={w}: tokens/s ours/FSDP2 {t:.3f}, peak RSS ours/FSDP2 {m:.3f}")
for w, g, f, e in mpi_ratios:
    print(f"W={w}: tokens/s ours on mpi / ours on gloo {g:.3f}, / FSDP2 {f:.3f}; "
          f"exposed communication mpi / gloo {e:.3f}")
PY
