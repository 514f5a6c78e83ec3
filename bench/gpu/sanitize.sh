#!/usr/bin/env bash
# The CUDA path under NVIDIA's compute-sanitizer and PyTorch's CUDA sanitizer, on a GPU machine:
#
#   bash bench/gpu/sanitize.sh OUT_DIR        (bench/gpu/run.sh runs it as its last step)
#
# First a probe: a 32-thread kernel built with nvcc, under compute-sanitizer. Some machines
# refuse the tool (no debugger interface in a container, an unsupported driver); then nothing
# else runs, OUT_DIR/refused.txt quotes why, and the exit status is 3. Else, by value, as long
# as time is left (each check under timeout(1) until SANITIZE_DEADLINE):
# - compute-sanitizer memcheck on the nccl backend's one-rank test (test_cuda
#   --gtest_filter='NcclCuda.OneRank*') and on 3 steps of fsdp-train --device cuda with the tiny
#   GPT-2 on one rank: out-of-bounds and misaligned accesses, in our kernels and in the ones
#   LibTorch launches for us; then racecheck and synccheck on the same (races on shared memory,
#   bad synchronization). initcheck is left out: NCCL's and cuBLAS' workspaces read
#   uninitialized memory by design.
# - TORCH_CUDA_SANITIZER=1 on PyTorch FSDP2 (bench/reference/fsdp2_reference.py --device cuda)
#   over the same model: CSAN checks that no kernel reads or writes a tensor while a kernel on
#   another stream may still be using it, i.e. the stream and event schedule FSDP2 uses, which
#   ours follows (include/fsdp/runtime/stream_schedule.h). It only sees Python-issued work, so
#   it checks the reference, not fsdp-train.
# Each check's report goes to OUT_DIR/<name>.log and one line to OUT_DIR/summary.txt (ok,
# ERRORS, or "timed out"). A compute-sanitizer check whose every report is one that is not ours
# (bench/gpu/sanitizer_reports.py: NCCL's kernel-image probe, hazards inside PyTorch's attention
# kernel) is ok, and its line says so. Exit status: 0 when no check reported an error, 1 when one
# did, 3 when the machine refused the tool, 4 when no check finished in the time.
#
# Environment: FSDP_BUILD_DIR (default build/), PYTHON (default python3), SANITIZE_DEADLINE
# (epoch seconds; default 10 minutes from now), COMPUTE_SANITIZER (default: on PATH, else
# $CUDA_HOME/bin or /usr/local/cuda/bin), NVCC (likewise).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
OUT="$(realpath -m "$1")"
mkdir -p "$OUT"
: > "$OUT/summary.txt"
BUILD="${FSDP_BUILD_DIR:-$ROOT/build}"
PYTHON="${PYTHON:-python3}"
DEADLINE="${SANITIZE_DEADLINE:-$(($(date +%s) + 600))}"

# cuda_tool NAME: NAME on PATH, else in the CUDA toolkit's bin/.
cuda_tool() {
  local candidate
  for candidate in "$(command -v "$1")" "${CUDA_HOME:-/usr/local/cuda}/bin/$1" \
                   "/usr/local/cuda/bin/$1" "/usr/local/cuda/compute-sanitizer/$1"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then echo "$candidate"; return; fi
  done
}
SANITIZER="${COMPUTE_SANITIZER:-$(cuda_tool compute-sanitizer)}"
NVCC="${NVCC:-$(cuda_tool nvcc)}"

refuse() {
  echo "$*" > "$OUT/refused.txt"
  echo "sanitize.sh: refused: $*" >&2
  exit 3
}

# The machine accepts the tool when a trivial, correct kernel runs clean under it.
probe() {
  [ -n "$SANITIZER" ] || refuse "compute-sanitizer not found (it ships with the CUDA toolkit, not the wheel)"
  [ -n "$NVCC" ] || return 0  # no probe to build: the checks below will tell
  cat > "$OUT/probe.cu" << 'EOF'
#include <cstdio>
__global__ void fill(int* p) { p[threadIdx.x] = threadIdx.x; }
int main() {
  int* p = nullptr;
  if (cudaMalloc(&p, 32 * sizeof(int)) != cudaSuccess) return 2;
  fill<<<1, 32>>>(p);
  cudaError_t e = cudaDeviceSynchronize();
  std::printf("probe: %s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 3;
}
EOF
  "$NVCC" -o "$OUT/probe" "$OUT/probe.cu" > "$OUT/probe_build.log" 2>&1 \
    || refuse "nvcc could not build the probe: $(tail -3 "$OUT/probe_build.log" | tr '\n' ' ')"
  timeout 60 "$SANITIZER" --tool memcheck --error-exitcode 1 "$OUT/probe" > "$OUT/probe.log" 2>&1 \
    || refuse "a correct kernel fails under compute-sanitizer: $(grep -m3 'Error\|error' "$OUT/probe.log" | tr '\n' ' ')"
}

failures=0
finished=0
# check NAME CMD...: CMD under timeout(1) until the deadline, output in OUT/NAME.log.
check() {
  local name="$1" left rc start
  shift
  left=$((DEADLINE - $(date +%s)))
  if [ "$left" -lt 10 ]; then
    echo "$name: not run (no time left)" >> "$OUT/summary.txt"
    return
  fi
  start="$(date +%s)"
  timeout -k 5 "$left" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  local took=$(($(date +%s) - start))
  local excused=""
  if [ "$rc" = 1 ] && [[ "$name" =~ ^(memcheck|racecheck|synccheck)_ ]]; then
    # Reports that are not ours (bench/gpu/sanitizer_reports.py, [Note: the reports we excuse]).
    excused="$("$PYTHON" "$ROOT/bench/gpu/sanitizer_reports.py" "$OUT/$name.log")" && rc=0 \
      || excused=""
  fi
  if [ "$rc" = 0 ]; then
    echo "$name: ok (${took} s${excused:+; $excused})" >> "$OUT/summary.txt"
    finished=$((finished + 1))
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "$name: timed out after ${took} s" >> "$OUT/summary.txt"
  else
    echo "$name: ERRORS (exit $rc, ${took} s; $name.log)" >> "$OUT/summary.txt"
    failures=$((failures + 1))
    finished=$((finished + 1))
  fi
}

probe
san=("$SANITIZER" --error-exitcode 1 --tool)  # then the tool's name
one_rank=("$BUILD/tests/test_cuda" --gtest_filter='NcclCuda.OneRank*')
# fsdp-train's tiny GPT-2, 3 steps on one rank; rank_env before it (a fresh port each time).
tiny=("$BUILD/fsdp-train" --model tiny --steps 3 --global-batch 4 --seq-len 64 --quiet
      --device cuda --backend nccl)
rank_env() {
  echo env RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT="$((20000 + RANDOM % 20000))"
}

check memcheck_test_cuda "${san[@]}" memcheck "${one_rank[@]}"
# shellcheck disable=SC2046  # rank_env's words are separate arguments
check memcheck_fsdp_train $(rank_env) "${san[@]}" memcheck "${tiny[@]}"
check racecheck_test_cuda "${san[@]}" racecheck "${one_rank[@]}"
check synccheck_test_cuda "${san[@]}" synccheck "${one_rank[@]}"

# CSAN needs the reference's inputs: fsdp-train's initial weights and batches of the tiny model.
init="$OUT/csan_init/model.safetensors"
mkdir -p "$(dirname "$init")"
check csan_inputs bash -c "'$BUILD/fsdp-train' --nproc 1 --model tiny --steps 0 --quiet \
  --export '$init' && '$BUILD/fsdp-train' --nproc 1 --model tiny --steps 3 --global-batch 4 \
  --seq-len 64 --quiet --dump-batches '$OUT/csan_batches.bin'"
check torch_cuda_sanitizer env TORCH_CUDA_SANITIZER=1 "$PYTHON" \
  "$ROOT/bench/reference/fsdp2_reference.py" --mode fsdp2 --device cuda --nproc 1 \
  --init "$init" --batches "$OUT/csan_batches.bin" --quiet
# shellcheck disable=SC2046
check racecheck_fsdp_train $(rank_env) "${san[@]}" racecheck "${tiny[@]}"
# shellcheck disable=SC2046
check synccheck_fsdp_train $(rank_env) "${san[@]}" synccheck "${tiny[@]}"
rm -rf "$OUT/csan_init" "$OUT/csan_batches.bin" "$OUT/probe"

cat "$OUT/summary.txt" >&2
if [ "$failures" -gt 0 ]; then exit 1; fi
if [ "$finished" = 0 ]; then exit 4; fi
exit 0
