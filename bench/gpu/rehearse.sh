#!/usr/bin/env bash
# Rehearses, here, the GPU machine's offline build, and so proves that .gpu-stage/ holds all it
# needs (CI runs this; as root, on Debian):
#
#   bash bench/gpu/rehearse.sh [OUT]          (OUT: default /tmp/fsdp-gpu-rehearsal/out)
#
# 1. bench/gpu/stage.sh fills .gpu-stage/ (the only step that uses the network);
# 2. the tree is copied as the device tool carries it: tracked and untracked, not ignored
#    files, plus .gpu-stage/; no .venv, no build folder (REHEARSAL_DIR/tree, emptied first);
# 3. in new mount and network namespaces (unshare -m -n), so with no network at all, and with
#    every installed -dev package's files hidden (whiteouts in an overlay on /usr), except the
#    C and C++ toolchain's own (g++'s -dev dependencies: libc6-dev, libstdc++-N-dev, ...), which
#    the GPU machine's compiler has too: bash bench/gpu/run.sh OUT --only build, with a python3
#    on PATH that has torch (REHEARSAL_PYTHON, default the clone's .venv/bin/python3; a venv is
#    seen at REHEARSAL_DIR/python, see the note below) and without ~/.pyenv's. The build's time
#    limit is REHEARSAL_LIMIT_S (3600 s: this machine has 2 cores, the GPU machine 16);
# 4. prints the build's wall time and what the compiler cache did.
# Exit status: run.sh's (0: the build passed). OUT holds run.sh's files (summary.md first).
#
# [Note: the rehearsal compiler cache]
# run.sh builds through ccache when the machine has it (scripts/lib/ccache_env.sh), with the
# copy's root as ccache's base directory, so paths inside the copy are hashed relative to it.
# The one path outside it is LibTorch's, in the python's site-packages: a venv (CI's is in a new
# clone folder every time) is therefore bind-mounted at the fixed REHEARSAL_DIR/python inside
# the sandbox, so that LibTorch's include paths, too, read the same in every rehearsal. A second
# rehearsal, or CI's next, then compiles nothing that did not change. The GPU machine has no
# ccache and builds cold.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
REHEARSAL_DIR="${REHEARSAL_DIR:-/tmp/fsdp-gpu-rehearsal}"
TREE="$REHEARSAL_DIR/tree"
OUT="$(realpath -m "${1:-$REHEARSAL_DIR/out}")"
PYTHON_WITH_TORCH="${REHEARSAL_PYTHON:-$ROOT/.venv/bin/python3}"
LIMIT_S="${REHEARSAL_LIMIT_S:-3600}"

die() {
  echo "rehearse.sh: $*" >&2
  exit 1
}

[ "$(id -u)" = 0 ] || die "needs root (for unshare -m -n and the overlay on /usr)"
"$PYTHON_WITH_TORCH" -c 'import torch' 2> /dev/null \
  || die "$PYTHON_WITH_TORCH cannot import torch (set REHEARSAL_PYTHON)"

# copy_tree: the files the device tool carries (git's view of the tree, .venv* left out: a
# symlink to an environment is no part of what a GPU machine gets), and .gpu-stage/.
copy_tree() {
  rm -rf "$TREE"
  mkdir -p "$TREE"
  (cd "$ROOT" && git ls-files -z -c -o --exclude-standard | grep -zv '^\.venv' \
    | tar --null -T - -cf -) | tar -xf - -C "$TREE"
  cp -a "$ROOT/.gpu-stage" "$TREE/"
}

# hidden_files: the files of every installed -dev package but the toolchain's, under /usr (merged
# /usr: /lib/... is /usr/lib/...), relative to /usr, one per line.
hidden_files() {
  local toolchain packages
  toolchain="$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances g++ 2> /dev/null | grep '^[a-z0-9].*-dev$' | sort -u)"
  packages="$(dpkg-query -W -f='${Package}\n' | grep -- '-dev$' | sort -u | comm -23 - <(echo "$toolchain"))"
  # shellcheck disable=SC2086  # one package per word
  dpkg -L $packages 2> /dev/null | sed -E 's#^/(lib|lib64|bin|sbin)/#/usr/\1/#' | grep '^/usr/' \
    | while IFS= read -r f; do
      if [ -L "$f" ] || { [ -f "$f" ] && [ ! -d "$f" ]; }; then echo "${f#/usr/}"; fi
    done | sort -u
}

# The sandbox, as a script for unshare (its arguments: below), expanded there, not here.
# shellcheck disable=SC2016
SANDBOX_SCRIPT='
set -euo pipefail
hide="$1" scratch="$2" python="$3" tree="$4" out="$5" fixed_venv="$6" limit="$7"
mount -t tmpfs tmpfs "$scratch"
mkdir -p "$scratch/upper" "$scratch/work" "$scratch/bin"
"$python" - "$hide" "$scratch/upper" << "EOF"
import os, stat, sys
# An overlay whiteout (a 0/0 character device in the upper layer) for each file to hide.
with open(sys.argv[1]) as f:
    for rel in f.read().split("\n"):
        if rel:
            path = os.path.join(sys.argv[2], rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(0, 0))
EOF
mount -t overlay overlay -o "lowerdir=/usr,upperdir=$scratch/upper,workdir=$scratch/work" /usr
venv="$(dirname "$(dirname "$python")")"
if [ -f "$venv/pyvenv.cfg" ]; then  # see [Note: the rehearsal compiler cache]
  mount --bind "$(realpath "$venv")" "$fixed_venv"
  python="$fixed_venv/bin/$(basename "$python")"
fi
printf "#!/bin/sh\nexec %s \"\$@\"\n" "$python" > "$scratch/bin/python3"
chmod +x "$scratch/bin/python3"
export PATH="$scratch/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The premises, checked: no network, the -dev files gone, python3 has torch.
if timeout 5 bash -c "exec 3<>/dev/tcp/deb.debian.org/80" 2> /dev/null; then
  echo "sandbox: the network is reachable" >&2; exit 1
fi
for f in include/xxhash.h include/gloo/rendezvous/store.h include/nlohmann/json.hpp include/CLI/CLI.hpp; do
  [ ! -e "/usr/$f" ] || { echo "sandbox: /usr/$f is still there" >&2; exit 1; }
done
echo "sandbox: no network, $(wc -l < "$hide") files of -dev packages hidden, python3 = $python"
cd "$tree"
BUDGET_S="$limit" LIMIT_BUILD="$limit" exec bash bench/gpu/run.sh "$out" --only build
'

ccache_stats() { ccache --print-stats 2> /dev/null | awk '$1 ~ /^(direct_cache_hit|preprocessed_cache_hit|cache_miss|could_not_use_precompiled_header)$/ { print $1 "=" $2 }' | tr '\n' ' '; }

main() {
  local start
  start="$(date +%s)"
  bash "$ROOT/bench/gpu/stage.sh"
  local staged=$(($(date +%s) - start))
  copy_tree
  mkdir -p "$REHEARSAL_DIR/sandbox" "$REHEARSAL_DIR/python" "$OUT"
  hidden_files > "$REHEARSAL_DIR/hidden.txt"
  local before after rc=0 built
  before="$(ccache_stats)"
  built="$(date +%s)"
  unshare -m -n --propagation private bash -c "$SANDBOX_SCRIPT" sandbox \
    "$REHEARSAL_DIR/hidden.txt" "$REHEARSAL_DIR/sandbox" "$PYTHON_WITH_TORCH" "$TREE" "$OUT" \
    "$REHEARSAL_DIR/python" "$LIMIT_S" || rc=$?
  after="$(ccache_stats)"
  echo "rehearse.sh: stage ${staged} s, offline build $(($(date +%s) - built)) s, total $(($(date +%s) - start)) s; exit $rc; $OUT/summary.md"
  echo "rehearse.sh: ccache before: ${before:-none}"
  echo "rehearse.sh: ccache after:  ${after:-none}"
  return "$rc"
}

main
