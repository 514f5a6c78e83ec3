#!/usr/bin/env bash
# Memory estimator against measured bytes per rank, for each sharding strategy and a few
# training modes.
#
#   bash scripts/run.sh build && bash bench/memory_estimate.sh [model] [world] [steps]
#
# For each case, fsdp-estimate predicts one rank's bytes and fsdp-train --nproc W --metrics
# measures them (last step, rank 0): param/grad/optim/peak_unsharded from the library's
# accounting, activation_bytes and the step's peak of live CPU tensor bytes (peak_alloc_bytes,
# the measured counterpart of total_bytes) from the counting allocator. Peak RSS (VmHWM) is the
# whole process since it started (the LibTorch libraries, malloc's retained pages and the
# model's construction included), shown for scale. FSDP_BIN_DIR picks the build (default
# ./build).
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-small}"
world="${2:-4}"
steps="${3:-3}"
bin_dir="${FSDP_BIN_DIR:-./build}"
out="$(mktemp -d)"
common="--model $model --global-batch 8 --seq-len 128"

# name|flags given to both fsdp-train and fsdp-estimate
cases=(
  "full_shard|--strategy full_shard"
  "shard_grad_op|--strategy shard_grad_op"
  "no_shard|--strategy no_shard"
  "hybrid_shard R=2|--strategy hybrid_shard --replicate 2"
  "full_shard + activation checkpointing|--strategy full_shard --activation-checkpoint"
  "full_shard + bf16 params, fp32 reduce|--strategy full_shard --param-dtype bf16 --reduce-dtype fp32"
  "full_shard + 2 micro-batches, no-sync|--strategy full_shard --grad-accum 2 --accum-mode no-sync"
)
i=0
for c in "${cases[@]}"; do
  flags="${c#*|}"
  echo "== $bin_dir/fsdp-estimate $common --world-size $world $flags" >&2
  "$bin_dir/fsdp-estimate" $common --world-size "$world" $flags > "$out/$i.estimate.json"
  echo "== $bin_dir/fsdp-train $common --nproc $world --steps $steps --quiet $flags --metrics $out/$i.jsonl" >&2
  "$bin_dir/fsdp-train" $common --nproc "$world" --steps "$steps" --quiet $flags --metrics "$out/$i.jsonl"
  i=$((i + 1))
done

python3 - "$out" "$model" "$world" "${cases[@]}" <<'PY'
import json, os, sys
out, model, world, cases = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
keys = [("param_bytes", "param_bytes"), ("grad_bytes", "grad_bytes"), ("optim_bytes", "optim_bytes"),
        ("peak_unsharded_bytes", "peak_unsharded_bytes"), ("activation_bytes", "activation_bytes"),
        ("total_bytes", "peak_alloc_bytes")]
print(f"model {model}, W={world}, global batch 8 x 128 tokens; measured: rank 0, last step; "
      "each cell predicted / measured (ratio)")
print("| case | " + " | ".join(k for k, _ in keys) + " | peak RSS | estimate peaks in |")
print("|---|" + "---|" * (len(keys) + 2))
for i, case in enumerate(cases):
    name = case.split("|")[0]
    est = json.load(open(os.path.join(out, f"{i}.estimate.json")))
    r0 = [json.loads(l) for l in open(os.path.join(out, f"{i}.jsonl"))][-1]["ranks"][0]
    cells = []
    for pk, mk in keys:
        p, m = est[pk], r0[mk]
        cells.append(f"{p / 1e6:.3f} / {m / 1e6:.3f} ({p / m:.3f})" if m else f"{p / 1e6:.3f} / 0")
    print(f"| {name} | " + " | ".join(cells) + f" | {r0['peak_rss_bytes'] / 1e6:.0f} | {est['peak_phase']} |")
print("\n(MB = 10^6 bytes.)")
PY
rm -rf "$out"
