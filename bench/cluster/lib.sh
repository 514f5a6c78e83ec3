# shellcheck shell=bash disable=SC2034  # bin, host1 and others are for the scripts that source it
# Sourced by the scripts in bench/cluster/: the cluster's hosts and the launch commands that run
# fsdp-train (or any rank program) on them. Expects to be sourced from the repository root.
#
#   on HOST CMD...                runs CMD on host 0 or 1 (its namespace)
#   rank_of_two_on HOST PORT CMD... CMD as rank HOST of 2, one rank per host, from torchrun's
#                                 variables with the master on host 0 at PORT
#   say MESSAGE...                a progress line on stderr
#   matmul_on, block_on           one thread's compute on a host, for what collectives take
#                                 from it (below)
#   torchrun_on HOST NPROC CMD... torchrun's static rendezvous, 2 nodes, the master on host 0
#   mpirun_across NPERHOST CMD... one mpirun on host 0, NPERHOST ranks on each host (ranks
#                                 0..N-1 on host 0), the remote
#                                 daemon started by mpi_agent.sh, every MPI byte on the veth
#
# Environment: FSDP_TRAIN_BIN (default build/fsdp-train), PYTHON (default .venv/bin/python3),
# MPIRUN_FLAGS (more mpirun options for mpirun_across, split at spaces).
readonly cluster="bench/cluster/cluster.sh"
readonly host0=10.77.0.1
readonly host1=10.77.0.2
readonly subnet=10.77.0.0/24
bin="${FSDP_TRAIN_BIN:-build/fsdp-train}"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python3 ]; then PYTHON="$PWD/.venv/bin/python3"; else PYTHON=python3; fi
fi
torchrun="$(dirname "$PYTHON")/torchrun"

# Makes the script's scratch directory $out and, on any exit, takes the cluster down (if it is up)
# and removes $out. Call it before the first run, so that a run failing early leaves nothing.
scratch_dir_removed_on_exit() {
  out="$(mktemp -d)"
  trap 'bash "$cluster" down >/dev/null 2>&1 || true; rm -rf "$out"' EXIT
}

on() {
  local h="$1"
  shift
  bash "$cluster" exec "$h" "$@"
}

# matmul_on HOST SECONDS [STOP_FILE]: 768 x 768 by 768 x 3072 fp32 matmuls (a GPT-2 block's MLP
# shape for 768 tokens) on one thread of HOST for SECONDS, or until STOP_FILE exists; prints the
# GFLOP/s. A rank's compute, for measuring what collectives and compute take from each other.
matmul_on() {
  on "$1" "$PYTHON" - "$2" "${3:-}" <<'PY'
import os, sys, time, torch
torch.set_num_threads(1)
seconds, stop = float(sys.argv[1]), sys.argv[2]
a, b = torch.randn(768, 768), torch.randn(768, 3072)
for _ in range(3):
    a @ b
count, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds and not (stop and os.path.exists(stop)):
    a @ b
    count += 1
print(2 * 768 * 768 * 3072 * count / (time.perf_counter() - start) / 1e9)
PY
}

# block_on HOST SECONDS: forward and backward of one GPT-2 block (width 768, 12 heads, causal
# attention over 4 x 128 tokens, tanh GELU, pre-norm) on one thread of HOST for SECONDS; prints
# tokens/s. A rank's training compute as a whole: its matmuls and the memory-bound work between
# them (norms, GELU, softmax, residual adds), which a transfer's copies slow more than a matmul.
block_on() {
  on "$1" "$PYTHON" - "$2" <<'PY'
import sys, time, torch
import torch.nn.functional as F
torch.set_num_threads(1)
torch.manual_seed(0)
seconds = float(sys.argv[1])
width, heads, batch, seq = 768, 12, 4, 128


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.fc, self.out = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x):
        heads_of = lambda t: t.view(batch, seq, heads, width // heads).transpose(1, 2)
        q, k, v = map(heads_of, self.qkv(self.ln1(x)).split(width, -1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(batch, seq, width))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


block, x = Block(), torch.randn(batch, seq, width, requires_grad=True)
def step():
    block.zero_grad(set_to_none=True)
    block(x).square().mean().backward()
for _ in range(3):
    step()
count, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    step()
    count += 1
print(batch * seq * count / (time.perf_counter() - start))
PY
}

rank_of_two_on() {  # HOST PORT CMD...
  local h="$1" port="$2"
  shift 2
  on "$h" env RANK="$h" WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR="$host0" MASTER_PORT="$port" "$@"
}

say() { echo "== $*" >&2; }

torchrun_on() {  # HOST NPROC CMD...
  local h="$1" n="$2" address
  shift 2
  if [ "$h" = 0 ]; then address="$host0"; else address="$host1"; fi
  on "$h" "$torchrun" --nnodes 2 --node-rank "$h" --nproc-per-node "$n" \
    --master-addr "$host0" --master-port 29400 --local-addr "$address" --no-python "$@"
}

# [Note: mpirun across the namespaces]
# mpirun runs on host 0 and starts host 1's daemon through mpi_agent.sh (ip netns exec instead
# of ssh). Its out-of-band channel and the TCP BTL are held to the veth's subnet: without
# btl_tcp_if_include, Open MPI would also pair the hosts' loopback addresses, which in two
# namespaces are two different loopbacks. Open MPI uses shared memory (vader) only between
# ranks it placed on the same node of the hostfile, so bytes between the hosts take TCP over
# the veth (on_both prints what crossed it). The hosts have names of their own (cluster.sh),
# so no MASTER_ADDR is passed: rank 0 sends its host's name over MPI, as on a real cluster.
mpirun_across() {  # NPERHOST CMD...
  local n="$1" hostfile rc=0 extra=()
  shift
  read -r -a extra <<< "${MPIRUN_FLAGS:-}"
  hostfile="$(mktemp)"
  printf '%s slots=%s\n%s slots=%s\n' "$host0" "$n" "$host1" "$n" > "$hostfile"
  on 0 env -u MASTER_ADDR -u MASTER_PORT mpirun --allow-run-as-root --hostfile "$hostfile" -np $((2 * n)) --bind-to none \
    --mca plm_rsh_agent "$PWD/bench/cluster/mpi_agent.sh" \
    --mca oob_tcp_if_include "$subnet" --mca btl_tcp_if_include "$subnet" \
    --mca btl tcp,vader,self "${extra[@]}" \
    -x PATH ${LD_LIBRARY_PATH:+-x LD_LIBRARY_PATH} "$@" || rc=$?
  rm -f "$hostfile"
  return "$rc"
}

# Bytes host H has sent on its end of the link so far (the veth's counter).
link_tx_bytes() {
  ip -n "fsdpcl-h$1" -s -j link show dev "fsdpcl-v$1" |
    "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)[0]["stats64"]["tx"]["bytes"])'
}

# Runs CMD (a function or program taking the host as its first argument) on both hosts at once;
# fails if either fails. Prints the bytes that crossed the link each way to stderr.
on_both() {
  local before0 before1 rc0=0 rc1=0
  before0="$(link_tx_bytes 0)"
  before1="$(link_tx_bytes 1)"
  "$@" 0 &
  local first=$!
  "$@" 1 || rc1=$?
  wait "$first" || rc0=$?
  echo "   link: host 0 sent $(($(link_tx_bytes 0) - before0)) bytes, host 1 sent $(($(link_tx_bytes 1) - before1))" >&2
  [ "$rc0" = 0 ] && [ "$rc1" = 0 ]
}
