#!/usr/bin/env bash
# Prefetch off against on, W = 2 ranks over gloo on this machine, in one run.
#
#   bash scripts/run.sh build && bash bench/prefetch_overlap.sh [model] [steps]
#
# Runs fsdp-train --prefetch 0 and --prefetch 1 alternately, twice each, and reports the median
# step time and the median exposed communication (time the compute path sat blocked on an
# all-gather or reduce-scatter, from --metrics) over steps 3..N. Then a short traced run with
# prefetch on, and an excerpt of rank 0's timeline showing communication under compute.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-small}"
steps="${2:-10}"
bin="${FSDP_TRAIN_BIN:-./build/fsdp-train}"
out="$(mktemp -d)"
common="--nproc 2 --model $model --steps $steps --global-batch 8 --seq-len 128 --quiet"

run() {  # name, args...
  local name="$1"; shift
  echo "== $bin $common $* --metrics $out/$name.jsonl" >&2
  $bin $common "$@" --metrics "$out/$name.jsonl"
}
run off_a --prefetch 0
run on_a --prefetch 1
run off_b --prefetch 0
run on_b --prefetch 1
echo "== $bin --nproc 2 --model $model --steps 3 --global-batch 8 --seq-len 128 --quiet --trace $out/trace" >&2
$bin --nproc 2 --model "$model" --steps 3 --global-batch 8 --seq-len 128 --quiet --trace "$out/trace"

python3 - "$out" "$model" "$steps" <<'PY'
import json, statistics, sys, os
out, model, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def rows(names):
    return [json.loads(l) for n in names for l in open(os.path.join(out, n + ".jsonl"))][0:]
def med(names, key):
    vals = []
    for n in names:
        lines = [json.loads(l) for l in open(os.path.join(out, n + ".jsonl"))]
        vals += [r[key] for r in lines[2:]]
    return statistics.median(vals)
off_step, on_step = med(["off_a", "off_b"], "step_s"), med(["on_a", "on_b"], "step_s")
off_exp, on_exp = med(["off_a", "off_b"], "exposed_comm_s"), med(["on_a", "on_b"], "exposed_comm_s")
print(f"model {model}, W=2, 8 x 128 tokens per step, medians over steps 3..{steps} of two runs each")
print("| prefetch | step time (s) | exposed comm (s) |\n|---|---|---|")
print(f"| off | {off_step:.4f} | {off_exp:.4f} |\n| on | {on_step:.4f} | {on_exp:.4f} |")
print(f"\nexposed comm on/off: {on_exp / off_exp:.3f}; step time on/off: {on_step / off_step:.3f}\n")
# Timeline excerpt: rank 0, last step, the events around the middle block's backward.
trace = json.load(open(os.path.join(out, "trace", "rank0.json")))["traceEvents"]
ev = sorted([e for e in trace if e["ph"] == "X"], key=lambda e: e["ts"])
steps_at = [e["ts"] for e in ev if e["name"] == "optimizer step"]
last = [e for e in ev if e["ts"] > steps_at[-2]]
t0 = last[0]["ts"]
print("Excerpt of rank 0's trace (last step, ms from its start):")
print("| cat | name | unit | start | end | bytes |\n|---|---|---|---|---|---|")
for e in last[:40]:
    print(f"| {e['cat']} | {e['name']} | {e['args'].get('unit','')} | {(e['ts']-t0)/1e3:.1f} | "
          f"{(e['ts']+e['dur']-t0)/1e3:.1f} | {e['args'].get('bytes','')} |")
PY
rm -rf "$out"
