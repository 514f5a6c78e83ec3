#!/usr/bin/env bash
# fsdp-plan's predictions against fsdp-train's measurements on this machine.
#
#   cmake --build build --target fsdp-plan fsdp-train && bash bench/plan_validation.sh [hw.json] [steps]
#
# For `small` and `llama-debug` (global batch 8 x 128 tokens), W = 1, 2, 4, every strategy
# (hybrid_shard with 2 replicas) and prefetch on and off: runs fsdp-train --metrics for `steps`
# steps (default 8) and takes the median step_s and exposed_comm_s over steps 3..N, then asks
# fsdp-plan with the hardware file (default bench/hardware/dev_vm_2core.json; CALIBRATE=1 makes
# it first with fsdp-plan --calibrate). Prints a markdown table with the error of each
# prediction, and the machine's load average before and after. Then tensor parallelism (tp 2,
# with and without --sequence-parallel) beside FSDP alone at W = 2 and 4, with the time the
# compute thread spent in the tp group's collectives (tp_comm_s); ONLY_TP=1 runs just those.
set -euo pipefail
cd "$(dirname "$0")/.."
hw="${1:-bench/hardware/dev_vm_2core.json}"
steps="${2:-8}"
py="${PYTHON:-.venv/bin/python3}"
out="$(mktemp -d)"
if [[ "${CALIBRATE:-0}" == 1 || ! -f "$hw" ]]; then
  ./build/fsdp-plan --calibrate --output "$hw" >&2
fi
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"

configs=()
if [[ "${ONLY_TP:-0}" != 1 ]]; then
  for model in small llama-debug; do
    configs+=("$model 1 full_shard 1 1 0" "$model 1 full_shard 0 1 0")
    for w in 2 4; do
      for strategy in full_shard shard_grad_op no_shard hybrid_shard; do
        for prefetch in 1 0; do configs+=("$model $w $strategy $prefetch 1 0"); done
      done
    done
  done
fi
# Tensor parallelism: tp 2 over W = 2 and dp 2 x tp 2 over W = 4, with and without sequence
# parallelism, beside FSDP alone at the same W (ONLY_TP=1: just these).
for model in small llama-debug; do
  for w in 2 4; do
    configs+=("$model $w full_shard 1 1 0" "$model $w full_shard 1 2 0" "$model $w full_shard 1 2 1")
  done
done

echo "| model | W | strategy | prefetch | tp | measured step_s | predicted | error | measured exposed_comm_s | predicted | measured tp_comm_s | predicted |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for config in "${configs[@]}"; do
  read -r model w strategy prefetch tp sp <<<"$config"
  replicate=1
  [[ "$strategy" == hybrid_shard ]] && replicate=2
  flags="--model $model --global-batch 8 --seq-len 128 --strategy $strategy --replicate $replicate --prefetch $prefetch --tp $tp"
  [[ "$sp" == 1 ]] && flags="$flags --sequence-parallel"
  metrics="$out/$model-$w-$strategy-$prefetch-$tp-$sp.jsonl"
  ./build/fsdp-train --nproc "$w" $flags --steps "$steps" --val-every 0 --quiet \
    --metrics "$metrics" >/dev/null
  plan="$(./build/fsdp-plan --hardware "$hw" --world-size "$w" $flags --json)"
  "$py" - "$metrics" "$plan" "$model" "$w" "$strategy" "$prefetch" "$tp" "$sp" <<'EOF'
import json, statistics, sys
metrics, plan, model, w, strategy, prefetch, tp, sp = sys.argv[1:]
steps = [json.loads(line) for line in open(metrics)][2:]
measured = statistics.median(s["step_s"] for s in steps)
exposed = statistics.median(s["exposed_comm_s"] for s in steps)
tp_comm = statistics.median(s.get("tp_comm_s", 0) for s in steps)
p = json.loads(plan)
error = (p["step_s"] - measured) / measured
layout = tp + (" SP" if sp == "1" else "")
print(f"| {model} | {w} | {strategy} | {prefetch} | {layout} | {measured:.4f} | {p['step_s']:.4f} | "
      f"{100 * error:+.1f}% | {exposed:.4f} | {p['exposed_comm_s']:.4f} | {tp_comm:.4f} | "
      f"{p['tp_comm_s']:.4f} |")
EOF
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
rm -rf "$out"
