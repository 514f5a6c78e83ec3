#!/usr/bin/env bash
# Builds examples/minimal against an installed fsdp, as another project would, and runs it on 2
# ranks under torchrun. Fails unless the loss falls, or unless the installed fsdp-train starts
# (LibTorch on LD_LIBRARY_PATH, as the README tells a user). Needs a build (scripts/run.sh).
#   check_example.sh                     installs build/ into build/install (cmake --install) and
#                                        builds the example in build/example
#   check_example.sh PREFIX EXAMPLE_DIR  uses the fsdp already installed under PREFIX (for
#                                        scripts/check_package.sh, the unpacked .deb's usr/) and
#                                        builds the example in EXAMPLE_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# = 0 ]; then
  prefix="$PWD/build/install"
  example_dir=build/example
  cmake --install build --prefix "$prefix" >/dev/null
elif [ $# = 2 ]; then
  prefix="$(cd "$1" && pwd)"
  example_dir="$2"
else
  echo "usage: $0 [PREFIX EXAMPLE_DIR]" >&2
  exit 2
fi
torch_prefix="$(.venv/bin/python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"
torch_lib="$(.venv/bin/python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
LD_LIBRARY_PATH="$torch_lib" "$prefix/bin/fsdp-train" --help >/dev/null
# The compiler cache: see [Note: one compiler cache for every clone].
FSDP_CCACHE_ROOT="$PWD" . scripts/lib/ccache_env.sh
cmake -S examples/minimal -B "$example_dir" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER_LAUNCHER="${FSDP_CCACHE:-}" -DCMAKE_PREFIX_PATH="$prefix;$torch_prefix" >/dev/null
cmake --build "$example_dir" -j"$(nproc)" >/dev/null
out="$(OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc-per-node 2 --no-python "$example_dir/fsdp_minimal")"
echo "$out"
first="$(echo "$out" | awk '/^step/ {print $4; exit}')"
last="$(echo "$out" | awk '/^step/ {v=$4} END {print v}')"
awk -v a="$first" -v b="$last" 'BEGIN { if (!(b < a)) { print "check_example: loss did not fall: " a " -> " b; exit 1 } }'
echo "check_example: examples/minimal built against the fsdp installed in $prefix; loss $first -> $last on 2 ranks"
