#!/usr/bin/env bash
# shellcheck disable=SC2317  # the functions run through on_both
# fsdp-train on the two hosts of cluster.sh, launched as clusters launch it, against the same run
# on one host: the losses and gradient norms of every step must be bit-identical.
#
#   bash scripts/run.sh build && bash bench/cluster/train_two_hosts.sh [PROFILE] [STEPS]
#
# PROFILE (default 1g) is cluster.sh's; the cluster is made here and removed on exit (it must
# not be up already). Runs, on GPT-2 `tiny`, 8 x 32 tokens per step:
# - one host (this namespace): --nproc 2 and --nproc 4 over gloo, mpirun -np 2 and -np 4 on the
#   mpi backend, W = 2 with 2 threads a rank, and --no-fsdp (the single process);
# - two hosts: torchrun (static rendezvous, the master on host 0) with 1 and 2 ranks per host,
#   over gloo; one mpirun on host 0 across both hosts (mpi_agent.sh starts host 1's daemon) with
#   1 and 2 ranks per host, on the mpi backend.
# Then compare_losses.py: each two-host run against its one-host run (bit-identical; for one rank
# per host, the one-host run with as many threads a rank: see [Note: threads of a rank alone on
# its host]), and every run against the single process (1e-5). Each two-host run prints the bytes each host sent on
# the link, the proof that the collectives crossed it.
#
# Needs root. Environment: FSDP_TRAIN_BIN, PYTHON (as lib.sh), LOSS_PCT (drop that percentage of
# the link's packets each way, cluster.sh up's --loss: TCP resends them, so every number must
# stay bit-identical).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=bench/cluster/lib.sh
. bench/cluster/lib.sh
profile="${1:-1g}"
steps="${2:-8}"
scratch_dir_removed_on_exit
flags=(--model tiny --global-batch 8 --seq-len 32 --seed 11 --steps "$steps" --log-every 1 --quiet
       --timeout-s 60)
mpirun_here=(env -u MASTER_ADDR -u MASTER_PORT mpirun --allow-run-as-root --oversubscribe)

say "one host"
"$bin" --nproc 2 "${flags[@]}" --metrics "$out/one_host_w2.jsonl"
"$bin" --nproc 4 "${flags[@]}" --metrics "$out/one_host_w4.jsonl"
"$bin" --no-fsdp "${flags[@]}" --metrics "$out/single.jsonl"
"${mpirun_here[@]}" -np 2 "$bin" --backend mpi "${flags[@]}" --metrics "$out/one_host_mpi_w2.jsonl"
"${mpirun_here[@]}" -np 4 "$bin" --backend mpi "${flags[@]}" --metrics "$out/one_host_mpi_w4.jsonl"
# [Note: threads of a rank alone on its host]
# fsdp-train gives each rank cores / LOCAL_WORLD_SIZE intra-op threads: on one host at W = 2
# that is 1 thread a rank, on 2 hosts x 1 it is 2 (torchrun and mpirun both say 1 rank per
# host), and 2 threads sum a norm in another order: the gradient norm then differs in its last
# bits (1.6e-7 relative, measured) though the losses do not. This run is W = 2 on one host with
# 2 threads a rank (launched by hand from torchrun's variables, LOCAL_WORLD_SIZE=1), the
# reference of the 1-rank-per-host runs.
for r in 0 1; do
  env RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29531 \
    "$bin" "${flags[@]}" --metrics "$out/one_host_w2_2threads.jsonl" &
done
wait

bash "$cluster" up "$profile" ${LOSS_PCT:+--loss "$LOSS_PCT"}
torchrun_w2() { torchrun_on "$1" 1 "$bin" "${flags[@]}" --metrics "$out/torchrun_2x1.jsonl"; }
torchrun_w4() { torchrun_on "$1" 2 "$bin" "${flags[@]}" --metrics "$out/torchrun_2x2.jsonl"; }
say "two hosts: torchrun --nnodes 2 --nproc-per-node 1 (each host: bash $cluster exec H $torchrun --nnodes 2 --node-rank H --master-addr $host0 ...)"
on_both torchrun_w2 || echo "   FAILED" >&2
say "two hosts: torchrun --nnodes 2 --nproc-per-node 2"
on_both torchrun_w4 || echo "   FAILED" >&2
# on_both's byte count, for the one mpirun that spans both hosts.
mpirun_one() { if [ "$1" = 0 ]; then mpirun_across "$2" "$bin" --backend mpi "${flags[@]}" --metrics "$3"; fi; }
mpirun_w2() { mpirun_one "$1" 1 "$out/mpirun_2x1.jsonl"; }
mpirun_w4() { mpirun_one "$1" 2 "$out/mpirun_2x2.jsonl"; }
say "two hosts: mpirun --hostfile ($host0, $host1) -np 2 --mca plm_rsh_agent bench/cluster/mpi_agent.sh ..."
on_both mpirun_w2 || echo "   FAILED" >&2
say "two hosts: mpirun -np 4, 2 ranks per host"
on_both mpirun_w4 || echo "   FAILED" >&2
# TCP's retransmitted segments in each host's network namespace (its own /proc/net/snmp): what
# LOSS_PCT made TCP resend.
# shellcheck disable=SC2016  # an awk program
retransmitted() { on "$1" awk '/^Tcp:/ { if (n++) print $13; }' /proc/net/snmp; }
say "TCP segments retransmitted: host 0 $(retransmitted 0), host 1 $(retransmitted 1)"

status=0
say "two hosts against one host (bit-identical)"
bench/cluster/compare_losses.py "$out/one_host_w2_2threads.jsonl" "torchrun 2 hosts x 1=$out/torchrun_2x1.jsonl" \
  "mpirun 2 hosts x 1=$out/mpirun_2x1.jsonl" || status=1
say "the same, against one host with 1 thread a rank (see [Note: threads of a rank alone on its host])"
bench/cluster/compare_losses.py --rel 1e-6 "$out/one_host_w2.jsonl" "torchrun 2 hosts x 1=$out/torchrun_2x1.jsonl" \
  "mpirun 2 hosts x 1=$out/mpirun_2x1.jsonl" "one host, 2 threads a rank=$out/one_host_w2_2threads.jsonl" || status=1
bench/cluster/compare_losses.py "$out/one_host_w4.jsonl" "torchrun 2 hosts x 2=$out/torchrun_2x2.jsonl" || status=1
bench/cluster/compare_losses.py "$out/one_host_mpi_w4.jsonl" "mpirun 2 hosts x 2=$out/mpirun_2x2.jsonl" || status=1
say "every run against the single process (1e-5)"
bench/cluster/compare_losses.py --rel 1e-5 "$out/single.jsonl" \
  "one host W=2=$out/one_host_w2.jsonl" "one host W=4=$out/one_host_w4.jsonl" \
  "one host mpi W=2=$out/one_host_mpi_w2.jsonl" "one host mpi W=4=$out/one_host_mpi_w4.jsonl" \
  "torchrun 2x1=$out/torchrun_2x1.jsonl" "torchrun 2x2=$out/torchrun_2x2.jsonl" \
  "mpirun 2x1=$out/mpirun_2x1.jsonl" "mpirun 2x2=$out/mpirun_2x2.jsonl" || status=1
exit "$status"
