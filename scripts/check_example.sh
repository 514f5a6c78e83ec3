#!/usr/bin/env bash
# Builds examples/minimal against the installed package, as another project would, and runs
# it on 2 ranks under torchrun. Fails unless the loss falls. Needs a build (scripts/run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="$PWD/build/install"
cmake --install build --prefix "$prefix" >/dev/null
torch_prefix="$(.venv/bin/python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"
# The compiler cache: see [Note: one compiler cache for every clone].
FSDP_CCACHE_ROOT="$PWD" . scripts/lib/ccache_env.sh
cmake -S examples/minimal -B build/example -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER_LAUNCHER="${FSDP_CCACHE:-}" -DCMAKE_PREFIX_PATH="$prefix;$torch_prefix" >/dev/null
cmake --build build/example -j"$(nproc)" >/dev/null
out="$(OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc-per-node 2 --no-python build/example/fsdp_minimal)"
echo "$out"
first="$(echo "$out" | awk '/^step/ {print $4; exit}')"
last="$(echo "$out" | awk '/^step/ {v=$4} END {print v}')"
awk -v a="$first" -v b="$last" 'BEGIN { if (!(b < a)) { print "check_example: loss did not fall: " a " -> " b; exit 1 } }'
echo "check_example: examples/minimal built against the installed fsdp; loss $first -> $last on 2 ranks"
