#!/usr/bin/env bash
# Every sharding strategy and accumulation mode in one run, measured against fsdp-estimate's
# prediction: step time, bytes held per rank and bytes communicated per step.
#
#   bash scripts/run.sh build && bash bench/training_modes.sh [model] [world] [steps]
#
# model defaults to small, world to 4, steps to 4. For each case fsdp-estimate predicts one
# rank's bytes and communication, and fsdp-train --nproc W --metrics measures them (rank 0):
#   - step time: the median over steps 2..N (the first step includes warm-up);
#   - held: param/grad/optim/peak_unsharded from the library's accounting (last step);
#     activation_bytes and the step's peak of live CPU tensor bytes (peak_alloc_bytes, the
#     measured counterpart of total_bytes) from the counting allocator; peak RSS (VmHWM) is the
#     whole process (LibTorch, malloc's retained pages, the model's construction), for scale;
#   - moved: the collectives' payload per step (all-gather output, reduce-scatter input,
#     all-reduce tensor; the measured all-reduce also holds the gradient norm and the loss,
#     8 bytes each) and the bytes the rank wrote to its sockets (/proc/self/io wchar).
# Two tables are printed: bytes held by category, then time, totals and communication.
# FSDP_BIN_DIR picks the build (default ./build). GLOBAL_BATCH and SEQ_LEN (default 8 and 128)
# size the step; CASES (an extended regex, default every case) picks cases by name, e.g.
#   for w in 1 2 4; do CASES='^full_shard \(' GLOBAL_BATCH=4 SEQ_LEN=64 \
#     bash bench/training_modes.sh gpt2-medium $w 2; done
# measures one strategy's memory as the world grows.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-small}"
world="${2:-4}"
steps="${3:-4}"
bin_dir="${FSDP_BIN_DIR:-./build}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
batch="${GLOBAL_BATCH:-8}"
seq_len="${SEQ_LEN:-128}"
common="--model $model --global-batch $batch --seq-len $seq_len"

# name|flags given to both fsdp-train and fsdp-estimate
cases=(
  "full_shard (ZeRO-3)|--strategy full_shard"
  "shard_grad_op (ZeRO-2)|--strategy shard_grad_op"
  "no_shard (DDP)|--strategy no_shard"
  "hybrid_shard R=2 (HSDP 2 x 2)|--strategy hybrid_shard --replicate 2"
  "full_shard, reshard_after_forward=2 (hpZ)|--strategy full_shard --reshard-after-forward 2"
  "full_shard + activation checkpointing|--strategy full_shard --activation-checkpoint"
  "full_shard + bf16 params, fp32 reduce|--strategy full_shard --param-dtype bf16 --reduce-dtype fp32"
  "full_shard + 2 micro-batches, sync|--strategy full_shard --grad-accum 2 --accum-mode sync"
  "full_shard + 2 micro-batches, no-sync|--strategy full_shard --grad-accum 2 --accum-mode no-sync"
  "full_shard + 2 micro-batches, no-reshard|--strategy full_shard --grad-accum 2 --accum-mode no-reshard"
)
i=0
selected=()
for c in "${cases[@]}"; do
  if [[ "${c%%|*}" =~ ${CASES:-.} ]]; then selected+=("$c"); fi
done
[ ${#selected[@]} -gt 0 ] || { echo "CASES='$CASES' matches no case" >&2; exit 2; }
for c in "${selected[@]}"; do
  flags="${c#*|}"
  echo "== $bin_dir/fsdp-estimate $common --world-size $world $flags" >&2
  "$bin_dir/fsdp-estimate" $common --world-size "$world" $flags > "$out/$i.estimate.json"
  echo "== $bin_dir/fsdp-train $common --nproc $world --steps $steps --quiet $flags --metrics $out/$i.jsonl" >&2
  "$bin_dir/fsdp-train" $common --nproc "$world" --steps "$steps" --quiet $flags --metrics "$out/$i.jsonl"
  i=$((i + 1))
done

python3 - "$out" "$model" "$world" "$batch" "$seq_len" "${selected[@]}" <<'PY'
import json, os, statistics, sys
out, model, world, cases = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[6:]
batch, seq_len = int(sys.argv[4]), int(sys.argv[5])
runs = []
for i, case in enumerate(cases):
    est = json.load(open(os.path.join(out, f"{i}.estimate.json")))
    steps = [json.loads(l) for l in open(os.path.join(out, f"{i}.jsonl"))]
    runs.append((case.split("|")[0], est, steps))

def cell(p, m, scale=1e6, digits=3):
    if max(p, m) < 1e4:  # none, or only the scalars (gradient norm, loss): in bytes
        return f"{p} B / {m} B"
    if not m:
        return f"{p / scale:.{digits}f} / 0"
    return f"{p / scale:.{digits}f} / {m / scale:.{digits}f} ({p / m:.3f})"

print(f"model {model}, W={world}, global batch {batch} x {seq_len} tokens, AdamW; measured on rank 0. "
      "MB = 10^6 bytes; each pair is predicted / measured (ratio).")
print()
print("Bytes held per rank (last step):")
print()
keys = [("param_bytes", "param_bytes"), ("grad_bytes", "grad_bytes"), ("optim_bytes", "optim_bytes"),
        ("peak_unsharded_bytes", "peak_unsharded_bytes"), ("activation_bytes", "activation_bytes"),
        ("total_bytes", "peak_alloc_bytes")]
print("| case | " + " | ".join(k for k, _ in keys) + " | peak RSS | estimate peaks in |")
print("|---|" + "---|" * (len(keys) + 2))
for name, est, steps in runs:
    r0 = steps[-1]["ranks"][0]
    cells = [cell(est[pk], r0[mk]) for pk, mk in keys]
    print(f"| {name} | " + " | ".join(cells) + f" | {r0['peak_rss_bytes'] / 1e6:.0f} | {est['peak_phase']} |")
print()
print(f"Step time (median of steps 2..{len(runs[0][2])}; no prediction), bytes held and bytes "
      "moved per rank per step:")
print()
print("| case | step (s) | tokens/s | sharded state: param+grad+optim (MB) | peak tensor bytes (MB) "
      "| peak RSS (MB) | all-gather (MB) | reduce-scatter (MB) | all-reduce (MB) | sent (MB) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name, est, steps in runs:
    step_s = statistics.median(s["step_s"] for s in steps[1:])
    r0 = steps[-1]["ranks"][0]
    sent = statistics.median(s["ranks"][0]["sent_bytes"] for s in steps[1:])
    state_p = est["param_bytes"] + est["grad_bytes"] + est["optim_bytes"]
    state_m = r0["param_bytes"] + r0["grad_bytes"] + r0["optim_bytes"]
    print(f"| {name} | {step_s:.3f} | {batch * seq_len / step_s:.0f} | {cell(state_p, state_m, digits=1)} | "
          f"{cell(est['total_bytes'], r0['peak_alloc_bytes'], digits=1)} | {r0['peak_rss_bytes'] / 1e6:.0f} | "
          f"{cell(est['all_gather_bytes'], r0['all_gather_bytes'], digits=1)} | "
          f"{cell(est['reduce_scatter_bytes'], r0['reduce_scatter_bytes'], digits=1)} | "
          f"{cell(est['all_reduce_bytes'], r0['all_reduce_bytes'], digits=1)} | {sent / 1e6:.1f} |")
PY
