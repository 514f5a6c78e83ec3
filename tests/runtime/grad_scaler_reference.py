#!/usr/bin/env python3
"""PyTorch's torch.amp.GradScaler on a scripted sequence of steps: the reference of
tests/runtime/test_grad_scaler.cpp, which drives fsdp::ShardedGradScaler through the same steps.

usage: grad_scaler_reference.py SPEC.json

SPEC: {"init_scale", "growth_factor", "backoff_factor", "growth_interval", "lr",
       "param": [floats], "steps": [[coefficients as strings: "1.5", "inf", "nan"], ...]}

One float32 parameter p and SGD(lr). Step i: loss = sum(p.half() * c_i.half()) (an fp16 loss, so
a large scale overflows the fp16 gradient by itself, and "inf"/"nan" coefficients force it),
scaler.scale(loss).backward(), scaler.unscale_, scaler.step, scaler.update. Prints one JSON
object per step: the scale it used, whether the optimizer stepped, the scale and growth tracker
after update, and p after the step (floats as their exact float32 values).
"""
import json
import sys

import torch


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    p = torch.tensor(spec["param"], dtype=torch.float32, requires_grad=True)
    optimizer = torch.optim.SGD([p], lr=spec["lr"])
    scaler = torch.amp.GradScaler("cpu", init_scale=spec["init_scale"],
                                  growth_factor=spec["growth_factor"],
                                  backoff_factor=spec["backoff_factor"],
                                  growth_interval=spec["growth_interval"])
    for coefficients in spec["steps"]:
        c = torch.tensor([float(x) for x in coefficients], dtype=torch.float32)
        optimizer.zero_grad(set_to_none=True)
        loss = (p.half() * c.half()).sum()
        scale_used = scaler.get_scale() if scaler._scale is not None else spec["init_scale"]
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        found_inf = sum(v.item() for v in
                        scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values())
        scaler.step(optimizer)
        scaler.update()
        print(json.dumps({"scale": scale_used, "stepped": found_inf == 0,
                          "scale_after": scaler.get_scale(),
                          "growth_tracker": int(scaler._growth_tracker.item()),
                          "param": p.detach().tolist()}))


if __name__ == "__main__":
    main()
