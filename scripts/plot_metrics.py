#!/usr/bin/env python3
"""Plots of an fsdp-train --metrics file.

    .venv/bin/python3 scripts/plot_metrics.py METRICS.jsonl OUT_DIR

Writes three PNGs into OUT_DIR (created if missing) and prints their paths:
  loss.png        training loss per step, and the held-out loss (val_loss) where it was measured
  throughput.png  tokens/s per step, with step time on a second axis
  memory.png      per rank at the last step, the bytes of each category fsdp-train reports,
                  stacked (sharded parameters, gradients, optimizer state, activations, peak
                  unsharded parameters and gradients), and the peak of all tensors

Needs matplotlib (scripts/requirements-test.txt; `bash scripts/run.sh test` installs it into
.venv). A line that is not JSON, or lacks `step`, fails with the file and line number.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

# The per-rank byte fields of --metrics, in the order they are drawn.
MEMORY_FIELDS = [
    ("param_bytes", "sharded params"),
    ("grad_bytes", "sharded grads"),
    ("optim_bytes", "optimizer state"),
    ("activation_bytes", "activations"),
    ("peak_unsharded_bytes", "peak unsharded params + grads"),
    ("peak_alloc_bytes", "peak of all tensors"),
]


def read_metrics(path):
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_metrics: {path}:{number}: not JSON ({e.msg})")
            if not isinstance(record, dict) or "step" not in record:
                sys.exit(f"plot_metrics: {path}:{number}: no 'step' (is this fsdp-train --metrics?)")
            records.append(record)
    if not records:
        sys.exit(f"plot_metrics: {path} holds no steps")
    return records


def series(records, key):
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def plot_loss(records, out):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(*series(records, "loss"), label="train loss", linewidth=1)
    steps, val = series(records, "val_loss")
    if steps:
        ax.plot(steps, val, "o-", label="held-out loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(alpha=0.3)
    ax.legend()
    return save(fig, out, "loss.png")


def plot_throughput(records, out):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(*series(records, "tokens_per_s"), color="tab:green", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("tokens/s", color="tab:green")
    ax.grid(alpha=0.3)
    steps, step_s = series(records, "step_s")
    if steps:
        right = ax.twinx()
        right.plot(steps, step_s, color="tab:gray", linewidth=0.8, alpha=0.7)
        right.set_ylabel("step time (s)", color="tab:gray")
    return save(fig, out, "throughput.png")


def plot_memory(records, out):
    """Per rank, the last step's bytes by category, stacked, and the peak of all tensors."""
    ranks = records[-1].get("ranks") or []
    if not ranks:
        return None
    fig, ax = plt.subplots(figsize=(max(8, 1.5 * len(ranks) + 5), 4.5))
    x = list(range(len(ranks)))
    bottom = [0.0] * len(ranks)
    for field, label in MEMORY_FIELDS[:-1]:
        values = [r.get(field, 0) / 2**20 for r in ranks]
        ax.bar(x, values, bottom=bottom, label=label, width=0.6)
        bottom = [b + v for b, v in zip(bottom, values)]
    peak_field, peak_label = MEMORY_FIELDS[-1]
    peaks = [r.get(peak_field, 0) / 2**20 for r in ranks]
    if any(peaks):
        ax.hlines(peaks, [i - 0.3 for i in x], [i + 0.3 for i in x], colors="black", linewidth=2,
                  label=peak_label, zorder=3)
    ax.set_xticks(x, [f"rank {r.get('rank', i)}" for i, r in enumerate(ranks)])
    ax.set_ylabel("MiB")
    ax.set_title(f"memory per rank at step {records[-1]['step']}")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    return save(fig, out, "memory.png")


def save(fig, out, name):
    path = os.path.join(out, name)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("metrics", help="fsdp-train --metrics JSON-lines file")
    ap.add_argument("out_dir", help="where the PNGs go")
    args = ap.parse_args()
    records = read_metrics(args.metrics)
    os.makedirs(args.out_dir, exist_ok=True)
    for path in (plot_loss(records, args.out_dir), plot_throughput(records, args.out_dir),
                 plot_memory(records, args.out_dir)):
        if path:
            print(path)


if __name__ == "__main__":
    main()
