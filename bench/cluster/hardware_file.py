#!/usr/bin/env python3
"""A hardware file for fsdp-plan describing cluster.sh's two hosts.

    python3 bench/cluster/hardware_file.py BASE.json ACROSS.json PER_HOST OUT.json

BASE.json: `fsdp-plan --calibrate --output BASE.json` on this machine (its compute, and its
`collectives` measured within one host). ACROSS.json: fsdp-comm-bench's output with one rank per
host across the shaped link (`KEEP_DIR=D MPI_ALGOS= bash bench/cluster/comm_two_hosts.sh PROFILE`
writes D/gloo.json); its alpha-beta fits become `inter_node_collectives` for groups of 2, which
the planner gives a group whose ranks span the hosts. PER_HOST: ranks per host, the file's
`devices_per_node`. Both hosts share this machine's cores, so `cpu_cores` stays the machine's: the
planner shares them among every rank of the job, as the hosts' ranks share them here.
"""
import json
import sys


def main(base_path, across_path, per_host, out_path):
    hardware = json.load(open(base_path))
    across = json.load(open(across_path))
    world = across["world_size"]
    fits = {name: fit for name, fit in across["fit"].items()
            if name in ("all_gather", "reduce_scatter", "all_reduce") and fit.get("points", 0) >= 2}
    if not fits:
        sys.exit(f"hardware_file.py: {across_path} has no all_gather/reduce_scatter/all_reduce fit")
    hardware["inter_node_collectives"] = {str(world): fits}
    hardware["devices_per_node"] = int(per_host)
    hardware["name"] = f"{hardware.get('name', 'this machine')}, two hosts of cluster.sh"
    with open(out_path, "w") as out:
        json.dump(hardware, out, indent=2, sort_keys=True)
        out.write("\n")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
