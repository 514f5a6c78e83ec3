#!/usr/bin/env bash
# The CUDA path under NVIDIA's compute-sanitizer and PyTorch's CUDA sanitizer, on a GPU machine:
#
#   bash bench/gpu/sanitize.sh OUT_DIR        (bench/gpu/run.sh runs it as its last step)
#
# - compute-sanitizer --tool memcheck, racecheck and synccheck on the nccl backend's one-rank
#   test (test_cuda --gtest_filter='NcclCuda.OneRank*') and on a few steps of fsdp-train
#   --device cuda with the tiny GPT-2 on one rank: out-of-bounds and misaligned accesses, races
#   on shared memory, bad synchronization in our kernels and in the ones LibTorch launches for us.
#   (initcheck is left out: NCCL's and cuBLAS' workspaces read uninitialized memory by design.)
# - TORCH_CUDA_SANITIZER=1 on PyTorch FSDP2 (bench/reference/fsdp2_reference.py --device cuda)
#   over the same model: CSAN checks that no kernel reads or writes a tensor while a kernel on
#   another stream may still be using it, i.e. the stream and event schedule FSDP2 uses, which
#   ours follows (include/fsdp/runtime/stream_schedule.h). It only sees Python-issued work, so
#   it checks the reference, not fsdp-train.
# Each tool's report goes to OUT_DIR/<name>.log; the exit status is 1 if any reported an error,
# 2 if compute-sanitizer is missing (it ships with the CUDA toolkit, not with the wheel).
#
# Environment: PYTHON (default .venv/bin/python3), COMPUTE_SANITIZER (default: on PATH, else
# $CUDA_HOME/bin or /usr/local/cuda/bin).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
OUT="$(realpath -m "$1")"
mkdir -p "$OUT"
BUILD="$ROOT/build"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python3" ]; then PYTHON="$ROOT/.venv/bin/python3"; else PYTHON=python3; fi
fi
sanitizer="${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || true)}"
for candidate in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
                 /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  if [ -z "$sanitizer" ] && [ -x "$candidate" ]; then sanitizer="$candidate"; fi
done
failures=0

check() {  # NAME CMD...: runs CMD, output to OUT/NAME.log
  local name="$1"
  shift
  echo "== $name: $*" >&2
  if "$@" > "$OUT/$name.log" 2>&1; then
    echo "   ok" >&2
  else
    echo "   FAILED: see $OUT/$name.log" >&2
    failures=$((failures + 1))
  fi
}

if [ -z "$sanitizer" ]; then
  echo "compute-sanitizer not found (set COMPUTE_SANITIZER, or install the CUDA toolkit)" \
    | tee "$OUT/compute-sanitizer.log" >&2
  missing=1
else
  missing=0
  tiny=(--model tiny --steps 3 --global-batch 4 --seq-len 64 --quiet --device cuda --backend nccl)
  for tool in memcheck racecheck synccheck; do
    check "test_cuda_$tool" "$sanitizer" --tool "$tool" --error-exitcode 1 \
      "$BUILD/test_cuda" --gtest_filter='NcclCuda.OneRank*'
    check "fsdp_train_$tool" env RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT="$((20000 + RANDOM % 20000))" \
      "$sanitizer" --tool "$tool" --error-exitcode 1 "$BUILD/fsdp-train" "${tiny[@]}"
  done
fi

# CSAN needs the reference's inputs: fsdp-train's initial weights and batches of the tiny model.
init="$OUT/csan_init/model.safetensors"
mkdir -p "$(dirname "$init")"
check csan_init "$BUILD/fsdp-train" --nproc 1 --model tiny --steps 0 --quiet --export "$init"
check csan_batches "$BUILD/fsdp-train" --nproc 1 --model tiny --steps 3 --global-batch 4 \
  --seq-len 64 --quiet --dump-batches "$OUT/csan_batches.bin"
check torch_cuda_sanitizer env TORCH_CUDA_SANITIZER=1 "$PYTHON" \
  "$ROOT/bench/reference/fsdp2_reference.py" --mode fsdp2 --device cuda --nproc 1 \
  --init "$init" --batches "$OUT/csan_batches.bin" --quiet

if [ "$failures" -gt 0 ]; then exit 1; fi
if [ "$missing" = 1 ]; then exit 2; fi
exit 0
