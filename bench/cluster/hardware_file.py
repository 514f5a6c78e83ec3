#!/usr/bin/env python3
"""A hardware file for fsdp-plan describing cluster.sh's two hosts.

    python3 bench/cluster/hardware_file.py BASE.json ACROSS.json PER_HOST OUT.json \\
        [--in-host IN_HOST.json] [--network-cpu-fraction F]

BASE.json: `fsdp-plan --calibrate --output BASE.json` on this machine (its compute, and its
`collectives` measured within one host). ACROSS.json: fsdp-comm-bench's output with one rank per
host across the shaped link (`KEEP_DIR=D MPI_ALGOS= bash bench/cluster/comm_two_hosts.sh PROFILE`
writes D/gloo.json); its alpha-beta fits become `inter_node_collectives` for groups of 2, which
the planner gives a group whose ranks span the hosts. PER_HOST: ranks per host, the file's
`devices_per_node`. Both hosts share this machine's cores, so `cpu_cores` stays the machine's: the
planner shares them among every rank of the job, as the hosts' ranks share them here.

--in-host (`IN_HOST=PER_HOST comm_two_hosts.sh`'s in_host.json): fsdp-comm-bench with PER_HOST
ranks within each host, both hosts at once; its fits replace BASE.json's `collectives` for groups
of PER_HOST. BASE.json measured one such group alone on the machine, but in training both hosts'
groups run their collectives at the same moments, on the cores that the two hosts share here
(a cluster of separate machines would not share them). With IN_HOST_BUSY=1 the groups are
measured beside one matmul loop per rank, as HSDP's shard groups run beside their ranks'
compute: on this machine their copies and sums then take 1.5-2x as long (16 MiB all-gather 31-41
against 16 ms), and the planner's HSDP steps come within 8% of the runs instead of 17%.

--network-cpu-fraction: the file's `network_cpu_fraction`, the compute speed lost beside a
collective across the link (`bench/cluster/network_cpu.sh` prints it).
"""
import argparse
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


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base")
    parser.add_argument("across")
    parser.add_argument("per_host", type=int)
    parser.add_argument("out")
    parser.add_argument("--in-host")
    parser.add_argument("--network-cpu-fraction", type=float)
    args = parser.parse_args()
    hardware = json.load(open(args.base))
    world, fits = fits_of(args.across)
    hardware["inter_node_collectives"] = {str(world): fits}
    if args.in_host:
        group, in_host = fits_of(args.in_host)
        if group != args.per_host:
            sys.exit(f"hardware_file.py: {args.in_host} has groups of {group}, "
                     f"not PER_HOST = {args.per_host}")
        hardware.setdefault("collectives", {})[str(group)] = in_host
    if args.network_cpu_fraction is not None:
        if not 0 <= args.network_cpu_fraction <= 1:
            sys.exit(f"hardware_file.py: --network-cpu-fraction must be in [0, 1], "
                     f"got {args.network_cpu_fraction}")
        hardware["network_cpu_fraction"] = args.network_cpu_fraction
    hardware["devices_per_node"] = args.per_host
    hardware["name"] = f"{hardware.get('name', 'this machine')}, two hosts of cluster.sh"
    with open(args.out, "w") as out:
        json.dump(hardware, out, indent=2, sort_keys=True)
        out.write("\n")


if __name__ == "__main__":
    main()
