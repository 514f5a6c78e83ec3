#!/usr/bin/env bash
# The library and its tests under a sanitizer, in a build directory of their own:
#
#   bash scripts/sanitize.sh asan [ctest args...]   AddressSanitizer + UndefinedBehaviorSanitizer
#   bash scripts/sanitize.sh tsan [ctest args...]   ThreadSanitizer
#
# Without ctest args each mode runs its documented subset (below); with them, what they select
# (for example `-R Desync`). Our code is instrumented; LibTorch, gloo and c10d come from the
# PyTorch wheel and are not, so a report inside them is seen only where our code is on the
# stack (a race, a bad access through our pointer). Every suppression is in
# scripts/sanitizers/, each with the reason. The project's environment (.venv) must exist:
# `bash scripts/run.sh build` makes it. Builds go through the shared compiler cache.
#
# The subsets:
# - asan: every suite labelled sanitize (`ctest -L sanitize`): the in-process (quick) suites of
#   the test binaries that tests/CMakeLists.txt marks SANITIZE, which cover every layer: comm
#   (every collective, rendezvous, desync), runtime (every strategy, mixed precision, prefetch,
#   offload, the stream schedule, custom collectives), checkpoint (formats, sharded and full
#   checkpoints that reshard), estimate and planner, models, data (tokenizer, token shards,
#   corpora) and the tools (every program's command line, the trainer's data loader). Then a
#   2-rank fsdp-train run of the default model; in a build with MPI also the mpi backend's suite
#   as 4 ranks of an mpirun job and a 2-rank fsdp-train run over MPI. These cover the code whose
#   bugs ASan finds (storage freed and refilled in place, copy-in and copy-out offsets, the ring
#   reduce-scatter's chunk arithmetic, the safetensors and tokenizer.json parsers).
# - tsan: the comm suite and the runtime's multi-rank tests, where progress threads, gloo's
#   threads and autograd's threads meet.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
mode="${1:-}"
shift || true
case "$mode" in asan|tsan) ;; *) echo "usage: $0 asan|tsan [ctest args...]" >&2; exit 2 ;; esac

PYTHON="$ROOT/.venv/bin/python3"
[ -x "$PYTHON" ] || { echo "sanitize: $PYTHON is missing: run bash scripts/run.sh build" >&2; exit 2; }
prefix="${FSDP_TORCH_PREFIX:-$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')}"
SUPP="$ROOT/scripts/sanitizers"
build="build-$mode"

if [ "$mode" = asan ]; then
  # vptr: UBSan's dynamic-type check needs the RTTI of every class it sees, and LibTorch's
  # (uninstrumented, hidden-visibility typeinfo) makes it report every torch::nn module as a
  # wrong type. Everything else UBSan checks stays on, and any report fails the run.
  flags="-fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined"
  tests=(fsdp_sanitize_tests fsdp-train)
  # CMake finds MPI through its compiler wrapper; with it, the build has the mpi backend.
  if command -v mpicc >/dev/null; then tests+=(test_mpi_backend); fi
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:suppressions=$SUPP/asan.supp"
  export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$SUPP/ubsan.supp"
else
  flags="-fsanitize=thread"
  tests=(test_comm test_runtime fsdp-train)
  subset=("test_comm" "test_runtime --gtest_filter=*Equivalence*:Prefetch.*:W4/Strategies.*")
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$SUPP/tsan.supp"
fi

# The compiler cache: see [Note: one compiler cache for every clone].
. scripts/lib/ccache_env.sh
# Without the cache, a .gch.sum left from a build with it would vouch for a newer .gch.
[ -n "${FSDP_CCACHE:-}" ] || find "$build" -name '*.gch.sum' -delete 2>/dev/null || true
echo "== configuring $build ($flags${FSDP_CCACHE:+, through ccache})"
# -O1 -g1 (line tables): the sanitizers' reports keep file:line in every frame, and a cold
# build takes far less than RelWithDebInfo's -O2 -g, whose full debug info of LibTorch's
# templates dominates compile and link time. See [Note: one compiler cache for every clone].
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=None -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CXX_COMPILER_LAUNCHER="${FSDP_CCACHE:-}" -DCMAKE_C_COMPILER_LAUNCHER="${FSDP_CCACHE:-}" \
  -DFSDP_PYTHON="$PYTHON" -DFSDP_BUILD_BENCH=OFF -DFSDP_JEMALLOC=OFF \
  -DCMAKE_CXX_FLAGS="$flags -O1 -g1 -fno-omit-frame-pointer" \
  -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null
echo "== building ${tests[*]}"
cmake --build "$build" -j"$(nproc)" --target "${tests[@]}" fsdp-estimate fsdp-tokenize

export FSDP_PYTHON="$PYTHON"
status=0
if [ "$mode" = asan ]; then
  echo "== fsdp-train, 2 ranks, under $mode"
  "$build/fsdp-train" --nproc 2 --steps 20 --quiet || status=$?
  if [ -x "$build/tests/test_mpi_backend" ] && [ $# -eq 0 ]; then
    # Leak checking is off for the MPI processes: Open MPI's components allocate at start and are
    # unloaded by MPI_Finalize, so LeakSanitizer reports their blocks from an unknown module that
    # no suppression can name. Memory errors and UB still halt them; the in-process suites above
    # check our code for leaks.
    mpirun=(env "ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0" mpirun --allow-run-as-root
            --oversubscribe)
    echo "== the mpi backend's suite, 4 ranks of an mpirun job, under $mode"
    env -u MASTER_ADDR -u MASTER_PORT "${mpirun[@]}" -np 4 "$build/tests/test_mpi_backend" \
      --gtest_brief=1 || status=$?
    echo "== fsdp-train over MPI, 2 ranks, under $mode"
    env -u MASTER_ADDR -u MASTER_PORT "${mpirun[@]}" -np 2 "$build/fsdp-train" --steps 20 \
      --quiet || status=$?
  fi
fi
cd "$build"
if [ $# -gt 0 ]; then
  echo "== ctest $* under $mode"
  ctest --output-on-failure -j"$(nproc)" "$@" || status=$?
elif [ "$mode" = asan ]; then
  echo "== ctest -L sanitize under $mode"
  ctest --output-on-failure -j"$(nproc)" -L sanitize || status=$?
else
  for run in "${subset[@]}"; do
    echo "== $run under $mode"
    # shellcheck disable=SC2086  # the binary and its filter, split on purpose
    ./tests/$run --gtest_brief=1 || status=$?
  done
fi
exit "$status"
