#!/usr/bin/env python3
"""One rank of bench/reference/fsdp2_reference.py (PyTorch FSDP2), launched the way torchrun
launches: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the environment, so that the ranks
can run on different hosts of cluster.sh. The reference itself starts its ranks as local
processes meeting on a file; here the process group meets on rank 0's TCP store (env://) and
gloo binds the interface GLOO_SOCKET_IFNAME names (the host's veth: the namespaces share a
hostname, which resolves to neither host).

    RANK=r WORLD_SIZE=w MASTER_ADDR=A MASTER_PORT=P GLOO_SOCKET_IFNAME=IF \\
        fsdp2_rank.py [fsdp2_reference.py's flags; --nproc is WORLD_SIZE]

Threads: as the reference, cpu_count // WORLD_SIZE intra-op threads per rank.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import fsdp2_reference as reference  # noqa: E402

torch_init = reference.dist.init_process_group


def init_from_environment(backend, init_method=None, rank=None, world_size=None, **kwargs):
    del init_method  # the reference's file store: replaced by rank 0's TCP store
    return torch_init(backend, init_method="env://", rank=rank, world_size=world_size, **kwargs)


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    args = reference.parse(reference.parser(), sys.argv[1:] + ["--nproc", str(world)])
    args.rendezvous_file = None
    reference.dist.init_process_group = init_from_environment
    reference.train(rank, world, args)


if __name__ == "__main__":
    main()
