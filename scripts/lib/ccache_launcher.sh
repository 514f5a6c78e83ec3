#!/usr/bin/env bash
# CMake's compiler launcher when ccache is on (scripts/lib/ccache_env.sh sets it): compiles
# through ccache, and after compiling a precompiled header (-o X.gch) writes X.gch.sum.
#
# [Note: precompiled headers in the compiler cache]
# Every target reuses fsdp_util's precompiled header (src/pch.h: LibTorch's headers), which
# halves a cold build. ccache hashes a .gch like any included file, but GCC's .gch is a dump of
# the compiler's memory, different bytes on every build: a clone in another folder would miss
# on every source file that uses it. With sloppiness pch_external_checksum ccache hashes
# X.gch.sum instead, if it exists. This script writes it from what determines the .gch:
# the compiler, the command line with the clone's root made relative (as CCACHE_BASEDIR does),
# and the contents of every header the .d file says the .gch was built from (the clone's root
# made relative in them too: CMake's generated header names src/pch.h by its absolute path). Two
# .gch files with equal sums were built from the same inputs by the same compiler, so either
# serves. (scripts/run.sh deletes the sums when it builds without the cache, so a .gch rebuilt
# then cannot inherit an old sum.)
set -uo pipefail
# ccache's settings come from here, not only from the script that configured the build: a
# `make` run by hand in build/ (the edit loop) compiles through this launcher too, and without
# them its objects were stored under absolute paths, a hit for no other clone (CI's build of the
# same commit missed 137 of 230 objects, stop 36). See ccache_env.sh's
# [Note: one compiler cache for every clone].
CCACHE_BASEDIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export CCACHE_BASEDIR CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-8G}"
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime,pch_external_checksum
ccache "$@" || exit $?
out="" dep="" prev=""
for a in "$@"; do
  case "$prev" in -o) out="$a" ;; -MF) dep="$a" ;; esac
  prev="$a"
done
case "$out" in *.gch) ;; *) exit 0 ;; esac
[ -f "$dep" ] || { echo "ccache_launcher: $out was built without a dependency file (-MF)" >&2; exit 1; }
# The sum (Python: reading ~5,000 headers in one process): the compiler's version, the command
# line, and the set of the headers' contents. A set, not a list: GCC's dependency file leaves out
# a header whose twin (same bytes, same size and time: torch ships two python_stub.h) it already
# read under #pragma once, and which twin it keeps differs between two installs of one wheel.
python3 - "$CCACHE_BASEDIR" "$dep" "$(command -v "$1")" "${@:2}" > "$out.sum" <<'PY'
import hashlib, subprocess, sys
base, dep, compiler, args = sys.argv[1].encode(), sys.argv[2], sys.argv[3], sys.argv[4:]
text = open(dep).read().replace("\\\n", " ")
headers = text.split(":", 1)[1].split()
contents = {hashlib.sha256(open(h, "rb").read().replace(base, b".")).hexdigest() for h in headers}
total = hashlib.sha256()
total.update(subprocess.run([compiler, "--version"], capture_output=True).stdout.splitlines()[0])
for a in args:
    total.update(a.encode().replace(base, b".") + b"\0")
for c in sorted(contents):
    total.update(c.encode())
print(total.hexdigest())
PY
