"""The learning rates of fsdp::train::lr_at's schedules as PyTorch's own schedulers give them.

Each case of --cases (a JSON list of {kind, peak_lr, min_lr, warmup_steps, decay_frac,
total_steps}) becomes a torch.optim.lr_scheduler chain over an SGD optimizer, stepped once per
training step; --out gets the list of every case's rates, step by step:
  warm-up   LinearLR from 1/W to 1 over the first W steps
  constant  ConstantLR(factor=1)
  cosine    CosineAnnealingLR(T_max = total - W, eta_min = min_lr)
  wsd       ConstantLR until the last D = decay_frac * total steps, then LinearLR down to min_lr,
            reaching it at the last step
joined by SequentialLR at the phases' first steps.

usage: lr_schedule_reference.py --cases CASES.json --out RATES.json
"""
import argparse
import json
import warnings

import torch
from torch.optim.lr_scheduler import ConstantLR, CosineAnnealingLR, LinearLR, SequentialLR


def phases(optimizer, case):
    """The case's schedulers and the steps at which each after the first begins."""
    warmup, total = case["warmup_steps"], case["total_steps"]
    peak, floor = case["peak_lr"], case["min_lr"]
    schedulers, milestones = [], []
    if warmup > 0:
        schedulers.append(LinearLR(optimizer, start_factor=1 / warmup, end_factor=1.0,
                                   total_iters=warmup - 1))
        milestones.append(warmup)
    if case["kind"] == "constant":
        schedulers.append(ConstantLR(optimizer, factor=1.0, total_iters=0))
    elif case["kind"] == "cosine":
        schedulers.append(CosineAnnealingLR(optimizer, T_max=total - warmup, eta_min=floor))
    elif case["kind"] == "wsd":
        decay = int(case["decay_frac"] * total + 0.5)
        schedulers.append(ConstantLR(optimizer, factor=1.0, total_iters=0))
        milestones.append(total - decay)
        end = floor / peak
        schedulers.append(LinearLR(optimizer, start_factor=1 - (1 - end) / decay, end_factor=end,
                                   total_iters=decay - 1))
    else:
        raise ValueError(f"unknown schedule {case['kind']!r}")
    return schedulers, milestones


def rates(case):
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=case["peak_lr"])
    schedulers, milestones = phases(optimizer, case)
    scheduler = (schedulers[0] if len(schedulers) == 1 else
                 SequentialLR(optimizer, schedulers, milestones=milestones))
    out = []
    for _ in range(case["total_steps"]):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    # SequentialLR steps a scheduler with an epoch at each milestone, which PyTorch deprecates.
    warnings.filterwarnings("ignore", category=UserWarning)
    with open(args.cases) as f:
        cases = json.load(f)
    with open(args.out, "w") as f:
        json.dump([rates(c) for c in cases], f)


if __name__ == "__main__":
    main()
