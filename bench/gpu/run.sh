#!/usr/bin/env bash
# The GPU programme, made to run offline on a lent GPU machine within its time:
#
#   bash bench/gpu/stage.sh                          # first, where apt works: fills .gpu-stage/
#   bash bench/gpu/run.sh OUT [--only STEP[,STEP...]] [--dry-run]   # on the GPU machine
#
# The GPU machine has no network: nothing here calls apt-get or pip. LibTorch is the torch of
# `python3` (or $PYTHON); the -dev packages it lacks come from .gpu-stage/, unpacked with
# dpkg -x into build-gpu/deps, never into /. The build uses Ninja on every core, builds only the
# targets the steps need, with the mpi backend off, in build-gpu/ (kept between runs on the same
# machine: a second run rebuilds nothing).
#
# The steps, by value, so that a run cut short has already returned the most useful:
#   build       configure and build (works without a GPU: bench/gpu/rehearse.sh runs it here)
#   ctest_cuda  ctest -L cuda: the nccl backend's collectives against gloo (JUnit XML in OUT)
#   comm_bench  fsdp-comm-bench over NCCL, on 2 ranks sharing the GPU where NCCL accepts them
#               (each rank its own NCCL_HOSTID: NCCL's socket transport over loopback), else 1
#   equality    3 steps from the same exported weights and batches: gpt2 (124M) fp32, ours on
#               the GPU against ours on the CPU and against PyTorch FSDP2 on the GPU (losses,
#               grad norms, parameters, 1e-5 relative); llama-1b bf16, ours against FSDP2
#               (losses and grad norms, 1e-2)
#   speed       bf16, one rank, ours against FSDP2 (with torch's AdamW as it is by default on
#               CUDA, multi-tensor) on the same GPU: gpt2 8 x 1024 and llama-1b
#               4 x 2048; median step time, tokens/s, MFU (fsdp-plan's model FLOPs over the
#               dense bf16 peak of bench/hardware/<gpu>.json), the allocator peaks FSDP2
#               reports, and each run's device footprint from nvidia-smi
#   trace       fsdp-train --trace of 3 llama-1b steps at the speed shape (rank 0's timeline)
#   sanitizer   bench/gpu/sanitize.sh (compute-sanitizer; skipped, with why, where refused)
# Each step runs under its own limit (LIMIT_<STEP> seconds, below) and every command in it
# under timeout(1) with what is left of that limit; the whole run under BUDGET_S (480 s: the
# GPU machine is lent for 15 minutes, one to two of which go to starting it). A step that no
# longer fits is skipped, with the reason. A failed step never stops the run.
#
# OUT receives at most 8 files (the device returns no more), each rewritten after every step,
# so that a run cut short still returns whole files:
#   summary.md       read first: the steps, equality, speed, collectives, tests
#   status.tsv       each step and check: ok, FAIL, TIMEOUT or skipped, seconds, why
#   results.json     every number (records of report.py), the machine, the steps
#   logs.tar.gz      every command's log, and commands.txt (every command, in order)
#   trace-llama-1b-rank0.json   rank 0's timeline (open in Perfetto), gzipped if over 15 MiB
#   junit-cuda.xml   ctest -L cuda's JUnit report
# Scratch (metrics, exports, batches; llama-1b's weights are 5 GB) goes to WORK, by default
# build-gpu/work, emptied at the start. Exit status: 0 when no step failed, else 1; 2 for a
# usage error.
#
# Environment (defaults in brackets): PYTHON [python3], BUDGET_S [480], LIMIT_BUILD [240],
# LIMIT_CTEST_CUDA [75], LIMIT_COMM_BENCH [45], LIMIT_EQUALITY [150], LIMIT_SPEED [120],
# LIMIT_TRACE [50], LIMIT_SANITIZER [120], WORLD [2], EQ_STEPS [3], EQ_BATCH [4], EQ_SEQ [128],
# PERF_STEPS [10], HARDWARE [from nvidia-smi's GPU name], WORK [build-gpu/work],
# JOBS [all cores].
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT" || exit 2

ALL_STEPS=(build ctest_cuda comm_bench equality speed trace sanitizer)
declare -A LIMIT=(
  [build]="${LIMIT_BUILD:-240}" [ctest_cuda]="${LIMIT_CTEST_CUDA:-75}"
  [comm_bench]="${LIMIT_COMM_BENCH:-45}" [equality]="${LIMIT_EQUALITY:-150}"
  [speed]="${LIMIT_SPEED:-120}" [trace]="${LIMIT_TRACE:-50}"
  [sanitizer]="${LIMIT_SANITIZER:-120}")
BUDGET_S="${BUDGET_S:-480}"
MIN_STEP_S=20  # a step given less than this is skipped: it could not finish anything
WORLD="${WORLD:-2}"
EQ_STEPS="${EQ_STEPS:-3}" EQ_BATCH="${EQ_BATCH:-4}" EQ_SEQ="${EQ_SEQ:-128}"
PERF_STEPS="${PERF_STEPS:-10}"
BUILD="$ROOT/build-gpu"
DEPS="$BUILD/deps"
STAGE="$ROOT/.gpu-stage"
WORK="${WORK:-$BUILD/work}"
LOGS="$WORK/logs"
REPORT="$ROOT/bench/gpu/report.py"
REFERENCE="$ROOT/bench/reference/fsdp2_reference.py"
TRAIN="$BUILD/fsdp-train"
TARGETS=(fsdp-train fsdp-plan fsdp-comm-bench test_cuda)
# The staged static archives (see [Note: what is staged, and why no runtime libraries] in
# stage.sh): linked instead of shared libraries the GPU machine does not have.
MULTIARCH_LIB="$DEPS/usr/lib/x86_64-linux-gnu"

usage() {
  echo "usage: $0 OUT [--only STEP[,STEP...]] [--dry-run]   (steps: ${ALL_STEPS[*]})" >&2
  exit 2
}

# ---- arguments ----

if [ $# -lt 1 ] || [ "${1:0:1}" = - ]; then usage; fi
OUT="$(realpath -m "$1")"
shift
STEPS=("${ALL_STEPS[@]}")
DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --only)
      [ $# -ge 2 ] || usage
      IFS=, read -r -a STEPS <<< "$2"
      for s in "${STEPS[@]}"; do
        [ -n "${LIMIT[$s]:-}" ] || { echo "$0: no step '$s' (steps: ${ALL_STEPS[*]})" >&2; exit 2; }
      done
      shift 2 ;;
    --dry-run) DRY=1; shift ;;
    *) usage ;;
  esac
done
wants() { [[ " ${STEPS[*]} " == *" $1 "* ]]; }

PYTHON="$(command -v "${PYTHON:-python3}")" || { echo "$0: no python3 on PATH" >&2; exit 2; }
JOBS="${JOBS:-$(nproc)}"

# ---- output: status rows, records, the files in OUT ----

note() { echo "== $*" >&2; }
failures=0

# status NAME RESULT SECONDS [WHY]: one row of status.tsv, then OUT's files again.
status() {
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >> "$OUT/status.tsv"
  case "$1/$2" in */*/*) ;; */FAIL | */TIMEOUT) failures=$((failures + 1)) ;; esac  # steps only
  note "$1: $2${4:+ ($4)}"
  publish
}

# record KIND KEY=VALUE...: one record for results.json (report.py note).
record() {
  local kind="$1"
  shift
  "$PYTHON" "$REPORT" note --record "$WORK/records.jsonl" --kind "$kind" "$@"
}

publish() {
  "$PYTHON" "$REPORT" summarize --work "$WORK" --out "$OUT" 2>> "$LOGS/report.log"
  tar -czf "$OUT/.logs.tar.gz.tmp" -C "$WORK" logs 2> /dev/null \
    && mv "$OUT/.logs.tar.gz.tmp" "$OUT/logs.tar.gz"
}

# ---- running commands within the step's time ----

step_left() { echo $((STEP_END - $(date +%s))); }

# run NAME CMD...: CMD under timeout(1) with what is left of the step, output in logs/NAME.log.
# Returns CMD's status (124: the step's time ran out).
run() {
  local name="$1" left
  shift
  printf '%s: %s\n' "$name" "$*" >> "$LOGS/commands.txt"
  [ "$DRY" = 0 ] || return 0
  left="$(step_left)"
  [ "$left" -gt 0 ] || return 124
  timeout -k 5 "$left" "$@" > "$LOGS/$name.log" 2>&1
}

# fn NAME FUNCTION [ARGS...]: a function of this script (no timeout: each is quick, or runs its
# long commands through run), output in logs/NAME.log.
fn() {
  local name="$1"
  shift
  printf '%s: %s\n' "$name" "$*" >> "$LOGS/commands.txt"
  [ "$DRY" = 0 ] || return 0
  "$@" > "$LOGS/$name.log" 2>&1
}

free_port() {
  "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# launch NAME W CMD...: W ranks of CMD with torchrun's variables, each under timeout(1) with
# what is left of the step, output in logs/NAME.rank<R>.log. Ranks share the GPU when
# SHARE_GPU=1: each gets its own NCCL_HOSTID, so NCCL sees W hosts (socket transport over lo).
launch() {
  local name="$1" w="$2" port r rc=0 left
  shift 2
  printf '%s: W=%s ranks of: %s\n' "$name" "$w" "$*" >> "$LOGS/commands.txt"
  [ "$DRY" = 0 ] || return 0
  left="$(step_left)"
  [ "$left" -gt 0 ] || return 124
  port="$(free_port)"
  local pids=()
  for ((r = 0; r < w; r++)); do
    local share=()
    if [ "$SHARE_GPU" = 1 ] && [ "$w" -gt 1 ]; then
      share=(NCCL_HOSTID="fsdp-rank-$r" NCCL_SOCKET_IFNAME=lo)
    fi
    env RANK="$r" LOCAL_RANK="$r" WORLD_SIZE="$w" LOCAL_WORLD_SIZE="$w" MASTER_ADDR=127.0.0.1 \
      MASTER_PORT="$port" "${share[@]}" timeout -k 5 "$left" "$@" \
      > "$LOGS/$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  return "$rc"
}

# check NAME RC [WHY]: a row for one check of the step; a failed one fails the step. Returns 0
# when the check passed (always in a dry run), else 1.
check() {
  local result=ok why="${3:-}"
  if [ "$2" = 124 ]; then
    result=TIMEOUT why="the step's time ran out${why:+; $why}"
  elif [ "$2" != 0 ]; then
    result=FAIL
  fi
  if [ "$DRY" = 1 ]; then
    status "$STEP/$1" "listed (dry run)" - "$why"
    return 0
  fi
  status "$STEP/$1" "$result" - "$why"
  [ "$result" = ok ] || { STEP_FAILED=1; return 1; }
}

# ---- the machine ----

GPUS=0
probe_machine() {
  GPUS="$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')"
  local gpu driver
  gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1)"
  driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2> /dev/null | head -1)"
  if [ -z "${HARDWARE:-}" ]; then
    case "$gpu" in
      *H200*) HARDWARE="$ROOT/bench/hardware/h200.json" ;;
      *) HARDWARE="$ROOT/bench/hardware/h100_sxm.json" ;;
    esac
  fi
  local versions
  versions="$("$PYTHON" -c 'import torch; n = torch.cuda.nccl.version() if torch.cuda.is_available() else ()
print(torch.__version__, torch.version.cuda, ".".join(map(str, n)) or "n/a")' 2> /dev/null)"
  read -r torch_version cuda_version nccl_version <<< "$versions"
  record machine gpu="${gpu:-none}" gpus:="$GPUS" driver="${driver:-n/a}" \
    torch="${torch_version:-?}" cuda="${cuda_version:-?}" nccl="${nccl_version:-?}" \
    hardware="$(basename "$HARDWARE")" commit="$(git -C "$ROOT" describe --always --dirty 2> /dev/null)" \
    python="$PYTHON" cores:="$JOBS"
  nvidia-smi > "$LOGS/nvidia-smi.log" 2>&1
}

# ---- step: build ----

# Unpacks the staged packages into DEPS unless DEPS holds exactly them already.
unpack_stage() {
  [ -f "$STAGE/MANIFEST.tsv" ] || {
    echo "no $STAGE/MANIFEST.tsv: run bash bench/gpu/stage.sh where apt works, and carry .gpu-stage" >&2
    return 1
  }
  if cmp -s "$STAGE/MANIFEST.tsv" "$DEPS/MANIFEST.tsv"; then return 0; fi
  rm -rf "$DEPS" "$BUILD/googletest"
  mkdir -p "$DEPS"
  local deb
  for deb in "$STAGE"/*.deb; do
    if command -v dpkg-deb > /dev/null; then
      dpkg-deb -x "$deb" "$DEPS" || return 1
    else  # a .deb is an ar archive; its files are in data.tar.*
      (cd "$DEPS" && ar p "$deb" "$(ar t "$deb" | grep '^data\.tar')" > data.tar \
        && tar -xf data.tar && rm data.tar) || return 1
    fi
  done
  cp "$STAGE/MANIFEST.tsv" "$DEPS/MANIFEST.tsv"
}

# GoogleTest and GoogleMock from the staged source, with this machine's compiler, into DEPS/gtest.
build_googletest() {
  [ ! -f "$DEPS/gtest/.built" ] || return 0
  run build_gtest_configure cmake -S "$DEPS/usr/src/googletest" -B "$BUILD/googletest" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$DEPS/gtest" -DBUILD_GMOCK=ON \
    -DINSTALL_GTEST=ON -DCMAKE_CXX_COMPILER_LAUNCHER="${FSDP_CCACHE:-}" \
    && run build_gtest_compile cmake --build "$BUILD/googletest" -j"$JOBS" \
    && run build_gtest_install cmake --install "$BUILD/googletest" \
    && touch "$DEPS/gtest/.built"
}

# configure TORCH_PREFIX
configure() {
  run build_configure cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$1;$DEPS/gtest;$DEPS/usr" \
    -DCMAKE_CXX_COMPILER_LAUNCHER="${FSDP_CCACHE:-}" -DFSDP_PYTHON="$PYTHON" -DFSDP_MPI=OFF \
    -DFSDP_XXHASH_LIBRARY="$MULTIARCH_LIB/libxxhash.a" \
    -DFSDP_PCRE2_LIBRARY="$MULTIARCH_LIB/libpcre2-8.a" \
    -DFSDP_UTF8PROC_LIBRARY="$MULTIARCH_LIB/libutf8proc.a"
}

# Every built program finds every shared library it needs (the staged ones are static: none of
# theirs may appear), and the CUDA path is in.
check_built() {
  local target missing=0
  for target in "${TARGETS[@]}"; do
    if ldd "$BUILD/$target" | grep 'not found'; then
      echo "$target: shared libraries not found (above)" >&2
      missing=1
    fi
  done
  grep -q 'CUDA path: on' "$LOGS/build_configure.log" || {
    echo "the CUDA path was not configured: see its line in build_configure.log" >&2
    return 1
  }
  return "$missing"
}

# The tools a build needs that the machine must have itself (the image's, not staged).
check_tools() {
  local tool
  for tool in cmake ninja ar tar ldd; do
    command -v "$tool" > /dev/null || { echo "no $tool on PATH: the GPU image should have it" >&2; return 1; }
  done
  command -v "${CXX:-c++}" > /dev/null || command -v g++ > /dev/null \
    || { echo "no C++ compiler on PATH (\$CXX, c++ or g++)" >&2; return 1; }
  {  # for the log; head may cut a pipe short, so their status is not the function's
    cmake --version | head -1
    "${CXX:-c++}" --version 2> /dev/null | head -1 || g++ --version | head -1
    ldd --version | head -1
  } || true
}

step_build() {
  # shellcheck source=scripts/lib/ccache_env.sh
  . "$ROOT/scripts/lib/ccache_env.sh"
  fn build_tools check_tools; check tools $? || return 1
  local torch_prefix
  torch_prefix="$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>&1)"
  check torch $? "$PYTHON: ${torch_prefix##*$'\n'}" || return 1
  [ "$DRY" = 0 ] || torch_prefix="<python3's torch.utils.cmake_prefix_path>"
  fn build_unpack unpack_stage
  check unpack $? "$(find "$STAGE" -name '*.deb' | wc -l) staged packages into $DEPS" || return 1
  build_googletest; check googletest $? || return 1
  configure "$torch_prefix"; check configure $? || return 1
  local started
  started="$(date +%s)"
  run build_compile cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}"
  check compile $? "targets ${TARGETS[*]}, $JOBS jobs" || return 1
  [ "$DRY" = 1 ] || record build compile_seconds:=$(($(date +%s) - started)) jobs:="$JOBS" \
    ccache="${FSDP_CCACHE:-none}" targets="${TARGETS[*]}"
  fn build_check check_built; check libraries $? "every program's shared libraries resolve" || return 1
}

# ---- step: ctest -L cuda ----

step_ctest_cuda() {
  run ctest_cuda bash -c "cd '$BUILD' && ctest -L cuda --output-on-failure \
    --output-junit '$OUT/junit-cuda.xml'"
  local rc=$? log="$LOGS/ctest_cuda.log"
  [ "$DRY" = 0 ] || return 0
  local passed skipped failed
  # ctest's one line per test: " 1/3 Test #1: NcclCuda.OneRank...   Passed    5.21 sec"
  passed="$(grep -cE '^ *[0-9]+/[0-9]+ Test +#.* Passed ' "$log")"
  skipped="$(grep -cE '^ *[0-9]+/[0-9]+ Test +#.*Skipped' "$log")"
  failed="$(grep -E '^ *[0-9]+/[0-9]+ Test +#' "$log" | grep -cvE ' Passed |Skipped')"
  record ctest label=cuda passed:="$passed" skipped:="$skipped" failed:="$failed" exit:="$rc"
  # ctest passes a run whose tests all skipped; on a GPU machine "no CUDA device" is a failure.
  if grep -q 'No tests were found\|no CUDA device' "$log"; then
    check tests 1 "no cuda tests, or they found no CUDA device (logs/ctest_cuda.log)"
    return 1
  fi
  check tests "$rc" "$passed passed, $skipped skipped (why: logs/ctest_cuda.log), $failed failed"
}

# ---- step: fsdp-comm-bench over NCCL ----

SHARE_GPU=0
W=1
RANKS_CHOSEN=0
# Whether NCCL accepts WORLD ranks on the GPUs there are (distinct NCCL_HOSTIDs when fewer GPUs
# than ranks); sets W and SHARE_GPU for the multi-rank runs, once.
choose_ranks() {
  [ "$RANKS_CHOSEN" = 0 ] || return 0
  RANKS_CHOSEN=1
  W="$WORLD"
  SHARE_GPU=0
  [ "$GPUS" -lt "$W" ] || return 0
  SHARE_GPU=1
  if launch probe_shared_gpu "$W" "$BUILD/fsdp-comm-bench" --backend nccl --min-bytes 1K \
      --max-bytes 1M --iters 3 --warmup 1 --timeout-s 30 --collectives all_reduce; then
    check probe_shared_gpu 0 "NCCL accepts $W ranks on $GPUS GPU(s) with distinct NCCL_HOSTIDs"
  else
    status "$STEP/probe_shared_gpu" skipped - "NCCL refused $W ranks on $GPUS GPU(s) (logs/probe_shared_gpu.rank0.log): the multi-rank runs use 1 rank"
    SHARE_GPU=0
    W=1
  fi
}

step_comm_bench() {
  choose_ranks
  local json="$WORK/comm_nccl_w$W.json"
  launch comm_bench "$W" "$BUILD/fsdp-comm-bench" --backend nccl --max-bytes 64M \
    --time-budget-s 0.5 --collectives all_gather,reduce_scatter,all_reduce,broadcast \
    --timeout-s 30 --output "$json"
  local rc=$?
  [ "$rc" != 0 ] || [ "$DRY" = 1 ] || record comm_bench data="@$json" \
    ranks_note="$([ "$SHARE_GPU" = 1 ] && echo "$W ranks sharing $GPUS GPU(s), socket transport" || echo "$W rank(s)")"
  check busbw "$rc" "W=$W"
}

# ---- step: equality ----

# export_init MODEL: fsdp-train's initial weights of MODEL (the same seed every time) in
# WORK/init/MODEL/model.safetensors, unless there already.
export_init() {
  local dir="$WORK/init/$1"
  [ -f "$dir/model.safetensors" ] && return 0
  mkdir -p "$dir"
  run "init_$1" "$TRAIN" --nproc 1 --model "$1" --steps 0 --quiet --export "$dir/model.safetensors"
}

# compare NAME TOL A B [weights|-] [--across-devices]: report.py compare of two runs' outputs.
compare() {
  local name="$1" tol="$2" a="$3" b="$4" wa=- wb=-
  if [ "${5:-}" = weights ]; then wa="$a/model.safetensors" wb="$b/model.safetensors"; fi
  run "compare_$name" "$PYTHON" "$REPORT" compare --name "$name" --tolerance "$tol" \
    --record "$WORK/records.jsonl" "${@:6}" "$a/metrics.jsonl" "$wa" "$b/metrics.jsonl" "$wb"
  check "$name" $? "tolerance $tol (numbers: summary.md, logs/compare_$name.log)"
}

# equal_runs MODEL DTYPE TOL CPU(0|1) WEIGHTS(weights|-): ours on the GPU (W ranks) against
# FSDP2 on the GPU and, with CPU=1, ours on the CPU over gloo.
equal_runs() {
  local model="$1" dtype="$2" tol="$3" cpu="$4" weights="$5"
  local d="$WORK/equality/${model}_$dtype" init="$WORK/init/$model/model.safetensors"
  mkdir -p "$d/gpu" "$d/cpu" "$d/fsdp2"
  export_init "$model"; check "init_$model" $? || return 1
  local shape=(--model "$model" --init-from "$init" --steps "$EQ_STEPS" --global-batch "$EQ_BATCH"
               --seq-len "$EQ_SEQ" --param-dtype "$dtype" --quiet --timeout-s 60)
  local export_gpu=() export_cpu=() export_ref=()
  if [ "$weights" = weights ]; then
    export_gpu=(--export "$d/gpu/model.safetensors")
    export_cpu=(--export "$d/cpu/model.safetensors")
    export_ref=(--export "$d/fsdp2/model.safetensors")
  fi
  launch "eq_${model}_${dtype}_gpu" "$W" "$TRAIN" "${shape[@]}" --device cuda --backend nccl \
    --metrics "$d/gpu/metrics.jsonl" --dump-batches "$d/batches.bin" "${export_gpu[@]}"
  check "${model}_${dtype}_gpu" $? "W=$W" || return 1
  run "eq_${model}_${dtype}_fsdp2" "$PYTHON" "$REFERENCE" --mode fsdp2 --device cuda --nproc "$W" \
    --init "$init" --batches "$d/batches.bin" --param-dtype "$dtype" --adamw libtorch \
    --metrics "$d/fsdp2/metrics.jsonl" "${export_ref[@]}" --quiet
  check "${model}_${dtype}_fsdp2" $? && compare "${model}_${dtype}_gpu_vs_fsdp2" "$tol" "$d/gpu" "$d/fsdp2" "$weights"
  if [ "$cpu" = 1 ]; then
    local gap=()  # the step-1 bound follows FSDP2's own gap to the CPU run, when it ran
    [ -s "$d/fsdp2/metrics.jsonl" ] && gap=(--reference-gap "$d/fsdp2/metrics.jsonl")
    run "eq_${model}_${dtype}_cpu" "$TRAIN" --nproc "$W" "${shape[@]}" --backend gloo \
      --metrics "$d/cpu/metrics.jsonl" "${export_cpu[@]}"
    check "${model}_${dtype}_cpu" $? && compare "${model}_${dtype}_gpu_vs_cpu" "$tol" "$d/gpu" "$d/cpu" "$weights" \
      --across-devices "${gap[@]}"
  fi
  rm -f "$d"/*/model.safetensors
}

step_equality() {
  choose_ranks
  equal_runs gpt2 fp32 1e-5 1 weights
  equal_runs llama-1b bf16 1e-2 0 -
  return "$STEP_FAILED"
}

# ---- step: speed ----

# sample_gpu_memory FILE: nvidia-smi's memory.used of GPU 0 every 100 ms into FILE, in the
# background; stop it with kill "$SAMPLER".
sample_gpu_memory() {
  nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$1" 2>&1 &
  SAMPLER=$!
  sleep 0.3  # the idle level, first
}

# speed_pair MODEL BATCH SEQ: ours, then FSDP2 on the batches ours trained on, one rank each.
speed_pair() {
  local model="$1" batch="$2" seq="$3" d="$WORK/speed/$1" init="$WORK/init/$1/model.safetensors"
  mkdir -p "$d/ours" "$d/fsdp2"
  export_init "$model"; check "init_$model" $? || return 1
  local flops peak
  flops="$("$BUILD/fsdp-plan" --model "$model" --nproc 1 --global-batch "$batch" --seq-len "$seq" \
    --param-dtype bf16 --hardware "$HARDWARE" --json 2> "$LOGS/plan_$model.log" \
    | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["model_flops_per_step"])' \
    2>> "$LOGS/plan_$model.log" || echo 0)"
  peak="$("$PYTHON" "$REPORT" peak --hardware "$HARDWARE" --dtype bf16 2>> "$LOGS/plan_$model.log" || echo 0)"
  local shape=(--model "$model" --steps "$PERF_STEPS" --global-batch "$batch" --seq-len "$seq"
               --param-dtype bf16 --quiet --init-from "$init")
  local side rc
  for side in ours fsdp2; do
    [ "$DRY" = 1 ] || sample_gpu_memory "$d/$side/gpu_memory.csv"
    if [ "$side" = ours ]; then
      SHARE_GPU=0 launch "speed_${model}_ours" 1 "$TRAIN" "${shape[@]}" --device cuda \
        --backend nccl --timeout-s 60 --metrics "$d/ours/metrics.jsonl" --dump-batches "$d/batches.bin"
    else
      run "speed_${model}_fsdp2" "$PYTHON" "$REFERENCE" --mode fsdp2 --device cuda --nproc 1 \
        --init "$init" --batches "$d/batches.bin" --param-dtype bf16 --adamw-foreach \
        --metrics "$d/fsdp2/metrics.jsonl" --quiet
    fi
    rc=$?
    [ "$DRY" = 1 ] || { kill "$SAMPLER" 2> /dev/null; wait "$SAMPLER" 2> /dev/null; }
    check "${model}_$side" "$rc" "${batch} x ${seq} tokens, $PERF_STEPS steps" || continue
    run "perf_${model}_$side" "$PYTHON" "$REPORT" perf --name "$model $side" --model "$model" \
      --side "$side" --metrics "$d/$side/metrics.jsonl" --tokens-per-step $((batch * seq)) \
      --flops-per-step "$flops" --peak-flops "$peak" --gpus 1 \
      --gpu-samples "$d/$side/gpu_memory.csv" --record "$WORK/records.jsonl"
    check "${model}_${side}_report" $?
  done
}

step_speed() {
  speed_pair gpt2 8 1024
  speed_pair llama-1b 4 2048
  return "$STEP_FAILED"
}

# ---- step: trace ----

step_trace() {
  local dir="$WORK/trace/llama-1b" init="$WORK/init/llama-1b/model.safetensors"
  export_init llama-1b; check init_llama-1b $? || return 1
  mkdir -p "$(dirname "$dir")"  # --trace creates its own folder, not the ones above it
  SHARE_GPU=0 launch trace_llama-1b 1 "$TRAIN" --model llama-1b --init-from "$init" --steps 3 \
    --global-batch 4 --seq-len 2048 --param-dtype bf16 --quiet --device cuda --backend nccl \
    --timeout-s 60 --trace "$dir"
  check llama-1b $? "3 steps, 4 x 2048, bf16" || return 1
  [ "$DRY" = 0 ] || return 0
  local out="$OUT/trace-llama-1b-rank0.json"
  cp "$dir/rank0.json" "$out" || return 1
  if [ "$(stat -c %s "$out")" -gt $((15 * 1024 * 1024)) ]; then gzip -f "$out" && out="$out.gz"; fi
  record trace file="$(basename "$out")" bytes:="$(stat -c %s "$out")"
}

# ---- step: sanitizer ----

step_sanitizer() {
  run sanitizer env FSDP_BUILD_DIR="$BUILD" PYTHON="$PYTHON" SANITIZE_DEADLINE="$STEP_END" \
    bash "$ROOT/bench/gpu/sanitize.sh" "$WORK/logs/sanitizer"
  local rc=$?
  [ "$DRY" = 0 ] || return 0
  local summary
  # One line per check in the file; one line in status.tsv, whose rows are lines.
  summary="$(paste -sd ';' "$WORK/logs/sanitizer/summary.txt" 2> /dev/null | sed 's/;/; /g')"
  record sanitizer exit:="$rc" summary="${summary:-none}"
  if [ "$rc" = 3 ]; then
    STEP_NOTE="refused: $(cat "$WORK/logs/sanitizer/refused.txt" 2> /dev/null)"
    return 2
  fi
  check tools "$rc" "${summary:-see logs/sanitizer/}"
}

# ---- driver ----

# run_step NAME: the step under min(its limit, what is left of the budget); one status row.
run_step() {
  STEP="$1"
  local left=$((BUDGET_END - $(date +%s))) limit="${LIMIT[$1]}" start rc result
  [ "$limit" -le "$left" ] || limit="$left"
  if [ "$limit" -lt "$MIN_STEP_S" ]; then
    status "$1" skipped 0 "${left} s left of the ${BUDGET_S} s budget"
    return
  fi
  if [ "$1" != build ] && [ "$GPUS" -lt 1 ] && [ "$DRY" = 0 ]; then
    status "$1" skipped 0 "no NVIDIA GPU here (nvidia-smi lists none)"
    return
  fi
  if [ "$1" != build ] && [ ! -x "$TRAIN" ] && [ "$DRY" = 0 ]; then
    status "$1" skipped 0 "nothing built: $TRAIN is missing (the build step failed or did not run)"
    return
  fi
  start="$(date +%s)"
  STEP_END=$((start + limit))
  STEP_NOTE=""
  STEP_FAILED=0
  "step_$1"
  rc=$?
  case "$rc" in
    0) result=ok ;;
    2) result=skipped ;;
    *) result=FAIL ;;
  esac
  [ "$DRY" = 0 ] || result="listed (dry run)"
  if [ "$result" = FAIL ] && [ "$(date +%s)" -ge "$STEP_END" ]; then
    result=TIMEOUT STEP_NOTE="limit $limit s${STEP_NOTE:+; $STEP_NOTE}"
  fi
  status "$1" "$result" $(($(date +%s) - start)) "$STEP_NOTE"
}

main() {
  mkdir -p "$OUT"
  rm -rf "$WORK"
  mkdir -p "$LOGS"
  rm -f "$OUT"/{summary.md,status.tsv,results.json,logs.tar.gz,junit-cuda.xml} \
    "$OUT"/trace-llama-1b-rank0.json*
  printf 'step\tresult\tseconds\tnote\n' > "$OUT/status.tsv"
  BUDGET_END=$(($(date +%s) + BUDGET_S))
  HARDWARE="${HARDWARE:-}"
  if [ "$DRY" = 0 ]; then probe_machine; else GPUS=1 HARDWARE="${HARDWARE:-none}"; fi
  note "steps: ${STEPS[*]}; GPUs: $GPUS; budget ${BUDGET_S} s; log: $LOGS"
  local s
  for s in "${ALL_STEPS[@]}"; do
    if wants "$s"; then run_step "$s"; fi
  done
  rm -rf "$WORK/init" "$WORK/equality" "$WORK/speed"  # gigabytes of weights and batches
  publish
  note "summary: $OUT/summary.md ($failures step(s) failed)"
  [ "$failures" = 0 ]
}

main
