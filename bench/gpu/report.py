#!/usr/bin/env python3
"""The numbers of bench/gpu/run.sh: equality of two training runs, and throughput, memory and MFU.

    report.py compare --name NAME --tolerance TOL A.jsonl A.safetensors B.jsonl B.safetensors
        Two runs of the same model, weights and batches (fsdp-train's or the FSDP2 reference's
        --metrics and --export): the largest relative difference of the loss and of the gradient
        norm over the steps, and of every parameter after the last step (max |a - b| over
        max |b|, per tensor). Prints one Markdown table row; exits 1 when one exceeds TOL.
        Either safetensors path may be "-" to compare the metrics only. As in
        tests/tools/test_fsdp2_parity.cpp, the key part of GPT-2's attn.c_attn.bias is held to
        2 x lr x steps instead (its exact gradient is zero, so AdamW moves it by up to lr per
        step in directions set by rounding alone); --lr is the runs' (default 3e-3).

    report.py perf --name NAME --metrics M.jsonl --tokens-per-step N --flops-per-step F
                   --peak-flops P --gpus G
        One run's median step time over steps 3..N, tokens/s from it, MFU = F / (step time x P
        x G), and rank 0's peak CUDA memory (cuda_peak_allocated_bytes and
        cuda_peak_reserved_bytes in --metrics' ranks, "n/a" when the run did not report them).
        Prints one Markdown table row.

    report.py peak --hardware FILE --dtype bf16
        The dense peak FLOP/s of FILE (bench/hardware/*.json) for dtype.

The safetensors reader is bench/reference/fsdp2_reference.py's, so this needs only torch.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import torch  # noqa: E402
from fsdp2_reference import load_safetensors  # noqa: E402


def read_metrics(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        raise SystemExit(f"{path}: no steps")
    return rows


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def compare(args):
    a, b = read_metrics(args.a_metrics), read_metrics(args.b_metrics)
    if len(a) != len(b):
        raise SystemExit(f"{args.name}: {len(a)} steps against {len(b)}")
    loss = max(relative(x["loss"], y["loss"]) for x, y in zip(a, b))
    norm = max(relative(x["grad_norm"], y["grad_norm"]) for x, y in zip(a, b))
    param, worst, key_bias_ok = 0.0, "-", True
    if args.a_weights != "-" and args.b_weights != "-":
        wa, wb = load_safetensors(args.a_weights), load_safetensors(args.b_weights)
        if set(wa) != set(wb):
            raise SystemExit(f"{args.name}: the exports name different tensors: "
                             f"{sorted(set(wa) ^ set(wb))[:5]}")
        n_embd = wb["transformer.wte.weight"].shape[1] if "transformer.wte.weight" in wb else 0
        for name in sorted(wa):
            x, y = wa[name].double(), wb[name].double()
            scale = max(y.abs().max().item(), 1e-30)
            if name.endswith("attn.c_attn.bias"):
                key = (x[n_embd:2 * n_embd] - y[n_embd:2 * n_embd]).abs().max().item()
                key_bias_ok = key_bias_ok and key <= 2 * args.lr * len(a)
                x = torch.cat((x[:n_embd], x[2 * n_embd:]))
                y = torch.cat((y[:n_embd], y[2 * n_embd:]))
            d = (x - y).abs().max().item() / scale
            if d > param:
                param, worst = d, name
    ok = max(loss, norm, param) <= args.tolerance and key_bias_ok
    print(f"| {args.name} | {len(a)} | {loss:.2e} | {norm:.2e} | {param:.2e} ({worst}) | "
          f"{args.tolerance:g} | {'pass' if ok else 'FAIL'}"
          f"{'' if key_bias_ok else ' (attn key bias beyond 2 lr per step)'} |")
    return 0 if ok else 1


def perf(args):
    rows = read_metrics(args.metrics)
    timed = rows[2:] if len(rows) > 2 else rows
    step_s = statistics.median(r["step_s"] for r in timed)
    tokens_per_s = args.tokens_per_step / step_s
    mfu = args.flops_per_step / (step_s * args.peak_flops * args.gpus)
    rank0 = rows[-1]["ranks"][0]

    def gib(key):
        return f"{rank0[key] / 2**30:.2f}" if key in rank0 else "n/a"

    print(f"| {args.name} | {len(timed)} | {step_s:.4f} | {tokens_per_s:,.0f} | "
          f"{gib('cuda_peak_allocated_bytes')} | {gib('cuda_peak_reserved_bytes')} | "
          f"{100 * mfu:.1f}% |")
    return 0


def peak(args):
    with open(args.hardware) as f:
        print(json.load(f)["compute"]["peak_flops"][args.dtype])
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--name", required=True)
    c.add_argument("--tolerance", type=float, required=True)
    c.add_argument("--lr", type=float, default=3e-3)
    for side in ("a", "b"):
        c.add_argument(f"{side}_metrics")
        c.add_argument(f"{side}_weights")
    q = sub.add_parser("perf")
    q.add_argument("--name", required=True)
    q.add_argument("--metrics", required=True)
    q.add_argument("--tokens-per-step", type=float, required=True)
    q.add_argument("--flops-per-step", type=float, required=True)
    q.add_argument("--peak-flops", type=float, required=True)
    q.add_argument("--gpus", type=int, required=True)
    k = sub.add_parser("peak")
    k.add_argument("--hardware", required=True)
    k.add_argument("--dtype", default="bf16")
    args = p.parse_args()
    return {"compare": compare, "perf": perf, "peak": peak}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
