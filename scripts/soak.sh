#!/usr/bin/env bash
# Soak test, outside CI: a long run of the `tiny` GPT-2 at W = 2 must not leak. Each rank's
# resident memory (VmRSS) and open file descriptors (/proc/PID/fd) are sampled every half second;
# what a rank holds just after warm-up is compared with what it holds at the end, while the ranks
# still train (before the metrics hold the last step: after it they are shutting down).
# Fails if a rank's RSS grew by more than 1% or its descriptors grew at all (the fewest open in
# the first and the last tenth of the samples: the ranks' own /proc reads open one for a
# moment). RSS is compared as the median of the first tenth of the samples after warm-up
# against the median of the last tenth, since one sample moves by 2-4 MiB (0.5-1%) from the
# next as the allocator takes and returns pages; the least-squares trend over all of them,
# across the run, must stay within the bound too (a leak is a trend; a single sample at each
# end, also printed, is mostly that noise).
#
#   bash scripts/run.sh build && bash scripts/soak.sh [STEPS] [WARMUP_STEPS] [fsdp-train flags...]
#
# STEPS defaults to 5000, WARMUP_STEPS to a tenth of STEPS (at least 50); further arguments go to
# fsdp-train (e.g. --backend, --strategy). The ranks are the processes `fsdp-train --nproc 2`
# forks (children of the launcher, told apart by RANK in their environment). Prints each rank's
# samples at warm-up, at the largest RSS seen and at the end, with the step each was taken at,
# and the steps at whose end the trainer gave the pages jemalloc kept back.
#
# Environment: FSDP_TRAIN_BIN (default build/fsdp-train), SOAK_MAX_RSS_GROWTH (default 0.01).
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-5000}"
warmup="${2:-$((steps / 10 > 50 ? steps / 10 : 50))}"
shift 2 || shift $#
bin="${FSDP_TRAIN_BIN:-build/fsdp-train}"
max_growth="${SOAK_MAX_RSS_GROWTH:-0.01}"
out="$(mktemp -d)"
launcher=""
trap '[ -n "$launcher" ] && kill "$launcher" 2>/dev/null; rm -rf "$out"' EXIT
[ "$warmup" -lt "$steps" ] || { echo "soak.sh: warm-up ($warmup) must be shorter than the run ($steps)" >&2; exit 2; }

cmd=("$bin" --nproc 2 --model tiny --steps "$steps" --log-every 1000000 --quiet
     --metrics "$out/metrics.jsonl" "$@")
echo "== ${cmd[*]}" >&2
"${cmd[@]}" > "$out/train.out" 2>&1 &
launcher=$!

# Empty for a process that has gone (the launcher's short-lived children, a rank that ended).
rank_of() { { tr '\0' '\n' < "/proc/$1/environ"; } 2>/dev/null | sed -n 's/^RANK=//p' || true; }
steps_done() { if [ -f "$out/metrics.jsonl" ]; then wc -l < "$out/metrics.jsonl"; else echo 0; fi; }

# One line per sample: time step rank pid rss_kb fds
start="$(date +%s)"
while kill -0 "$launcher" 2>/dev/null; do
  step="$(steps_done)"
  for pid in $(pgrep -P "$launcher" || true); do
    rank="$(rank_of "$pid")"
    [ -n "$rank" ] || continue
    rss="$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || true)"
    fds="$(find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)"
    [ -n "$rss" ] && echo "$(($(date +%s) - start)) $step $rank $pid $rss $fds" >> "$out/samples"
  done
  sleep 0.5
done
status=0
wait "$launcher" || status=$?
launcher=""
if [ "$status" != 0 ]; then
  echo "soak.sh: fsdp-train failed (exit $status):" >&2
  tail -n 20 "$out/train.out" >&2
  exit 1
fi

python3 - "$out/samples" "$warmup" "$steps" "$max_growth" "$(steps_done)" "$out/metrics.jsonl" <<'PY'
import json, statistics, sys
path, warmup, steps, max_growth, done = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
metrics_path = sys.argv[6]
rows = [list(map(int, line.split())) for line in open(path)]
ok = done == steps
print(f"{done} of {steps} steps; warm-up ends at step {warmup}; samples every 0.5 s, "
      f"compared up to the last one before step {steps}")
print("| rank | at warm-up: step, RSS (KiB), fds | largest RSS: step, KiB | at the end: step, RSS (KiB), fds | "
      "RSS growth, one sample at each end | first tenth's median -> last tenth's (KiB) | RSS growth, medians | trend over the run | fd growth |")
print("|---|---|---|---|---|---|---|---|---|")
for rank in sorted({r[2] for r in rows}):
    mine = [r for r in rows if r[2] == rank]
    # Samples from the end of warm-up until the last step began: once the metrics hold every
    # step the ranks are shutting down (sockets closing, buffers freed or touched once more),
    # which is not the steady state this compares.
    after = [r for r in mine if warmup <= r[1] < steps]
    if len(after) < 2:
        print(f"| {rank} | too few samples after warm-up ({len(after)}) | | | | |")
        ok = False
        continue
    warm, end = after[0], after[-1]
    peak = max(after, key=lambda r: r[4])
    growth = (end[4] - warm[4]) / warm[4]
    tenth = max(1, len(after) // 10)
    # Each rank opens /proc/self/io and /proc/self/status for its metrics every step, so a
    # sample can see one of them open for a moment. A leak raises the count for good: compare
    # the fewest descriptors of the first tenth with the fewest of the last tenth.
    fd_growth = min(r[5] for r in after[-tenth:]) - min(r[5] for r in after[:tenth])
    first, last = statistics.median(r[4] for r in after[:tenth]), statistics.median(r[4] for r in after[-tenth:])
    median_growth = (last - first) / first
    # Least-squares slope of RSS over time, times the span of the samples: the growth a leak at
    # that rate would add over the run.
    t = [r[0] for r in after]
    slope = statistics.linear_regression(t, [r[4] for r in after]).slope if len(set(t)) > 1 else 0.0
    trend = slope * (t[-1] - t[0]) / first
    print(f"| {rank} | {warm[1]}, {warm[4]}, {warm[5]} | {peak[1]}, {peak[4]} | "
          f"{end[1]}, {end[4]}, {end[5]} | {growth * 100:+.2f}% | {first:.0f} -> {last:.0f} | "
          f"{median_growth * 100:+.2f}% | {trend * 100:+.2f}% | {fd_growth:+d} |")
    ok = ok and median_growth <= max_growth and trend <= max_growth and fd_growth <= 0
for rank in sorted({r[2] for r in rows}):
    mine = [r for r in rows if r[2] == rank and r[1] < steps]
    marks = [next((r for r in mine if r[1] >= steps * k // 10), None) for k in range(1, 10)]
    print(f"rank {rank} RSS (KiB) by step: " +
          ", ".join(f"{r[1]}: {r[4]}" for r in marks if r is not None))
# The trainer's bound on the host pages jemalloc keeps ([Note: a bound on the kept pages]), from
# the metrics: how often a step's end gave the kept pages back, and how many it kept.
kept = {}
for line in open(metrics_path):
    for r in json.loads(line)["ranks"]:
        kept.setdefault(r["rank"], []).append((r["host_kept_bytes"], r["host_returned_bytes"]))
for rank, per_step in sorted(kept.items()):
    gave = [s + 1 for s, (_, returned) in enumerate(per_step) if returned > 0]
    after_warmup = [k for k, _ in per_step[warmup:]] or [0]
    print(f"rank {rank}: kept pages given back at {len(gave)} step ends (steps {gave[:8]}"
          f"{' ...' if len(gave) > 8 else ''}); kept after warm-up {min(after_warmup) / 2**20:.1f}-"
          f"{max(after_warmup) / 2**20:.1f} MiB")
print("PASS" if ok else f"FAIL (RSS may grow by at most {max_growth * 100:g}% between the tenths' medians "
      "and by trend, descriptors not at all)")
sys.exit(0 if ok else 1)
PY
