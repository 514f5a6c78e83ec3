#!/usr/bin/env bash
# What Shard(1) costs against Shard(0): fsdp-train --shard-dim 0 and 1 on one model at
# W = 1, 2 and 4, alternately, twice each, so machine drift hits both alike.
#
#   bash scripts/run.sh build && bash bench/shard_placement.sh [model] [steps]
#
# model defaults to small, steps to 12. Per case: the median step time over steps 3..N of both
# runs, and from rank 0's --metrics the sharded parameter bytes (Shard(1) pads along dim 1, so
# they may differ slightly) and the all-gather and reduce-scatter payloads per step. Shard(1)'s
# copy-out, reduce-scatter copy-in and first shard copy are strided (one block per row of a
# matrix) where Shard(0)'s are contiguous; the collectives are the same size up to padding.
# Compare the Shard(0) rows with the same script on a build of main to see that Shard(0)'s path
# did not change. FSDP_BIN_DIR picks the build (default ./build); GLOBAL_BATCH and SEQ_LEN
# (default 8 and 128) size the step.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-small}"
steps="${2:-12}"
bin_dir="${FSDP_BIN_DIR:-./build}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common="--model $model --global-batch ${GLOBAL_BATCH:-8} --seq-len ${SEQ_LEN:-128} --steps $steps --quiet"

for world in 1 2 4; do
  for round in 1 2; do
    for dim in 0 1; do
      echo "== $bin_dir/fsdp-train $common --nproc $world --shard-dim $dim (round $round)" >&2
      "$bin_dir/fsdp-train" $common --nproc "$world" --shard-dim "$dim" \
        --metrics "$out/w${world}_d${dim}_r${round}.jsonl"
    done
  done
done

python3 - "$out" "$model" <<'PY'
import glob, json, os, statistics, sys
out, model = sys.argv[1], sys.argv[2]
print(f"model {model}; medians of steps 3..N over two runs each; rank 0's bytes. MB = 10^6 bytes.")
print()
print("| W | placement | step (s) | sharded params (MB) | all-gather (MB/step) | reduce-scatter (MB/step) |")
print("|---|---|---|---|---|---|")
for world in (1, 2, 4):
    for dim in (0, 1):
        times, last = [], None
        for path in sorted(glob.glob(os.path.join(out, f"w{world}_d{dim}_r*.jsonl"))):
            steps = [json.loads(line) for line in open(path)]
            times += [s["step_s"] for s in steps[2:]]
            last = steps[-1]["ranks"][0]
        print(f"| {world} | Shard({dim}) | {statistics.median(times):.4f} | "
              f"{last['param_bytes'] / 1e6:.3f} | {last['all_gather_bytes'] / 1e6:.2f} | "
              f"{last['reduce_scatter_bytes'] / 1e6:.2f} |")
PY
