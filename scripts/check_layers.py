#!/usr/bin/env python3
"""Checks that every project include goes to the same layer or one below it.

The layers, bottom up, are those of docs/design.md: util, comm, mesh, runtime, then checkpoint and
estimate, then models (public interface in include/fsdp/models/), then train (the training
pieces: token dataset and loader, learning-rate schedules, checkpoint manager, metrics sinks, job
config; public headers in include/fsdp/train/), then tools (the trainer program and the other
programs). data (tokenizers and token files) stands apart: it needs nothing but util-like
helpers of its own, and only the layers that load data (train, tools) include it. CMake gives each
layer its own target linking only the layers below; this check also catches an upward include
of a header-only piece, which a link would not. Exits 1 listing every violation.

usage: check_layers.py [REPO_ROOT]
"""
import pathlib
import re
import sys

# layer name -> (rank, path prefixes relative to the repo, as files or folders)
LAYERS = {
    "util": (0, ["include/fsdp/util/", "src/util/", "src/pch.h"]),
    "data": (0, ["include/fsdp/data/", "src/data/"]),
    "comm": (1, ["include/fsdp/comm/", "src/comm/"]),
    "mesh": (2, ["include/fsdp/device_mesh.h", "src/device_mesh.cpp", "include/fsdp/named_mesh.h",
                 "src/named_mesh.cpp"]),
    "runtime": (3, ["include/fsdp/runtime/", "include/fsdp/detail/", "include/fsdp/fully_shard.h",
                    "include/fsdp/clip_grad.h", "include/fsdp/grad_scaler.h",
                    "include/fsdp/activation_checkpoint.h", "include/fsdp/sharding_strategy.h",
                    "include/fsdp/tensor_parallel.h", "src/runtime/", "src/tensor_parallel/"]),
    "checkpoint": (4, ["include/fsdp/checkpoint/", "src/checkpoint/"]),
    "estimate": (4, ["include/fsdp/memory_estimate.h", "src/estimate/"]),
    "models": (5, ["include/fsdp/models/", "models/"]),
    "train": (6, ["include/fsdp/train/", "train/"]),
    "tools": (7, ["tools/"]),
}
# data is a side branch: besides itself it may include nothing of the project, and only the
# layers that load data may include it.
ISOLATED = {"data"}
DATA_USERS = {"train", "tools"}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def layer_of(path):
    for name, (_, prefixes) in LAYERS.items():
        if any(path == p or path.startswith(p) for p in prefixes):
            return name
    return None


def resolve(include, source, root):
    """The repo-relative path an include names, or None for a header outside the project."""
    candidates = [f"include/{include}", include, f"tools/{include}",
                  str((pathlib.Path(source).parent / include)), f"src/{include}"]
    for c in candidates:
        c = str(pathlib.PurePosixPath(c))
        if (root / c).is_file():
            return str(pathlib.Path(c).resolve().relative_to(root.resolve())) if ".." in c else c
    return None


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    problems = []
    for source in sorted(root.glob("**/*")):
        rel = str(source.relative_to(root))
        if source.suffix not in (".h", ".cpp") or rel.startswith(("build", ".venv")):
            continue
        mine = layer_of(rel)
        if mine is None:
            continue
        for include in INCLUDE.findall(source.read_text(errors="replace")):
            target = resolve(include, rel, root)
            theirs = layer_of(target) if target else None
            if theirs is None or theirs == mine:
                continue
            upward = LAYERS[theirs][0] > LAYERS[mine][0]
            sideways = LAYERS[theirs][0] == LAYERS[mine][0]
            if upward or sideways or mine in ISOLATED or theirs in ISOLATED and mine not in DATA_USERS:
                problems.append(f"{rel} ({mine}) includes {include} ({theirs})")
    for p in problems:
        print("layering:", p)
    print(f"check_layers: {len(problems)} upward or sideways includes")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
