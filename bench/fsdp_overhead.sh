#!/usr/bin/env bash
# FSDP overhead and per-rank memory on this CPU machine, in one run.
#
#   bash scripts/run.sh build && bash bench/fsdp_overhead.sh [model] [steps]
#
# 1. Step time of FSDP with one rank over plain LibTorch (--no-fsdp), same model, batch and
#    data: the runtime's own overhead (copy-in/out, hooks, a one-rank all-gather and
#    reduce-scatter). The two are run alternately, twice each, and compared by median step
#    time over steps 3..N, so machine drift hits both alike.
# 2. Bytes per rank by category (from --metrics) for W = 1, 2, 4.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-small}"
steps="${2:-12}"
bin="${FSDP_TRAIN_BIN:-./build/fsdp-train}"
out="$(mktemp -d)"
common="--model $model --steps $steps --global-batch 8 --seq-len 128 --quiet"

run() {  # name, args...
  local name="$1"; shift
  echo "== $bin $common $* --metrics $out/$name.jsonl" >&2
  $bin $common "$@" --metrics "$out/$name.jsonl"
}
run ref_a --no-fsdp
run w1_a --nproc 1
run ref_b --no-fsdp
run w1_b --nproc 1
run w2 --nproc 2
run w4 --nproc 4

python3 - "$out" "$model" "$steps" <<'PY'
import json, statistics, sys, os
out, model, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def load(name):
    with open(os.path.join(out, name + ".jsonl")) as f:
        return [json.loads(l) for l in f]
def median_step(names):
    times = [r["step_s"] for n in names for r in load(n)[2:]]
    return statistics.median(times)
ref = median_step(["ref_a", "ref_b"]); w1 = median_step(["w1_a", "w1_b"])
print(f"model {model}, {steps} steps of 8 x 128 tokens, median step time over steps 3..{steps}")
print(f"| run | step time (s) |\n|---|---|\n| --no-fsdp | {ref:.4f} |\n| FSDP W=1 | {w1:.4f} |")
print(f"| FSDP W=2 | {median_step(['w2']):.4f} |\n| FSDP W=4 | {median_step(['w4']):.4f} |")
print(f"\nFSDP W=1 / --no-fsdp step time: {w1 / ref:.3f}\n")
print("| run | rank | param_bytes | grad_bytes | optim_bytes | peak_unsharded_bytes | all_gather_bytes | reduce_scatter_bytes |")
print("|---|---|---|---|---|---|---|---|")
for name, label in [("ref_a", "--no-fsdp"), ("w1_a", "W=1"), ("w2", "W=2"), ("w4", "W=4")]:
    last = load(name)[-1]
    for r in last["ranks"]:
        print(f"| {label} | {r['rank']} | {r['param_bytes']:,} | {r['grad_bytes']:,} | {r['optim_bytes']:,} | "
              f"{r['peak_unsharded_bytes']:,} | {r['all_gather_bytes']:,} | {r['reduce_scatter_bytes']:,} |")
PY
rm -rf "$out"
