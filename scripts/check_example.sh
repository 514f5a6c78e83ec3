#!/usr/bin/env bash
# Builds the examples against an installed fsdp, as another project would, and runs each on 2
# ranks under torchrun: examples/minimal (fails unless its loss falls) and examples/pretrain_llama
# on token shards made here from docs/*.md (fails unless its training and held-out losses fall,
# and unless a run stopped after step 10 and started again, resuming from its checkpoint, prints
# the losses of an uninterrupted run). Fails too unless the installed fsdp-train starts (LibTorch
# on LD_LIBRARY_PATH, as the README tells a user). Needs a build (scripts/run.sh).
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
. scripts/lib/ccache_env.sh
build_example() {  # build_example SOURCE_DIR BUILD_DIR
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER_LAUNCHER="${FSDP_CCACHE:-}" \
    -DCMAKE_PREFIX_PATH="$prefix;$torch_prefix" >/dev/null
  cmake --build "$2" -j"$(nproc)" >/dev/null
}
build_example examples/minimal "$example_dir"
out="$(OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc-per-node 2 --no-python "$example_dir/fsdp_minimal")"
echo "$out"
first="$(echo "$out" | awk '/^step/ {print $4; exit}')"
last="$(echo "$out" | awk '/^step/ {v=$4} END {print v}')"
awk -v a="$first" -v b="$last" 'BEGIN { if (!(b < a)) { print "check_example: loss did not fall: " a " -> " b; exit 1 } }'
echo "check_example: examples/minimal built against the fsdp installed in $prefix; loss $first -> $last on 2 ranks"

# examples/pretrain_llama: llama-tiny on the bytes of docs/*.md as llm.c token shards (two for
# training, the last tenth held out), 30 steps; once straight through, once stopped after step
# 10 and started again with the same command (resume "auto").
build_example examples/pretrain_llama "$example_dir/pretrain_llama"
data="$example_dir/pretrain_data"
rm -rf "$data" && mkdir -p "$data"
.venv/bin/python3 - "$data" docs/*.md <<'PY'
import struct, sys
out, files = sys.argv[1], sorted(sys.argv[2:])
text = b"".join(open(f, "rb").read() for f in files)
def shard(path, tokens):  # llm.c's layout: 256 int32 of header (magic, version, count), uint16s
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *[0] * 253))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
split = len(text) * 9 // 10
shard(f"{out}/train_000.bin", text[:split // 2])
shard(f"{out}/train_001.bin", text[split // 2:split])
shard(f"{out}/val.bin", text[split:])
PY
pretrain() {  # pretrain NAME [STOP_AFTER]: the step lines of a run checkpointing in $data/NAME
  OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc-per-node 2 --no-python \
    "$example_dir/pretrain_llama/pretrain_llama" "$data/train_*.bin" "$data/val.bin" \
    "$data/$1" "$data/$1.jsonl" 30 "${@:2}" | grep '^step'
}
straight="$(pretrain straight)"
stopped="$(pretrain stopped 10)"
resumed="$(pretrain stopped)"
loss() { echo "$straight" | awk -v s="$1" -v f="$2" '$2 == s {print $f}'; }  # loss STEP FIELD
first="$(loss 1 4)" last="$(loss 30 4)" val_first="$(loss 10 8)" val_last="$(loss 30 8)"
echo "$straight" | awk 'NR == 1 || NR % 10 == 0'
awk -v a="$first" -v b="$last" -v c="$val_first" -v d="$val_last" 'BEGIN { if (!(b < a) || !(d < c)) {
  print "check_example: pretrain_llama: loss did not fall: " a " -> " b ", held-out " c " -> " d; exit 1 } }'
# [Note: a resumed run's losses are the uninterrupted run's exactly] The same world size, thread
# count and batches (a function of seed and step), and a checkpoint that restores the parameters,
# the AdamW state and the loader's position bit for bit: nothing is left to differ, so the losses,
# printed to 17 significant digits, must be equal as text (tolerance 0, as fsdp-train's own
# resume tests demand). Any difference means the resume lost some state.
if [ "$(printf '%s\n%s' "$stopped" "$resumed")" != "$straight" ]; then
  echo "check_example: pretrain_llama: stopped after step 10 and resumed, its losses differ:"
  diff <(echo "$straight") <(printf '%s\n%s\n' "$stopped" "$resumed") || true
  exit 1
fi
echo "check_example: examples/pretrain_llama built against the fsdp installed in $prefix; loss" \
  "$first -> $last, held-out $val_first -> $val_last on 2 ranks; stopped after step 10 and" \
  "resumed, the same 30 losses"
