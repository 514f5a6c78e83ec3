#!/usr/bin/env python3
"""Compares fsdp-train --metrics files step by step against a reference: loss and grad_norm.

    compare_losses.py [--rel TOL] REFERENCE.jsonl NAME=RUN.jsonl...

Prints one row per run: steps, whether every loss and grad_norm is bit-identical to the
reference's, and the largest relative difference of each. Exits 1 if any run has another
number of steps or differs by more than TOL (default 0: bit-identical).
"""
import argparse
import json
import sys


def curve(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [(r["loss"], r["grad_norm"]) for r in rows]


def rel(a, b):
    return abs(a - b) / abs(b) if b else abs(a - b)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rel", type=float, default=0.0)
    p.add_argument("reference")
    p.add_argument("runs", nargs="+")
    args = p.parse_args()
    want = curve(args.reference)
    ok = True
    print(f"reference {args.reference}: {len(want)} steps, losses "
          f"{want[0][0]:.6f} .. {want[-1][0]:.6f}")
    print("| run | steps | bit-identical | max rel. diff loss | max rel. diff grad_norm |")
    print("|---|---|---|---|---|")
    for run in args.runs:
        name, _, path = run.rpartition("=")
        try:
            got = curve(path)
        except OSError as e:
            print(f"| {name} | no metrics ({e.strerror}) | | | |")
            ok = False
            continue
        same_len = len(got) == len(want)
        dl = max((rel(g[0], w[0]) for g, w in zip(got, want)), default=float("inf"))
        dg = max((rel(g[1], w[1]) for g, w in zip(got, want)), default=float("inf"))
        identical = same_len and got == want
        print(f"| {name} | {len(got)} | {'yes' if identical else 'no'} | {dl:.3g} | {dg:.3g} |")
        ok = ok and same_len and dl <= args.rel and dg <= args.rel
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
