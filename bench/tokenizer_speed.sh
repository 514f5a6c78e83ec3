#!/usr/bin/env bash
# Single-threaded encode throughput: fsdp::data::Tokenizer against Python's tokenizers, same
# tokenizer files, same text, one run.
#
#   cmake --build build --target tokenizer-speed && bash bench/tokenizer_speed.sh [PYTHON] [REPEATS]
#
# PYTHON (default .venv/bin/python3, else python3) must have tokenizers (pip install
# tokenizers==0.23.3). The tokenizers are the differential test's (tests/data/
# tokenizer_reference.py trains them on Debian's fortunes into FSDP_BENCH_DIR, default
# /tmp/fsdp_tokenizer_bench); the text is all fortunes concatenated, 2.58 MB of UTF-8 prose.
# tokenizers runs with RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false: encode() of the
# text as one string, and encode_batch() of its documents (split on "\n%\n"). Each repeat uses a
# freshly loaded tokenizer on both sides (empty caches); the best repeat is reported. Before
# timing, the script checks both sides give the same ids for the one-string encode.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${1:-}"
if [ -z "$py" ]; then if [ -x .venv/bin/python3 ]; then py=.venv/bin/python3; else py=python3; fi; fi
repeats="${2:-3}"
dir="${FSDP_BENCH_DIR:-/tmp/fsdp_tokenizer_bench}"
mkdir -p "$dir"
[ -f "$dir/qwen2/tokenizer.json" ] || "$py" tests/data/tokenizer_reference.py "$dir" >/dev/null
text="$dir/fortunes.txt"
for f in /usr/share/games/fortunes/*; do
  case "$f" in *.dat|*.u8) ;; *) cat "$f" ;; esac
done > "$text"

for name in gpt2 llama3 qwen2; do
  ours=$(build/bench/tokenizer-speed "$dir/$name/tokenizer.json" "$text" "$repeats" "$dir/$name.ours.ids")
  RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false "$py" - "$dir/$name/tokenizer.json" "$text" "$repeats" \
      "$dir/$name.ours.ids" "$name" "$ours" <<'PY'
import json, struct, sys, time
from tokenizers import Tokenizer
path, text_path, repeats, ours_ids, name, ours = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], json.loads(sys.argv[6])
raw = open(text_path, "rb").read()
text = raw.decode("utf-8")
docs = text.split("\n%\n")
ids = Tokenizer.from_file(path).encode(text, add_special_tokens=False).ids
got = open(ours_ids, "rb").read()
assert got == struct.pack(f"<{len(ids)}I", *ids), f"{name}: ids differ from tokenizers'"
best_one = best_docs = 0.0
for _ in range(repeats):
    tok = Tokenizer.from_file(path)
    t0 = time.perf_counter(); tok.encode(text, add_special_tokens=False); s = time.perf_counter() - t0
    best_one = max(best_one, len(raw) / 1e6 / s)
    tok = Tokenizer.from_file(path)
    t0 = time.perf_counter(); tok.encode_batch(docs, add_special_tokens=False); s = time.perf_counter() - t0
    best_docs = max(best_docs, len(raw) / 1e6 / s)
print(f"{name}: {len(raw)/1e6:.2f} MB, {len(ids)} tokens (ids identical) | one string: ours "
      f"{ours['one_string_mb_s']:.1f} MB/s, tokenizers {best_one:.1f} MB/s ({ours['one_string_mb_s']/best_one:.1f}x) | "
      f"{len(docs)} documents: ours {ours['documents_mb_s']:.1f} MB/s, tokenizers encode_batch {best_docs:.1f} MB/s "
      f"({ours['documents_mb_s']/best_docs:.1f}x)")
PY
done
