#!/usr/bin/env bash
# DDP, inter-tensor ZeRO-3 and FSDP side by side on GPT-2 (Tiny-FSDP's comparison): the same
# model, seed and batches under fsdp-train --strategy no_shard, whole_tensor and full_shard.
#
#   bash scripts/run.sh build && bash bench/strategies.sh [steps] [world] [models]
#
# steps defaults to 20, world to 2, models to "small gpt2" (gpt2 is skipped, with the reason,
# when fsdp-train's own memory check refuses it on this machine). GLOBAL_BATCH (default 8) and
# SEQ_LEN (default 128) set the batch; FSDP_BIN_DIR picks the build (default ./build).
# Per case, from fsdp-train --metrics (every rank reports; the table shows the largest rank,
# which under whole_tensor is the rank the partition gave the most bytes):
#   - memory per rank: param, grad, optim (the library's accounting, last step), peak_unsharded
#     (gathered or broadcast parameters plus full gradients alive at once) and peak (every live
#     CPU tensor of the process at the step's peak, from the counting allocator);
#   - tokens/s: the global batch's tokens over the median step time of steps 2..N;
#   - moved per rank per step: the collectives' payload (all-gather output, reduce-scatter
#     input, all-reduce, broadcast and reduce tensors; the all-reduce includes the gradient norm
#     and loss, 8 bytes each) and the bytes the rank wrote to sockets and files (wchar);
#   - the loss after N steps (the same batches in every case, so the three agree to ~1e-5).
# whole_tensor also prints its partition (bytes per rank, imbalance, broadcasts per gather).
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-20}"
world="${2:-2}"
models="${3:-small gpt2}"
bin_dir="${FSDP_BIN_DIR:-./build}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common="--global-batch ${GLOBAL_BATCH:-8} --seq-len ${SEQ_LEN:-128} --seed 1 --log-every 1000000"

# name|flags
cases=(
  "DDP (no_shard)|--strategy no_shard"
  "inter-tensor ZeRO-3 (whole_tensor)|--strategy whole_tensor"
  "FSDP (full_shard)|--strategy full_shard"
)
runs=()
for model in $models; do
  i=0
  for c in "${cases[@]}"; do
    flags="${c#*|}"
    log="$out/$model.$i.log"
    echo "== $bin_dir/fsdp-train --model $model $common --nproc $world --steps $steps $flags" >&2
    if "$bin_dir/fsdp-train" --model "$model" $common --nproc "$world" --steps "$steps" $flags \
        --metrics "$out/$model.$i.jsonl" > "$log" 2>&1; then
      grep "whole_tensor placement" "$log" >&2 || true
      runs+=("$model|$i|${c%%|*}")
    elif grep -q "this machine has" "$log"; then
      echo "   skipped: $(grep -m1 "this machine has" "$log")" >&2
    else
      cat "$log" >&2
      exit 1
    fi
    i=$((i + 1))
  done
done

python3 - "$out" "$world" "$steps" "${runs[@]}" <<'PY'
import json, os, statistics, sys
out, world, steps, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
mb = lambda b: f"{b / 1e6:.2f}"
print(f"W={world}, {steps} steps, AdamW; MB = 10^6 bytes, per rank (the largest rank).")
print()
print("| model | strategy | param MB | grad MB | optim MB | peak unsharded MB | peak MB "
      "| tokens/s | collectives MB/step | sent MB/step | loss after N steps |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for run in runs:
    model, i, name = run.split("|", 2)
    lines = [json.loads(l) for l in open(os.path.join(out, f"{model}.{i}.jsonl"))]
    last = lines[-1]
    ranks = last["ranks"]
    largest = max(ranks, key=lambda r: (r["param_bytes"], -r["rank"]))
    timed = [l["step_s"] for l in lines[1:]] or [lines[0]["step_s"]]
    tokens = lines[0]["tokens_per_s"] * lines[0]["step_s"]  # tokens per step
    payload = max(sum(r[k] for k in ("all_gather_bytes", "reduce_scatter_bytes",
                                     "all_reduce_bytes", "broadcast_bytes", "reduce_bytes"))
                  for r in ranks)
    sent = statistics.median(max(r["sent_bytes"] for r in l["ranks"]) for l in lines[1:] or lines)
    print(f"| {model} | {name} | {mb(largest['param_bytes'])} | {mb(largest['grad_bytes'])} "
          f"| {mb(largest['optim_bytes'])} | {mb(largest['peak_unsharded_bytes'])} "
          f"| {mb(max(r['peak_alloc_bytes'] for r in ranks))} "
          f"| {tokens / statistics.median(timed):.0f} | {mb(payload)} | {mb(sent)} "
          f"| {last['loss']:.6f} |")
PY
