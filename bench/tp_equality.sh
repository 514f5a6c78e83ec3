#!/usr/bin/env bash
# Tensor parallelism against one process on a full-size model (issue 30's "equal to the single
# process" for GPT-2 small and llama-debug), outside CI: each layout trains the same job from the
# same initial weights for `steps` AdamW steps with clipping, and its per-step losses, gradient
# norms and final exported parameters are compared with one process's (`fsdp-train --nproc 1`,
# bit-identical to --no-fsdp in fp32 and able to run mixed precision).
#
#   cmake --build build --target fsdp-train && bash bench/tp_equality.sh gpt2 [steps] [extra flags]
#
# Layouts: FSDP alone over W = 2, tp 2 over W = 2 with and without --sequence-parallel, FSDP
# alone over W = 4, dp 2 x tp 2 over W = 4 with and without it, and with
# --activation-checkpoint. FSDP alone is the yardstick: how far any other order of the same sums
# carries the run from one process's. Extra flags (for example --param-dtype bf16) go to every
# run, the reference's included. Prints a markdown table: the relative difference of the first step's
# grad norm (the same weights, only the order of the sums differs), the largest relative
# difference of the losses and of the grad norms over the steps, and the largest of any
# parameter element relative to that tensor's largest magnitude.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:?usage: tp_equality.sh MODEL [steps] [extra fsdp-train flags]}"
steps="${2:-5}"
shift $(($# < 2 ? $# : 2))
extra="$*"
py="${PYTHON:-.venv/bin/python3}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
job="--model $model --steps $steps --global-batch 8 --seq-len 128 --seed 5 --val-every 0 --quiet $extra"

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); model $model, $steps steps, extra: ${extra:-none}"
./build/fsdp-train --nproc 1 $job --metrics "$out/ref.jsonl" --export "$out/ref.safetensors" >/dev/null

echo "| layout | step 1 grad norm | losses | grad norms | parameters (worst tensor) |"
echo "|---|---|---|---|---|"
for layout in "2" "2 --tp 2" "2 --tp 2 --sequence-parallel" "4" "4 --tp 2" \
  "4 --tp 2 --sequence-parallel" "4 --tp 2 --activation-checkpoint"; do
  read -r nproc flags <<<"$layout"
  name="$(echo "$nproc $flags" | tr -d ' -')"
  ./build/fsdp-train --nproc "$nproc" $flags $job --metrics "$out/$name.jsonl" \
    --export "$out/$name.safetensors" >/dev/null
  "$py" - "$out" "$name" "W = $nproc, $flags" <<'EOF'
import json, sys
from safetensors.torch import load_file
out, name, label = sys.argv[1:]
def steps(path):
    return [json.loads(line) for line in open(path) if '"step_s"' in line]
def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)
ref, got = steps(f"{out}/ref.jsonl"), steps(f"{out}/{name}.jsonl")
assert len(ref) == len(got), (len(ref), len(got))
losses = max(rel(g["loss"], r["loss"]) for g, r in zip(got, ref))
norms = max(rel(g["grad_norm"], r["grad_norm"]) for g, r in zip(got, ref))
want, have = load_file(f"{out}/ref.safetensors"), load_file(f"{out}/{name}.safetensors")
assert want and want.keys() == have.keys(), sorted(set(want) ^ set(have))
worst, where = 0.0, ""
for k, w in want.items():
    d = float((have[k].double() - w.double()).abs().max() / w.double().abs().max().clamp_min(1e-30))
    if d > worst:
        worst, where = d, k
first = rel(got[0]["grad_norm"], ref[0]["grad_norm"])
print(f"| {label} | {first:.2e} | {losses:.2e} | {norms:.2e} | {worst:.2e} ({where}) |")
EOF
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
