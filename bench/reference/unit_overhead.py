#!/usr/bin/env python3
"""PyTorch's side of bench/unit_overhead.sh: the same model of many tiny units (Linear(dim,
dim) then LayerNorm, each one FSDP2 unit via fully_shard, then the root), the same SGD step,
timed the same way as bench/unit_overhead.cpp.

    torchrun --standalone --nproc-per-node W bench/reference/unit_overhead.py [flags]
    python3 bench/reference/unit_overhead.py --no-fsdp [flags]

Rank 0 prints one JSON line: {"side": "fsdp2", "fsdp": bool, "world": W, "units": N,
"median_step_us": ...}, the median over the steps after the first 10. One intra-op thread per
rank, gloo on the CPU.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn


class Unit(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(self.fc(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=64)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--no-fsdp", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    fsdp = not args.no_fsdp
    rank, world = 0, 1
    if fsdp:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(*[Unit(args.dim) for _ in range(args.units)])
    if fsdp:
        from torch.distributed.fsdp import fully_shard
        for unit in model:
            fully_shard(unit)
        fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + rank)
    x, y = torch.randn(args.batch, args.dim), torch.randn(args.batch, args.dim)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        times.append((time.perf_counter() - start) * 1e6)
    if rank == 0:
        print(json.dumps({"side": "fsdp2", "fsdp": fsdp, "world": world, "units": args.units,
                          "median_step_us": round(statistics.median(times[10:]), 1)}))
    if fsdp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
