#!/usr/bin/env bash
# A two-host "cluster" on one machine: two network namespaces, each a host with its own address,
# joined by a veth pair whose link is shaped with tc. Every byte between the hosts crosses that
# link, so collectives see a network's bandwidth instead of shared memory's.
#
#   bash bench/cluster/cluster.sh up PROFILE [--loss PCT]   make the hosts and shape the link
#   bash bench/cluster/cluster.sh exec HOST CMD...          run CMD on host 0 or 1
#   bash bench/cluster/cluster.sh with PROFILE [--loss PCT] -- CMD...
#                                                           up, run CMD here, down on any exit
#   bash bench/cluster/cluster.sh status                    hosts, addresses, qdiscs, processes
#   bash bench/cluster/cluster.sh probe [SECONDS]           measure the link: RTT and TCP rate
#   bash bench/cluster/cluster.sh down                      kill their processes, remove all
#
# PROFILE: 1g (1 Gbit/s, 0.2 ms RTT), 10g (10 Gbit/s, 0.05 ms RTT) or none (the veth as it is).
# Host h is namespace fsdpcl-h<h> at 10.77.0.<h+1>/24 on interface fsdpcl-v<h>; loopback is up
# in each. Both directions are shaped (each end's egress). The rate is netem's where the kernel
# has netem, else tbf's; the delay needs netem, and without it is not shaped (up says so, and
# status shows the qdiscs as they are). Loss is netem's, or without netem a tc BPF filter on
# each end's egress that drops each packet with probability PCT/100 (needs clang).
#
# Each host also has its own hostname, fsdpcl-h<h>, known to both hosts: exec runs CMD in a UTS
# namespace of its own with that name, and /etc/netns/fsdpcl-h<h>/hosts (which ip netns exec
# mounts over /etc/hosts) maps both names to their addresses. Without it the hosts would share
# this machine's name, and Open MPI, whose shared-memory segment names in /dev/shm (shared by
# the namespaces) include the host's name, crashed in MPI_Comm_dup with 2 ranks per host: as far
# as we can tell, the two hosts' local rank 0 opened the same segment.
#
# Only names with the prefix fsdpcl (namespaces fsdpcl-h*, links fsdpcl-v*, /etc/netns/fsdpcl-h*)
# and the state directory are ever touched; /etc/netns itself is removed by down only if up
# made it. up refuses when any of them is left from an earlier run (run down); a failure
# halfway through up removes what it made. Needs root.
#
# Environment: FSDP_CLUSTER_STATE (default /run/fsdp-cluster): the applied profile and the
# BPF object.
set -euo pipefail

readonly kPrefix=fsdpcl
readonly kSubnet=10.77.0
readonly kState="${FSDP_CLUSTER_STATE:-/run/fsdp-cluster}"
here="$(cd "$(dirname "$0")" && pwd)"
readonly here

ns() { echo "$kPrefix-h$1"; }
link() { echo "$kPrefix-v$1"; }
address() { echo "$kSubnet.$(($1 + 1))"; }

die() {
  echo "cluster.sh: $*" >&2
  exit 1
}

usage() {
  sed -n '6,13p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

require_root() {
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces, veth and tc); run it as root"
  command -v ip >/dev/null || die "needs ip (iproute2)"
  command -v tc >/dev/null || die "needs tc (iproute2)"
}

# Our namespaces and links that exist now, one a line.
leftovers() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep "^$kPrefix-h" || true
  ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep "^$kPrefix-v" || true
  local h
  for h in 0 1; do [ ! -e "/etc/netns/$(ns "$h")" ] || echo "/etc/netns/$(ns "$h")"; done
}

host_index() {
  case "$1" in
    0 | h0 | "$(address 0)") echo 0 ;;
    1 | h1 | "$(address 1)") echo 1 ;;
    *) die "no host '$1': hosts are 0 and 1 ($(address 0), $(address 1))" ;;
  esac
}

# profile_of NAME: sets rate, delay_ms (one way) and rtt_ms, or fails naming the profiles.
profile_of() {
  case "$1" in
    1g) rate=1gbit rtt_ms=0.2 delay_ms=0.1 ;;
    10g) rate=10gbit rtt_ms=0.05 delay_ms=0.025 ;;
    none) rate="" rtt_ms="" delay_ms="" ;;
    *) die "no profile '$1': 1g (1 Gbit/s, 0.2 ms RTT), 10g (10 Gbit/s, 0.05 ms RTT), none" ;;
  esac
}

have_netem() {
  # A qdisc on the first end, removed again: the only reliable test is to try.
  if tc -n "$(ns 0)" qdisc add dev "$(link 0)" root netem delay 1ms 2>/dev/null; then
    tc -n "$(ns 0)" qdisc del dev "$(link 0)" root
    return 0
  fi
  return 1
}

# tbf's bucket: a quarter millisecond at the rate, and at least 128 KiB: with less than a full
# GSO packet (64 KiB and its headers) 1 Gbit/s reached 0.41 Gbit/s, with 128 KiB 0.94 (TCP's
# payload share of 1 Gbit/s: 1448 / 1538 bytes a frame),
# so that the rate holds over any interval longer than that.
tbf_burst_bytes() {
  local bits="${1%gbit}"
  local bytes=$((bits * 1000000000 / 8 / 4000))
  echo $((bytes > 131072 ? bytes : 131072))
}

build_loss_filter() {  # PCT -> path of a BPF object that drops PCT% of packets
  command -v clang >/dev/null || die "--loss without netem needs clang (a tc BPF filter)"
  local threshold
  threshold="$(awk -v p="$1" 'BEGIN { t = p / 100 * 4294967296; if (t > 4294967295) t = 4294967295; printf "%.0f", t }')"
  cat > "$kState/loss.c" <<EOF
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
static unsigned int (*prandom_u32)(void) = (void *)BPF_FUNC_get_prandom_u32;
__attribute__((section("classifier"), used)) int drop_some(struct __sk_buff *skb) {
  return prandom_u32() < ${threshold}u ? TC_ACT_SHOT : TC_ACT_OK;
}
char _license[] __attribute__((section("license"), used)) = "GPL";
EOF
  clang -O2 -target bpf -I"/usr/include/$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)" \
    -c "$kState/loss.c" -o "$kState/loss.o" || die "could not build the loss filter"
  echo "$kState/loss.o"
}

shape() {  # PROFILE LOSS_PCT
  local profile="$1" loss="$2" h netem=0 applied=() missing=()
  profile_of "$profile"
  if [ -n "$rate" ] || [ "$loss" != 0 ]; then have_netem && netem=1; fi
  for h in 0 1; do
    local on=(tc -n "$(ns "$h")" qdisc add dev "$(link "$h")" root)
    if [ "$netem" = 1 ]; then
      local args=()
      [ -n "$rate" ] && args+=(delay "${delay_ms}ms" rate "$rate" limit 100000)
      [ "$loss" != 0 ] && args+=(loss "${loss}%")
      [ ${#args[@]} -gt 0 ] && "${on[@]}" netem "${args[@]}"
    elif [ -n "$rate" ]; then
      "${on[@]}" tbf rate "$rate" burst "$(tbf_burst_bytes "$rate")" latency 20ms
    fi
  done
  if [ "$netem" = 1 ]; then
    [ -n "$rate" ] && applied+=("rate $rate and ${delay_ms} ms each way (netem)")
    [ "$loss" != 0 ] && applied+=("loss ${loss}% each way (netem)")
  else
    [ -n "$rate" ] && applied+=("rate $rate each way (tbf)") &&
      missing+=("delay ${delay_ms} ms each way: this kernel has no netem, so the RTT is the veth's own")
    if [ "$loss" != 0 ]; then
      local object
      object="$(build_loss_filter "$loss")"
      for h in 0 1; do
        tc -n "$(ns "$h")" qdisc add dev "$(link "$h")" clsact
        tc -n "$(ns "$h")" filter add dev "$(link "$h")" egress bpf direct-action obj "$object" sec classifier
      done
      applied+=("loss ${loss}% each way (tc BPF filter)")
    fi
  fi
  {
    echo "profile $profile: ${rate:-unshaped}${rtt_ms:+, ${rtt_ms} ms RTT}"
    for a in "${applied[@]}"; do echo "shaped: $a"; done
    for m in "${missing[@]}"; do echo "NOT shaped: $m"; done
  } > "$kState/profile"
  cat "$kState/profile"
}

up() {
  [ $# -ge 1 ] || usage
  local profile="$1" loss=0
  shift
  while [ $# -gt 0 ]; do
    case "$1" in
      --loss) [ $# -ge 2 ] || usage; loss="$2"; shift 2 ;;
      *) usage ;;
    esac
  done
  [[ "$loss" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--loss takes a percentage, got '$loss'"
  require_root
  profile_of "$profile"
  local left
  left="$(leftovers)"
  [ -z "$left" ] || die "left from an earlier run: $(echo "$left" | tr '\n' ' ')(run: bash $0 down)"
  [ ! -e "$kState" ] || die "state directory $kState exists from an earlier run (run: bash $0 down)"
  # A failure from here on (set -e) removes what was made.
  trap 'echo "cluster.sh: up failed, removing what it made" >&2; down' EXIT
  mkdir -p "$kState"
  [ -d /etc/netns ] || { mkdir /etc/netns && touch "$kState/made_etc_netns"; }
  local h
  for h in 0 1; do
    ip netns add "$(ns "$h")"
    mkdir "/etc/netns/$(ns "$h")"
    printf '127.0.0.1 localhost\n::1 localhost\n%s %s\n%s %s\n' "$(address 0)" "$(ns 0)" \
      "$(address 1)" "$(ns 1)" > "/etc/netns/$(ns "$h")/hosts"
  done
  ip link add "$(link 0)" type veth peer name "$(link 1)"
  for h in 0 1; do
    ip link set "$(link "$h")" netns "$(ns "$h")"
    ip -n "$(ns "$h")" addr add "$(address "$h")/24" dev "$(link "$h")"
    ip -n "$(ns "$h")" link set lo up
    ip -n "$(ns "$h")" link set "$(link "$h")" up
  done
  shape "$profile" "$loss"
  trap - EXIT
  echo "hosts: 0 = $(ns 0) at $(address 0), 1 = $(ns 1) at $(address 1)"
}

down() {
  require_root
  local h n
  for h in 0 1; do
    n="$(ns "$h")"
    if ip netns list | awk '{print $1}' | grep -qx "$n"; then
      # Deleting a namespace leaves its processes running, with a link that goes nowhere.
      local pids
      pids="$(ip netns pids "$n" || true)"
      if [ -n "$pids" ]; then
        # shellcheck disable=SC2086  # one pid a word
        kill -9 $pids 2>/dev/null || true
      fi
      ip netns del "$n"
    fi
  done
  # A veth end still in this namespace (up failed before moving it); its peer goes with it.
  for h in 0 1; do
    if ip link show "$(link "$h")" >/dev/null 2>&1; then ip link del "$(link "$h")"; fi
    rm -rf "/etc/netns/$(ns "$h")"
  done
  if [ -f "$kState/made_etc_netns" ]; then rmdir /etc/netns 2>/dev/null || true; fi
  rm -rf "$kState"
  local left
  left="$(leftovers)"
  [ -z "$left" ] || die "could not remove: $(echo "$left" | tr '\n' ' ')"
}

require_up() {
  ip netns list | awk '{print $1}' | grep -qx "$(ns 0)" || die "the cluster is not up (run: bash $0 up PROFILE)"
}

exec_on() {
  [ $# -ge 2 ] || usage
  require_root
  require_up
  local h
  h="$(host_index "$1")"
  shift
  # shellcheck disable=SC2016  # for the inner sh
  exec ip netns exec "$(ns "$h")" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$(ns "$h")" "$@"
}

status() {
  require_root
  local left
  left="$(leftovers)"
  if [ -z "$left" ]; then
    echo "down: no namespace or link of ours"
    return
  fi
  [ -f "$kState/profile" ] && cat "$kState/profile"
  local h n
  for h in 0 1; do
    n="$(ns "$h")"
    echo "== host $h: namespace $n"
    ip -n "$n" -br addr show 2>/dev/null || echo "(no namespace $n)"
    tc -n "$n" -s qdisc show dev "$(link "$h")" 2>/dev/null || true
    tc -n "$n" filter show dev "$(link "$h")" egress 2>/dev/null || true
    echo "processes: $(ip netns pids "$n" 2>/dev/null | tr '\n' ' ')"
  done
}

probe() {
  require_root
  require_up
  local seconds="${1:-3}" python
  python="${PYTHON:-$here/../../.venv/bin/python3}"
  [ -x "$python" ] || python=python3
  ip netns exec "$(ns 1)" "$python" "$here/link_probe.py" serve "$(address 1)" &
  local server=$!
  sleep 0.5
  ip netns exec "$(ns 0)" "$python" "$here/link_probe.py" measure "$(address 1)" "$seconds" || true
  wait "$server" || true
}

with_cluster() {
  [ $# -ge 1 ] || usage
  local args=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    args+=("$1")
    shift
  done
  [ "${1:-}" = "--" ] || usage
  shift
  [ $# -ge 1 ] || usage
  up "${args[@]}"
  trap 'down' EXIT
  trap 'exit 130' INT TERM
  "$@"
}

[ $# -ge 1 ] || usage
command="$1"
shift
case "$command" in
  up) up "$@" ;;
  down) down ;;
  exec) exec_on "$@" ;;
  with) with_cluster "$@" ;;
  status) status ;;
  probe) probe "$@" ;;
  *) usage ;;
esac
