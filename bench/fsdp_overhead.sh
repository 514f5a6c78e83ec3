#!/usr/bin/env bash
# FSDP overhead and per-rank memory on this CPU machine, in one run.
#
#   bash scripts/run.sh build && bash bench/fsdp_overhead.sh [model] [steps] [pairs]
#
# 1. Step time of FSDP with one rank over plain LibTorch (--no-fsdp), same model, batch and
#    data: the runtime's own overhead (copy-in/out, hooks, a one-rank all-gather and
#    reduce-scatter). The two are run alternately, `pairs` times each (default 2), and compared
#    by median step time over steps 3..N, pooled and pair by pair: the VM's own speed drifts by
#    up to 1.4x within seconds (bench/RESULTS.md, 2026-11-28), so a pair's ratio moves with it
#    and only the median of many pairs can show a 2% difference.
# 2. Bytes per rank by category (from --metrics) for W = 1, 2, 4.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-small}"
steps="${2:-12}"
pairs="${3:-2}"
bin="${FSDP_TRAIN_BIN:-./build/fsdp-train}"
out="$(mktemp -d)"
common="--model $model --steps $steps --global-batch 8 --seq-len 128 --quiet"

run() {  # name, args...
  local name="$1"; shift
  echo "== $bin $common $* --metrics $out/$name.jsonl" >&2
  $bin $common "$@" --metrics "$out/$name.jsonl"
}
for i in $(seq 1 "$pairs"); do
  run "ref_$i" --no-fsdp
  run "w1_$i" --nproc 1
done
run w2 --nproc 2
run w4 --nproc 4

python3 - "$out" "$model" "$steps" "$pairs" <<'PY'
import json, statistics, sys, os
out, model, steps, pairs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def load(name):
    with open(os.path.join(out, name + ".jsonl")) as f:
        return [json.loads(l) for l in f]
def median_step(names):
    times = [r["step_s"] for n in names for r in load(n)[2:]]
    return statistics.median(times)
ref = median_step([f"ref_{i}" for i in range(1, pairs + 1)])
w1 = median_step([f"w1_{i}" for i in range(1, pairs + 1)])
pair_ratios = [median_step([f"w1_{i}"]) / median_step([f"ref_{i}"]) for i in range(1, pairs + 1)]
print(f"model {model}, {steps} steps of 8 x 128 tokens, median step time over steps 3..{steps}")
print(f"| run | step time (s) |\n|---|---|\n| --no-fsdp | {ref:.4f} |\n| FSDP W=1 | {w1:.4f} |")
print(f"| FSDP W=2 | {median_step(['w2']):.4f} |\n| FSDP W=4 | {median_step(['w4']):.4f} |")
print(f"\nFSDP W=1 / --no-fsdp step time: {w1 / ref:.3f} pooled over {pairs} pairs; pair by pair "
      + " ".join(f"{r:.3f}" for r in pair_ratios) + f", median {statistics.median(pair_ratios):.3f}\n")
print("| run | rank | param_bytes | grad_bytes | optim_bytes | peak_unsharded_bytes | all_gather_bytes | reduce_scatter_bytes |")
print("|---|---|---|---|---|---|---|---|")
for name, label in [("ref_1", "--no-fsdp"), ("w1_1", "W=1"), ("w2", "W=2"), ("w4", "W=4")]:
    last = load(name)[-1]
    for r in last["ranks"]:
        print(f"| {label} | {r['rank']} | {r['param_bytes']:,} | {r['grad_bytes']:,} | {r['optim_bytes']:,} | "
              f"{r['peak_unsharded_bytes']:,} | {r['all_gather_bytes']:,} | {r['reduce_scatter_bytes']:,} |")
PY
rm -rf "$out"
