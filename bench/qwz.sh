#!/usr/bin/env bash
# ZeRO++ qwZ (int8 weight all-gather) against the plain fp32 all-gather: the same model, seed
# and batches under fsdp-train --all-gather fp and --all-gather int8, compared on the bytes the
# all-gathers move and on the loss.
#
#   bash scripts/run.sh build && bash bench/qwz.sh [steps] [world] [models] [block]
#
# steps defaults to 200, world to 2, models to "tiny small", block (elements per fp32 scale) to
# 256. GLOBAL_BATCH (default 8) and SEQ_LEN (default 64) set the batch; FSDP_BIN_DIR picks the
# build (default ./build). Per model and mode, from fsdp-train --metrics (rank 0; every rank
# moves the same):
#   - all-gather MB/step: the all-gather payload per rank per step (the gathered bytes, W times
#     one rank's part), and its ratio to fp32's; int8's analytic share is
#     (1 + 4 / block) / 4 of fp32's, 0.2539 at block 256;
#   - the loss of the last step and the mean over all steps, and int8's difference from fp32.
# This is no timing: the gloo transport on one host is not where the bytes cost, so the script
# reports bytes and losses only.
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-200}"
world="${2:-2}"
models="${3:-tiny small}"
block="${4:-256}"
bin_dir="${FSDP_BIN_DIR:-./build}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common="--global-batch ${GLOBAL_BATCH:-8} --seq-len ${SEQ_LEN:-64} --seed 1 --log-every 1000000"
common="$common --val-every 0 --quiet"

for model in $models; do
  for mode in fp "int8:$block"; do
    echo "== $bin_dir/fsdp-train --model $model $common --nproc $world --steps $steps" \
         "--all-gather $mode" >&2
    if ! "$bin_dir/fsdp-train" --model "$model" $common --nproc "$world" --steps "$steps" \
        --all-gather "$mode" --metrics "$out/$model.${mode%%:*}.jsonl" > "$out/log" 2>&1; then
      cat "$out/log" >&2
      exit 1
    fi
  done
done

python3 - "$out" "$world" "$steps" "$block" $models <<'PY'
import json, os, sys
out, world, steps, block, models = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:]
def load(model, mode):
    return [json.loads(l) for l in open(os.path.join(out, f"{model}.{mode}.jsonl"))]
def gathered(lines):  # rank 0's all-gather payload in the last step (every step gathers the same)
    return lines[-1]["ranks"][0]["all_gather_bytes"]
print(f"W={world}, {steps} steps, AdamW, int8 blocks of {block}; MB = 10^6 bytes, per rank.")
print()
print("| model | all-gather | all-gather MB/step | vs fp32 | final loss | mean loss "
      "| final loss - fp32's | mean loss - fp32's |")
print("|---|---|---|---|---|---|---|---|")
for model in models:
    fp, q = load(model, "fp"), load(model, "int8")
    for name, lines in (("fp32", fp), (f"int8:{block}", q)):
        final, mean = lines[-1]["loss"], sum(l["loss"] for l in lines) / len(lines)
        fp_final, fp_mean = fp[-1]["loss"], sum(l["loss"] for l in fp) / len(fp)
        print(f"| {model} | {name} | {gathered(lines) / 1e6:.4f} "
              f"| {gathered(lines) / gathered(fp):.4f} | {final:.4f} | {mean:.4f} "
              f"| {final - fp_final:+.4f} | {mean - fp_mean:+.4f} |")
PY
