#!/usr/bin/env python3
"""A hardware file for fsdp-plan describing cluster.sh's two hosts.

    python3 bench/cluster/hardware_file.py BASE.json ACROSS.json PER_HOST OUT.json [IN_HOST.json]

BASE.json: `fsdp-plan --calibrate --output BASE.json` on this machine (its compute, and its
`collectives` measured within one host). ACROSS.json: fsdp-comm-bench's output with one rank per
host across the shaped link (`KEEP_DIR=D MPI_ALGOS= bash bench/cluster/comm_two_hosts.sh PROFILE`
writes D/gloo.json); its alpha-beta fits become `inter_node_collectives` for groups of 2, which
the planner gives a group whose ranks span the hosts. PER_HOST: ranks per host, the file's
`devices_per_node`. Both hosts share this machine's cores, so `cpu_cores` stays the machine's: the
planner shares them among every rank of the job, as the hosts' ranks share them here.

IN_HOST.json (`IN_HOST=PER_HOST comm_two_hosts.sh`'s in_host.json): fsdp-comm-bench with PER_HOST
ranks within each host, both hosts at once; its fits replace BASE.json's `collectives` for groups
of PER_HOST. BASE.json measured one such group alone on the machine, but in training both hosts'
groups run their collectives at the same moments, on the cores that the two hosts share here
(a cluster of separate machines would not share them).
"""
import json
import sys


def fits_of(path):
    """The world size of fsdp-comm-bench's output at path, and its fits FSDP's collectives use."""
    bench = json.load(open(path))
    fits = {name: fit for name, fit in bench["fit"].items()
            if name in ("all_gather", "reduce_scatter", "all_reduce") and fit.get("points", 0) >= 2}
    if not fits:
        sys.exit(f"hardware_file.py: {path} has no all_gather/reduce_scatter/all_reduce fit")
    return bench["world_size"], fits


def main(base_path, across_path, per_host, out_path, in_host_path=None):
    hardware = json.load(open(base_path))
    world, fits = fits_of(across_path)
    hardware["inter_node_collectives"] = {str(world): fits}
    if in_host_path:
        group, in_host = fits_of(in_host_path)
        if group != int(per_host):
            sys.exit(f"hardware_file.py: {in_host_path} has groups of {group}, "
                     f"not PER_HOST = {per_host}")
        hardware.setdefault("collectives", {})[str(group)] = in_host
    hardware["devices_per_node"] = int(per_host)
    hardware["name"] = f"{hardware.get('name', 'this machine')}, two hosts of cluster.sh"
    with open(out_path, "w") as out:
        json.dump(hardware, out, indent=2, sort_keys=True)
        out.write("\n")


if __name__ == "__main__":
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    main(*sys.argv[1:])
