#!/usr/bin/env python3
"""The numbers of bench/gpu/run.sh: each measurement as a record, and the files a GPU run returns.

    report.py compare --name NAME --tolerance TOL [--record FILE] A.jsonl A.safetensors B.jsonl B.safetensors
        Two runs of the same model, weights and batches (fsdp-train's or the FSDP2 reference's
        --metrics and --export): the largest relative difference of the loss and of the gradient
        norm over the steps, and of every parameter after the last step (max |a - b| over
        max |b|, per tensor). Exits 1 when one exceeds TOL. Either safetensors path may be "-"
        to compare the metrics only. As in tests/tools/test_fsdp2_parity.cpp, the key part of
        GPT-2's attn.c_attn.bias is held to 2 x lr x steps instead (its exact gradient is zero,
        so AdamW moves it by up to lr per step in directions set by rounding alone); --lr is the
        runs' (default 3e-3).
        --across-devices (two devices, whose kernels round differently): the loss and gradient
        norm of the first step, computed from the same weights and batch, are held to TOL; the
        later steps and the parameters, which AdamW's first updates make depend on the sign of
        gradients that are rounding noise (m / sqrt(v) is +-1 for any gradient at step 1), are
        reported, and every parameter held to 2 x lr x steps (absolute), the most two correct
        runs can drift apart.
        --reference-gap R.jsonl (with --across-devices): R is the reference's run on A's device
        (FSDP2 on the GPU); the first step is then held to the larger of TOL and twice R's own
        first-step difference from B, so that a device whose fp32 kernels sum in another order
        than the CPU's (the H200: 2.1e-5 in gpt2's first gradient norm, FSDP2 and ours alike)
        is held to what the reference itself gives there.

    report.py perf --name NAME --model M --side S --metrics M.jsonl --tokens-per-step N
                   --flops-per-step F --peak-flops P --gpus G [--gpu-samples CSV] [--record FILE]
        One run's median step time over steps 3..N, tokens/s from it, MFU = F / (step time x P
        x G), rank 0's peak CUDA memory as the run reports it (cuda_peak_allocated_bytes and
        cuda_peak_reserved_bytes in --metrics' ranks; None when the run does not report them),
        and with --gpu-samples (nvidia-smi --query-gpu=memory.used in MiB, one line per sample,
        taken while the run was alone on the GPU) the peak device memory in use minus the first
        sample: the process's whole footprint as the driver sees it, the same measure for any
        program.

    report.py peak --hardware FILE --dtype bf16
        The dense peak FLOP/s of FILE (bench/hardware/*.json) for dtype.

    report.py note --record FILE --kind KIND [KEY=VALUE | KEY:=JSON | KEY=@PATH ...]
        Appends one record: KEY=VALUE a string, KEY:=JSON a number (or any JSON value), and
        KEY=@PATH the JSON file at PATH.

    report.py summarize --work DIR --out DIR
        OUT/results.json (every record, the machine and the steps of OUT/status.tsv) and
        OUT/summary.md (the same, as tables, read first), each replaced atomically, so a run cut
        short leaves whole files.

Records are JSON lines with a "kind": equality, speed, and whatever run.sh notes (machine,
build, ctest, comm_bench, trace, sanitizer). The safetensors reader is
bench/reference/fsdp2_reference.py's, so this needs only torch, and only to compare weights.
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))


def read_metrics(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        raise SystemExit(f"{path}: no steps")
    return rows


def append_record(path, record):
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def weight_difference(a_path, b_path, lr, steps):
    """(largest relative difference, its tensor, whether GPT-2's key bias stayed in bounds,
    largest absolute difference)."""
    import torch
    from fsdp2_reference import load_safetensors
    wa, wb = load_safetensors(a_path), load_safetensors(b_path)
    if set(wa) != set(wb):
        raise SystemExit(f"the exports name different tensors: {sorted(set(wa) ^ set(wb))[:5]}")
    n_embd = wb["transformer.wte.weight"].shape[1] if "transformer.wte.weight" in wb else 0
    param, worst, key_bias_ok, absolute = 0.0, "-", True, 0.0
    for name in sorted(wa):
        x, y = wa[name].double(), wb[name].double()
        absolute = max(absolute, (x - y).abs().max().item())
        scale = max(y.abs().max().item(), 1e-30)
        if name.endswith("attn.c_attn.bias"):
            key = (x[n_embd:2 * n_embd] - y[n_embd:2 * n_embd]).abs().max().item()
            key_bias_ok = key_bias_ok and key <= 2 * lr * steps
            x = torch.cat((x[:n_embd], x[2 * n_embd:]))
            y = torch.cat((y[:n_embd], y[2 * n_embd:]))
        d = (x - y).abs().max().item() / scale
        if d > param:
            param, worst = d, name
    return param, worst, key_bias_ok, absolute


def compare(args):
    a, b = read_metrics(args.a_metrics), read_metrics(args.b_metrics)
    if len(a) != len(b):
        raise SystemExit(f"{args.name}: {len(a)} steps against {len(b)}")
    loss = max(relative(x["loss"], y["loss"]) for x, y in zip(a, b))
    norm = max(relative(x["grad_norm"], y["grad_norm"]) for x, y in zip(a, b))
    first_loss = relative(a[0]["loss"], b[0]["loss"])
    first_norm = relative(a[0]["grad_norm"], b[0]["grad_norm"])
    param, worst, key_bias_ok, absolute = None, None, True, None
    if args.a_weights != "-" and args.b_weights != "-":
        param, worst, key_bias_ok, absolute = weight_difference(args.a_weights, args.b_weights,
                                                                args.lr, len(a))
    first_bound, reference_gap = args.tolerance, None
    if args.across_devices and args.reference_gap:
        r = read_metrics(args.reference_gap)
        reference_gap = max(relative(r[0]["loss"], b[0]["loss"]),
                            relative(r[0]["grad_norm"], b[0]["grad_norm"]))
        first_bound = max(args.tolerance, 2 * reference_gap)
    if args.across_devices:
        ok = (max(first_loss, first_norm) <= first_bound
              and (absolute or 0.0) <= 2 * args.lr * len(a))
    else:
        ok = max(loss, norm, param or 0.0) <= args.tolerance and key_bias_ok
    record = {"kind": "equality", "name": args.name, "steps": len(a), "loss_rel": loss,
              "grad_norm_rel": norm, "first_loss_rel": first_loss, "first_grad_norm_rel": first_norm,
              "param_rel": param, "param_abs": absolute, "worst_param": worst,
              "key_bias_ok": key_bias_ok, "tolerance": args.tolerance,
              "reference_first_gap": reference_gap, "first_step_bound": first_bound,
              "across_devices": args.across_devices, "pass": ok}
    append_record(args.record, record)
    print(json.dumps(record))
    return 0 if ok else 1


def gpu_footprint(samples_path):
    """Peak minus first sample of nvidia-smi's memory.used (MiB) samples, in bytes."""
    with open(samples_path) as f:
        mib = [float(line.split(",")[0]) for line in f if line.strip()[:1].isdigit()]
    return int((max(mib) - mib[0]) * 2**20) if len(mib) >= 2 else None


def perf(args):
    rows = read_metrics(args.metrics)
    timed = rows[2:] if len(rows) > 2 else rows
    step_s = statistics.median(r["step_s"] for r in timed)
    rank0 = rows[-1]["ranks"][0]
    record = {"kind": "speed", "name": args.name, "model": args.model, "side": args.side,
              "gpus": args.gpus, "timed_steps": len(timed), "step_s": step_s,
              "tokens_per_s": args.tokens_per_step / step_s,
              "mfu": args.flops_per_step / (step_s * args.peak_flops * args.gpus)
              if args.flops_per_step > 0 and args.peak_flops > 0 else None,
              "cuda_peak_allocated_bytes": rank0.get("cuda_peak_allocated_bytes"),
              "cuda_peak_reserved_bytes": rank0.get("cuda_peak_reserved_bytes"),
              "gpu_footprint_bytes": gpu_footprint(args.gpu_samples) if args.gpu_samples
              else None}
    append_record(args.record, record)
    print(json.dumps(record))
    return 0


def peak(args):
    with open(args.hardware) as f:
        print(json.load(f)["compute"]["peak_flops"][args.dtype])
    return 0


def note(args):
    record = {"kind": args.kind}
    for item in args.items:
        key, _, value = item.partition("=")
        if key.endswith(":"):
            record[key[:-1]] = json.loads(value)
        elif value.startswith("@"):
            with open(value[1:]) as f:
                record[key] = json.load(f)
        else:
            record[key] = value
    append_record(args.record, record)
    return 0


# ---- summarize ----------------------------------------------------------------------------------

def read_records(work):
    path = os.path.join(work, "records.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_status(out):
    path = os.path.join(out, "status.tsv")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    keys = rows[0] if rows else []
    return [dict(zip(keys, r)) for r in rows[1:]]


def fmt(value, spec):
    return "n/a" if value is None else format(value, spec)


def gib(value):
    return "n/a" if value is None else f"{value / 2**30:.2f}"


def equality_table(records):
    rows = [r for r in records if r["kind"] == "equality"]
    if not rows:
        return ["(none ran)"]
    lines = ["| runs | steps | loss | grad norm | step 1 loss, grad norm | parameters (worst tensor) "
             "| largest parameter difference | held to | result |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        param = "not compared" if r["param_rel"] is None else \
            f"{r['param_rel']:.2e} ({r['worst_param']})"
        absolute = fmt(r.get("param_abs"), ".2e")
        first = f"{fmt(r.get('first_loss_rel'), '.2e')}, {fmt(r.get('first_grad_norm_rel'), '.2e')}"
        held = f"{r['tolerance']:g} relative"
        if r.get("across_devices"):
            bound = r.get("first_step_bound", r["tolerance"])
            gap = r.get("reference_first_gap")
            reference = "" if gap is None else f" (2 x FSDP2's own {gap:.2e}, or {r['tolerance']:g})"
            held = f"step 1 at {bound:.2e}{reference}, parameters at 2 lr x steps"
        result = "pass" if r["pass"] else "FAIL"
        if not r["key_bias_ok"]:
            result += " (attn key bias beyond 2 lr per step)"
        lines.append(f"| {r['name']} | {r['steps']} | {r['loss_rel']:.2e} | "
                     f"{r['grad_norm_rel']:.2e} | {first} | {param} | {absolute} | {held} | "
                     f"{result} |")
    return lines


def speed_table(records):
    rows = [r for r in records if r["kind"] == "speed"]
    if not rows:
        return ["(none ran)"]
    lines = ["| run | timed steps | step (s) | tokens/s | MFU | peak allocated (GiB) | "
             "peak reserved (GiB) | GPU footprint, nvidia-smi (GiB) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        lines.append(f"| {r['name']} | {r['timed_steps']} | {r['step_s']:.4f} | "
                     f"{r['tokens_per_s']:,.0f} | {mfu} | {gib(r['cuda_peak_allocated_bytes'])} | "
                     f"{gib(r['cuda_peak_reserved_bytes'])} | {gib(r['gpu_footprint_bytes'])} |")
    lines += ["", "Goals: tokens/s at least FSDP2's; device memory at most FSDP2's + 5%."]
    by = {(r["model"], r["side"]): r for r in rows}
    for model in dict.fromkeys(r["model"] for r in rows):
        ours, theirs = by.get((model, "ours")), by.get((model, "fsdp2"))
        if not ours or not theirs:
            continue
        speed = ours["tokens_per_s"] / theirs["tokens_per_s"]
        text = f"- {model}: tokens/s ours / FSDP2 = {speed:.3f} ({'met' if speed >= 1 else 'NOT met'})"
        if ours["gpu_footprint_bytes"] and theirs["gpu_footprint_bytes"]:
            mem = ours["gpu_footprint_bytes"] / theirs["gpu_footprint_bytes"]
            text += f"; GPU footprint ours / FSDP2 = {mem:.3f} ({'met' if mem <= 1.05 else 'NOT met'})"
        lines.append(text)
    return lines


def comm_lines(records):
    lines = []
    for r in (r for r in records if r["kind"] == "comm_bench"):
        data = r.get("data") or {}
        largest = {}
        for m in data.get("results", []):
            if m["size_bytes"] >= largest.get(m["collective"], {}).get("size_bytes", -1):
                largest[m["collective"]] = m
        lines.append(f"W={data.get('world_size')} over {data.get('backend')} ({r.get('ranks_note', '')}): "
                     + "; ".join(f"{c} {m['busbw_gbs']:.2f} GB/s busbw at {m['size_bytes'] / 2**20:g} MiB"
                                 for c, m in largest.items()))
    return lines or ["(none ran)"]


def other_lines(records, kinds):
    lines = []
    for r in (r for r in records if r["kind"] in kinds):
        lines.append(f"- {r['kind']}: " + ", ".join(f"{k} = {v}" for k, v in r.items()
                                                   if k != "kind" and not isinstance(v, (dict, list))))
    return lines or ["(none ran)"]


def write_atomically(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def summarize(args):
    records, steps = read_records(args.work), read_status(args.out)
    machine = next((r for r in records if r["kind"] == "machine"), {})
    results = {"machine": machine, "steps": steps,
               "records": [r for r in records if r["kind"] != "machine"]}
    write_atomically(os.path.join(args.out, "results.json"), json.dumps(results, indent=2) + "\n")
    md = [f"# bench/gpu/run.sh on {machine.get('gpu', '?')} x {machine.get('gpus', '?')}", "",
          f"torch {machine.get('torch', '?')}, CUDA {machine.get('cuda', '?')}, NCCL "
          f"{machine.get('nccl', '?')}, driver {machine.get('driver', '?')}; commit "
          f"{machine.get('commit', '?')}; MFU against {machine.get('hardware', '?')}'s dense "
          f"bf16 peak.", "",
          "## Steps", "", "| step | result | seconds | note |", "|---|---|---|---|"]
    md += [f"| {s.get('step')} | {s.get('result')} | {s.get('seconds')} | {s.get('note', '')} |"
           for s in steps]
    md += ["", "## Equality (largest relative difference)", ""] + equality_table(records)
    md += ["", "## Speed (bf16, one rank)", ""] + speed_table(records)
    md += ["", "## Collectives over NCCL (fsdp-comm-bench)", ""] + comm_lines(records)
    md += ["", "## Build, tests, trace, sanitizers", ""]
    md += other_lines(records, ("build", "ctest", "trace", "sanitizer"))
    md += ["", "Every number is in results.json; every log in logs.tar.gz.", ""]
    write_atomically(os.path.join(args.out, "summary.md"), "\n".join(md))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--name", required=True)
    c.add_argument("--tolerance", type=float, required=True)
    c.add_argument("--lr", type=float, default=3e-3)
    c.add_argument("--record")
    c.add_argument("--across-devices", action="store_true")
    c.add_argument("--reference-gap", metavar="R.jsonl")
    for side in ("a", "b"):
        c.add_argument(f"{side}_metrics")
        c.add_argument(f"{side}_weights")
    q = sub.add_parser("perf")
    q.add_argument("--name", required=True)
    q.add_argument("--model", required=True)
    q.add_argument("--side", required=True)
    q.add_argument("--metrics", required=True)
    q.add_argument("--tokens-per-step", type=float, required=True)
    q.add_argument("--flops-per-step", type=float, required=True)
    q.add_argument("--peak-flops", type=float, required=True)
    q.add_argument("--gpus", type=int, required=True)
    q.add_argument("--gpu-samples")
    q.add_argument("--record")
    k = sub.add_parser("peak")
    k.add_argument("--hardware", required=True)
    k.add_argument("--dtype", default="bf16")
    n = sub.add_parser("note")
    n.add_argument("--record", required=True)
    n.add_argument("--kind", required=True)
    n.add_argument("items", nargs="*")
    s = sub.add_parser("summarize")
    s.add_argument("--work", required=True)
    s.add_argument("--out", required=True)
    args = p.parse_args()
    return {"compare": compare, "perf": perf, "peak": peak, "note": note,
            "summarize": summarize}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
