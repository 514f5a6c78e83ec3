#!/usr/bin/env bash
# Sharded checkpoint save and load throughput of the gpt2 (124M) config at 4 ranks, next to a
# plain copy (cp) of the same bytes.
#
#   bash scripts/run.sh build && bash bench/checkpoint_io.sh [REPEATS]   (default 3)
#
# One fsdp-train run of 4 local ranks trains one step (so AdamW's state exists) and saves:
# parameters, exp_avg and exp_avg_sq, about 1.49 GB in four rank files. Then, REPEATS times,
# interleaved: the save again (a new step directory; fsdp-train reports the collective save's
# wall time, fsyncs included), the load (--resume: fsdp-train reports the collective load's wall
# time, every slice's checksum verified), `cp -r` of the checkpoint directory, `cp -r` followed
# by `sync` (a copy made as durable as the save), and `cat` of the files to /dev/null (reading
# alone). All reads come from the page cache, as a resume right after a save does. Writes need
# about 4.5 GB free under FSDP_BENCH_DIR (default /tmp/fsdp_ckpt_bench).
set -euo pipefail
cd "$(dirname "$0")/.."
repeats="${1:-3}"
dir="${FSDP_BENCH_DIR:-/tmp/fsdp_ckpt_bench}"
bin=build/fsdp-train
common=(--nproc 4 --model gpt2 --global-batch 4 --seq-len 32 --log-every 1000)

rm -rf "$dir" && mkdir -p "$dir"
now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

echo "== initial run: 1 training step, then save"
"$bin" "${common[@]}" --steps 1 --save "$dir/ckpt" | grep -E "saved|model"
ckpt="$dir/ckpt/step_00000001"
bytes=$(du -cb "$ckpt"/rank_* | tail -1 | cut -f1)
echo "checkpoint: $(ls "$ckpt" | wc -l) files, $bytes bytes of rank files"

: >"$dir/save.txt"; : >"$dir/load.txt"; : >"$dir/cp.txt"; : >"$dir/cp_sync.txt"; : >"$dir/cat.txt"
for i in $(seq 1 "$repeats"); do
  # Save: resume step 1 and save it as step 1 + i (no training: --steps equals the resumed step).
  rm -rf "$dir/save$i"
  mkdir -p "$dir/save$i" && cp -r "$ckpt" "$dir/save$i/" && echo step_00000001 >"$dir/save$i/latest" && sync
  out=$("$bin" "${common[@]}" --steps 1 --resume "$dir/save$i" --save "$dir/save$i/out")
  echo "$out" | grep -o 'loaded in [0-9.]*s' | grep -o '[0-9.]*' >>"$dir/load.txt"
  echo "$out" | grep -o 'MB in [0-9.]*s' | grep -o '[0-9.]*' >>"$dir/save.txt"
  rm -rf "$dir/save$i"
  sync

  rm -rf "$dir/copy"; sync
  t0=$(now); cp -r "$ckpt" "$dir/copy"; t1=$(now)
  echo "$t1 - $t0" | bc -l >>"$dir/cp.txt"
  rm -rf "$dir/copy"; sync
  t0=$(now); cp -r "$ckpt" "$dir/copy"; sync; t1=$(now)
  echo "$t1 - $t0" | bc -l >>"$dir/cp_sync.txt"
  rm -rf "$dir/copy"; sync
  t0=$(now); cat "$ckpt"/rank_* >/dev/null; t1=$(now)
  echo "$t1 - $t0" | bc -l >>"$dir/cat.txt"
done

report() {  # name, file of seconds
  local s; s=$(median <"$2")
  printf "%-34s %8.3f s  %7.0f MB/s   (runs: %s)\n" "$1" "$s" "$(echo "$bytes / $s / 1000000" | bc -l)" \
    "$(tr '\n' ' ' <"$2")"
}
echo "== medians over $repeats runs, $bytes bytes"
report "save_sharded (4 ranks, fsync)" "$dir/save.txt"
report "cp -r" "$dir/cp.txt"
report "cp -r && sync" "$dir/cp_sync.txt"
report "load_sharded (4 ranks, verified)" "$dir/load.txt"
report "cat > /dev/null" "$dir/cat.txt"
