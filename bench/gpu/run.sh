#!/usr/bin/env bash
# The whole GPU programme in one go, on a machine with one NVIDIA GPU or more:
#
#   bash bench/gpu/run.sh OUT_DIR [--dry-run]
#
# Everything it writes goes under OUT_DIR: summary.md (the results, read this first),
# commands.txt (every command, in order), status.tsv (each step: ok, FAIL or skipped, and why),
# logs/ (each command's output), the tests' JUnit XML, the metrics and exports of every run, the
# --trace timelines and the sanitizer reports. --dry-run writes commands.txt and runs nothing.
# It never stops at a failed step: it records it and goes on; the exit status is 1 if any
# failed.
#
# The steps:
#  1. build: scripts/run.sh build (set-up and the whole build) when build/ has no fsdp-train,
#     else an incremental cmake --build; then a check that the build has the nccl backend.
#  2. tests: ctest -L cuda (the NCCL backend's collectives on the GPU against gloo) and the
#     CPU-side nccl tests.
#  3. ranks: W = $WORLD (default 2) ranks for the equality runs. With fewer GPUs than W, every
#     rank gets its own NCCL_HOSTID (and NCCL_SOCKET_IFNAME=lo), so NCCL sees W hosts and
#     accepts W ranks on one GPU; a 2-rank fsdp-comm-bench probes whether it does, and if not,
#     W becomes 1 (the summary says so). fsdp-comm-bench then times the collectives over NCCL.
#  4. equality, per model in $MODELS (default GPT-2 124M and llama-1b) and per dtype (fp32,
#     bf16): the same initial weights (one fsdp-train --export) and batches, $EQ_STEPS steps of
#     $EQ_BATCH x $EQ_SEQ tokens, trained by fsdp-train on the GPU (--device cuda, nccl),
#     fsdp-train on the CPU (gloo), and PyTorch FSDP2 on the GPU (bench/reference/
#     fsdp2_reference.py --device cuda). Losses, gradient norms and every final parameter must
#     agree within 1e-4 (fp32) and 1e-2 (bf16), relative: GPU against CPU, and GPU against FSDP2.
#  5. performance, bf16, ours against FSDP2 on the GPU, one rank per GPU (min(W, GPUs) ranks):
#     $PERF_STEPS steps of $PERF_BATCH x $PERF_SEQ tokens; median step time over steps 3..N,
#     tokens/s, rank 0's peak allocated and reserved CUDA memory, and MFU: fsdp-plan's model
#     FLOPs per step over (step time x the dense bf16 peak of bench/hardware/<gpu>.json x GPUs).
#  6. timeline: fsdp-train --trace on each model (open OUT_DIR/trace/<model>/rank0.json in
#     Perfetto).
#  7. sanitizers: bench/gpu/sanitize.sh (compute-sanitizer and TORCH_CUDA_SANITIZER), unless
#     SANITIZE=0.
#
# What to expect: every step ok; the equality rows well inside their tolerance (differences of
# 1e-6..1e-5 in fp32 and 1e-3 in bf16 are the usual rounding of different kernels); tokens/s
# close to FSDP2's, peak memory within a few percent of FSDP2's.
#
# Environment (defaults in brackets): WORLD [2], MODELS ["gpt2 llama-1b"], EQ_STEPS [3],
# EQ_BATCH [4], EQ_SEQ [128], PERF_STEPS [20], PERF_BATCH [8], PERF_SEQ [1024], SANITIZE [1],
# KEEP_EXPORTS [0: delete each run's exported weights once compared; llama-1b's are 5 GB],
# HARDWARE [bench/hardware/ file chosen from nvidia-smi's GPU name], PYTHON [.venv/bin/python3].
# fsdp-train's --device cuda is what puts a run on the GPU.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT" || exit 2

if [ $# -lt 1 ] || [ "${1:0:1}" = - ]; then
  echo "usage: $0 OUT_DIR [--dry-run]" >&2
  exit 2
fi
OUT="$(realpath -m "$1")"
DRY=0
if [ "${2:-}" = --dry-run ]; then DRY=1; fi
mkdir -p "$OUT/logs"
: > "$OUT/commands.txt"
: > "$OUT/status.tsv"

WORLD="${WORLD:-2}"
MODELS="${MODELS:-gpt2 llama-1b}"
EQ_STEPS="${EQ_STEPS:-3}" EQ_BATCH="${EQ_BATCH:-4}" EQ_SEQ="${EQ_SEQ:-128}"
PERF_STEPS="${PERF_STEPS:-20}" PERF_BATCH="${PERF_BATCH:-8}" PERF_SEQ="${PERF_SEQ:-1024}"
SANITIZE="${SANITIZE:-1}"
KEEP_EXPORTS="${KEEP_EXPORTS:-0}"
BUILD="$ROOT/build"
TRAIN="$BUILD/fsdp-train"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python3 ]; then PYTHON="$ROOT/.venv/bin/python3"; else PYTHON=python3; fi
fi
REFERENCE="$ROOT/bench/reference/fsdp2_reference.py"
REPORT="$ROOT/bench/gpu/report.py"
failures=0

# ---- helpers ----

note() { echo "== $*" >&2; }

# status STEP ok|FAIL|skipped [why]
status() {
  local result="$2"
  if [ "$DRY" = 1 ]; then result="listed (dry run)"; fi
  printf '%s\t%s\t%s\n' "$1" "$result" "${3:-}" >> "$OUT/status.tsv"
  if [ "$result" = FAIL ]; then failures=$((failures + 1)); fi
  note "$1: $result${3:+ ($3)}"
}

# run NAME CMD...: runs CMD with its output in logs/NAME.log; its exit status is run's.
run() {
  local name="$1"
  shift
  printf '%s: %s\n' "$name" "$*" >> "$OUT/commands.txt"
  if [ "$DRY" = 1 ]; then return 0; fi
  "$@" > "$OUT/logs/$name.log" 2>&1
}

# step NAME CMD...: run, then record ok or FAIL (pointing at the log).
step() {
  local name="$1"
  if run "$@"; then status "$name" ok; else status "$name" FAIL "see logs/$name.log"; fi
}

free_port() {
  "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# launch NAME W CMD...: W ranks of CMD with torchrun's variables (rank r on GPU r mod GPUs, as
# fsdp-train and the nccl backend pick it), each with its own NCCL_HOSTID when ranks share GPUs.
launch() {
  local name="$1" w="$2" port r status=0
  shift 2
  printf '%s: W=%s ranks of: %s\n' "$name" "$w" "$*" >> "$OUT/commands.txt"
  if [ "$DRY" = 1 ]; then return 0; fi
  port="$(free_port)"
  local pids=()
  for ((r = 0; r < w; r++)); do
    local share=()
    if [ "$SHARE_GPU" = 1 ]; then share=(NCCL_HOSTID="fsdp-rank-$r" NCCL_SOCKET_IFNAME=lo); fi
    env RANK="$r" LOCAL_RANK="$r" WORLD_SIZE="$w" LOCAL_WORLD_SIZE="$w" MASTER_ADDR=127.0.0.1 \
      MASTER_PORT="$port" "${share[@]}" "$@" > "$OUT/logs/$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  return "$status"
}

launch_step() {
  local name="$1"
  if launch "$@"; then status "$name" ok; else status "$name" FAIL "see logs/$name.rank*.log"; fi
}

# ---- 0. the machine ----

GPUS=0
GPU_NAME="(dry run)"
if [ "$DRY" = 0 ]; then
  GPUS="$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')"
  if [ "$GPUS" -lt 1 ]; then
    echo "bench/gpu/run.sh: no NVIDIA GPU here (nvidia-smi -L lists none); nothing to run" >&2
    exit 2
  fi
  GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  {
    date -u
    nvidia-smi
    "$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda,
          "NCCL", ".".join(map(str, torch.cuda.nccl.version())), "GPUs", torch.cuda.device_count())' 2>&1
    git -C "$ROOT" log -1 --format='commit %H %s' 2>&1
  } > "$OUT/machine.txt"
else
  GPUS="${DRY_RUN_GPUS:-1}"
fi
if [ -z "${HARDWARE:-}" ]; then
  case "$GPU_NAME" in
    *H200*) HARDWARE="$ROOT/bench/hardware/h200.json" ;;
    *) HARDWARE="$ROOT/bench/hardware/h100_sxm.json" ;;  # H100, and the dry run
  esac
fi
note "GPUs: $GPUS ($GPU_NAME); MFU against $(basename "$HARDWARE")"

# ---- 1. build ----

if [ -x "$TRAIN" ]; then
  step build cmake --build "$BUILD" -j"$(nproc)"
else
  step build bash scripts/run.sh build
fi
if [ "$DRY" = 0 ] && ! "$TRAIN" --help 2>&1 | grep -q 'nccl'; then
  status build-has-nccl FAIL "fsdp-train lists no nccl backend: the CUDA path was not built (see the configure output: 'CUDA path: off (...)')"
fi

# ---- 2. tests ----

run_ctest() {  # NAME ARGS...
  local name="$1"
  shift
  run "$name" bash -c "cd '$BUILD' && ctest --output-on-failure --output-junit '$OUT/$name.xml' $*"
}
if run_ctest ctest_cuda -V -L cuda; then
  # ctest passes a run whose tests all skipped: on a GPU machine, "no CUDA device" is a failure.
  # (The two-rank test may skip for another reason, quoted in the log: NCCL refusing two ranks
  # on one GPU.)
  if [ "$DRY" = 1 ]; then
    status ctest_cuda ok
  elif grep -q 'No tests were found\|no CUDA device' "$OUT/logs/ctest_cuda.log"; then
    status ctest_cuda FAIL "no cuda tests, or they found no CUDA device: see logs/ctest_cuda.log"
  elif grep -q 'Skipped' "$OUT/logs/ctest_cuda.log"; then
    status ctest_cuda ok "some skipped, with the reason in logs/ctest_cuda.log"
  else
    status ctest_cuda ok
  fi
else
  status ctest_cuda FAIL "see logs/ctest_cuda.log"
fi
step ctest_nccl_cpu_side bash -c "cd '$BUILD' && ctest --output-on-failure -R 'NcclBackend|CollectiveChecks'"

# ---- 3. ranks, and the collectives over NCCL ----

SHARE_GPU=0
W="$WORLD"
if [ "$GPUS" -lt "$W" ]; then
  SHARE_GPU=1
  if launch probe_shared_gpu "$W" "$BUILD/fsdp-comm-bench" --backend nccl --min-bytes 1K \
      --max-bytes 1M --iters 3 --warmup 1 --timeout-s 120; then
    status probe_shared_gpu ok "NCCL accepts $W ranks on $GPUS GPU(s) with distinct NCCL_HOSTIDs"
  else
    status probe_shared_gpu skipped "NCCL refused $W ranks on $GPUS GPU(s) (logs/probe_shared_gpu.rank0.log): the equality runs use 1 rank"
    SHARE_GPU=0
    W=1
  fi
fi
PERF_W=$((GPUS < WORLD ? GPUS : WORLD))
launch_step comm_bench_nccl "$W" "$BUILD/fsdp-comm-bench" --backend nccl --max-bytes 256M \
  --output "$OUT/comm_nccl_w$W.json"

# ---- 4. equality ----

mkdir -p "$OUT/equality"
EQUALITY="$OUT/equality.md"
{
  echo "| runs | steps | loss | grad norm | parameters (worst tensor) | tolerance | result |"
  echo "|---|---|---|---|---|---|---|"
} > "$EQUALITY"

compare() {  # NAME TOL A_DIR B_DIR
  local name="$1" tol="$2" a="$3" b="$4"
  printf 'compare %s: %s\n' "$name" "$REPORT compare $a $b" >> "$OUT/commands.txt"
  if [ "$DRY" = 1 ]; then return; fi
  if "$PYTHON" "$REPORT" compare --name "$name" --tolerance "$tol" "$a/metrics.jsonl" \
      "$a/model.safetensors" "$b/metrics.jsonl" "$b/model.safetensors" >> "$EQUALITY" \
      2> "$OUT/logs/compare_$name.log"; then
    status "compare $name" ok
  else
    status "compare $name" FAIL "see equality.md and logs/compare_$name.log"
  fi
}

for model in $MODELS; do
  dir="$OUT/equality/$model"
  mkdir -p "$dir/init"
  step "init_$model" "$TRAIN" --nproc 1 --model "$model" --steps 0 --quiet \
    --export "$dir/init/model.safetensors"
  shape=(--model "$model" --init-from "$dir/init/model.safetensors" --steps "$EQ_STEPS"
         --global-batch "$EQ_BATCH" --seq-len "$EQ_SEQ" --quiet)
  for dtype in fp32 bf16; do
    tol=1e-4
    if [ "$dtype" = bf16 ]; then tol=1e-2; fi
    d="$dir/$dtype"
    mkdir -p "$d/gpu" "$d/cpu" "$d/fsdp2"
    launch_step "eq_${model}_${dtype}_gpu" "$W" "$TRAIN" "${shape[@]}" --device cuda \
      --backend nccl --param-dtype "$dtype" --metrics "$d/gpu/metrics.jsonl" \
      --export "$d/gpu/model.safetensors" --dump-batches "$d/batches.bin"
    step "eq_${model}_${dtype}_cpu" "$TRAIN" --nproc "$W" "${shape[@]}" --backend gloo \
      --param-dtype "$dtype" --metrics "$d/cpu/metrics.jsonl" --export "$d/cpu/model.safetensors"
    step "eq_${model}_${dtype}_fsdp2" "$PYTHON" "$REFERENCE" --mode fsdp2 --device cuda \
      --nproc "$W" --init "$dir/init/model.safetensors" --batches "$d/batches.bin" \
      --param-dtype "$dtype" --adamw libtorch --metrics "$d/fsdp2/metrics.jsonl" \
      --export "$d/fsdp2/model.safetensors" --quiet
    compare "${model}_${dtype}_gpu_vs_cpu" "$tol" "$d/gpu" "$d/cpu"
    compare "${model}_${dtype}_gpu_vs_fsdp2" "$tol" "$d/gpu" "$d/fsdp2"
    if [ "$KEEP_EXPORTS" = 0 ] && [ "$DRY" = 0 ]; then rm -f "$d"/*/model.safetensors; fi
  done
  if [ "$KEEP_EXPORTS" = 0 ] && [ "$DRY" = 0 ]; then rm -f "$dir/init/model.safetensors"; fi
done

# ---- 5. performance, bf16 ----

PERF="$OUT/performance.md"
{
  echo "| run | timed steps | step (s) | tokens/s | peak allocated (GiB) | peak reserved (GiB) | MFU |"
  echo "|---|---|---|---|---|---|---|"
} > "$PERF"
PEAK="$("$PYTHON" "$REPORT" peak --hardware "$HARDWARE" --dtype bf16 2> /dev/null || echo 0)"
for model in $MODELS; do
  d="$OUT/performance/$model"
  mkdir -p "$d/init" "$d/ours" "$d/fsdp2"
  perf_shape=(--model "$model" --steps "$PERF_STEPS" --global-batch "$PERF_BATCH"
              --seq-len "$PERF_SEQ" --param-dtype bf16 --quiet)
  step "perf_${model}_init" "$TRAIN" --nproc 1 --model "$model" --steps 0 --quiet \
    --export "$d/init/model.safetensors"
  launch_step "perf_${model}_ours" "$PERF_W" "$TRAIN" "${perf_shape[@]}" --device cuda \
    --backend nccl --init-from "$d/init/model.safetensors" --metrics "$d/ours/metrics.jsonl" \
    --dump-batches "$d/batches.bin"
  step "perf_${model}_fsdp2" "$PYTHON" "$REFERENCE" --mode fsdp2 --device cuda --nproc "$PERF_W" \
    --init "$d/init/model.safetensors" --batches "$d/batches.bin" --param-dtype bf16 \
    --metrics "$d/fsdp2/metrics.jsonl" --quiet
  flops="$("$BUILD/fsdp-plan" --model "$model" --nproc "$PERF_W" --global-batch "$PERF_BATCH" \
    --seq-len "$PERF_SEQ" --param-dtype bf16 --json 2> /dev/null \
    | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["model_flops_per_step"])' \
    2> /dev/null || echo 0)"
  if [ "$DRY" = 0 ]; then
    for side in ours fsdp2; do
      "$PYTHON" "$REPORT" perf --name "$model $side, W=$PERF_W" --metrics "$d/$side/metrics.jsonl" \
        --tokens-per-step $((PERF_BATCH * PERF_SEQ)) --flops-per-step "$flops" \
        --peak-flops "$PEAK" --gpus "$PERF_W" >> "$PERF" 2> "$OUT/logs/perf_report_${model}_$side.log" \
        || status "perf_report_${model}_$side" FAIL "see logs/perf_report_${model}_$side.log"
    done
    if [ "$KEEP_EXPORTS" = 0 ]; then rm -f "$d/init/model.safetensors"; fi
  fi
done

# ---- 6. timeline ----

for model in $MODELS; do
  mkdir -p "$OUT/trace/$model"
  launch_step "trace_$model" "$PERF_W" "$TRAIN" --model "$model" --steps 4 \
    --global-batch "$PERF_BATCH" --seq-len "$PERF_SEQ" --param-dtype bf16 --quiet --device cuda \
    --backend nccl --trace "$OUT/trace/$model"
done

# ---- 7. sanitizers ----

if [ "$SANITIZE" = 1 ]; then
  step sanitizers bash "$ROOT/bench/gpu/sanitize.sh" "$OUT/sanitizers"
else
  status sanitizers skipped "SANITIZE=0"
fi

# ---- summary ----

{
  echo "# bench/gpu/run.sh on $GPU_NAME x $GPUS"
  echo
  echo "Equality runs: W=$W ranks$([ "$SHARE_GPU" = 1 ] && echo " sharing $GPUS GPU(s) (distinct NCCL_HOSTIDs)"), $EQ_STEPS steps of $EQ_BATCH x $EQ_SEQ tokens; performance: W=$PERF_W, $PERF_STEPS steps of $PERF_BATCH x $PERF_SEQ tokens, bf16; MFU against $(basename "$HARDWARE")'s dense bf16 peak."
  echo
  echo "## Steps"
  echo
  echo "| step | result | note |"
  echo "|---|---|---|"
  sed 's/\t/ | /g; s/^/| /; s/$/ |/' "$OUT/status.tsv"
  echo
  echo "## Equality (max relative difference)"
  echo
  cat "$EQUALITY"
  echo
  echo "## Performance"
  echo
  cat "$PERF"
  echo
  echo "Collective timings over NCCL: comm_nccl_w$W.json. Timelines: trace/<model>/rank<N>.json."
} > "$OUT/summary.md"
note "summary: $OUT/summary.md ($failures failed step(s))"
if [ "$DRY" = 1 ]; then note "dry run: the commands are in $OUT/commands.txt"; fi
[ "$failures" = 0 ]
