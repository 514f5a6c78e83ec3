#!/usr/bin/env python3
"""The memory counter track of an fsdp-train --trace file, drawn over time.

    .venv/bin/python3 scripts/plot_trace_memory.py TRACE_DIR/rank0.json OUT.png [--steps K]

Perfetto draws the same track interactively; this is the picture for a page. The track
("memory (bytes)": unsharded params, unsharded grads, comm buffers, all tensors of the rank)
is sampled at every traced event and every change of the runtime's memory. The x axis is
milliseconds from the first sample; with --steps K only the last K optimizer steps are drawn
(the first step also holds the lazy initialization). Prints the PNG's path.
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

TRACK = "memory (bytes)"


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"plot_trace_memory: {path}: not an fsdp-train trace ({e})")
    samples = sorted((e for e in events if e.get("ph") == "C" and e.get("name") == TRACK),
                     key=lambda e: e["ts"])
    if not samples:
        sys.exit(f"plot_trace_memory: {path} has no '{TRACK}' counter track "
                 "(traces from fsdp-train --trace have one)")
    steps = sorted(e["ts"] + e["dur"] for e in events
                   if e.get("ph") == "X" and e.get("name") == "optimizer step")
    return samples, steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="a rank's trace: TRACE_DIR/rank<N>.json")
    ap.add_argument("out", help="the PNG to write")
    ap.add_argument("--steps", type=int, default=0, help="draw only the last K steps")
    args = ap.parse_args()
    samples, step_ends = load(args.trace)
    if args.steps > 0 and len(step_ends) > args.steps:
        start = step_ends[-args.steps - 1]
        samples = [s for s in samples if s["ts"] > start]
    t0 = samples[0]["ts"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for series in samples[0]["args"]:
        ax.step([(s["ts"] - t0) / 1e3 for s in samples],
                [s["args"].get(series, 0) / 2**20 for s in samples], where="post", label=series)
    for end in step_ends:
        if end >= samples[0]["ts"]:
            ax.axvline((end - t0) / 1e3, color="gray", linewidth=0.6, linestyle=":")
    ax.set_xlabel("ms (dotted: end of an optimizer step)")
    ax.set_ylabel("MiB")
    ax.set_title(f"live memory of {args.trace.rsplit('/', 1)[-1].removesuffix('.json')}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(args.out)


if __name__ == "__main__":
    main()
