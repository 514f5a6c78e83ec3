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
# and the contents of every header the .d file says the .gch was built from. Two .gch files with
# equal sums were built from the same inputs by the same compiler, so either serves.
set -uo pipefail
ccache "$@" || exit $?
out="" dep="" prev=""
for a in "$@"; do
  case "$prev" in -o) out="$a" ;; -MF) dep="$a" ;; esac
  prev="$a"
done
case "$out" in *.gch) ;; *) exit 0 ;; esac
[ -f "$dep" ] || { echo "ccache_launcher: $out was built without a dependency file (-MF)" >&2; exit 1; }
base="${CCACHE_BASEDIR:-/nonexistent}"
{
  compiler="$(command -v "$1")"
  "$compiler" --version | head -1
  for a in "${@:2}"; do printf '%s\n' "${a//$base/.}"; done
  # The .d file: "target: dep dep \" lines; every dep's content, in order. CMake's generated
  # header #includes src/pch.h by its absolute path: made relative like the command line.
  sed -e 's/^[^:]*://' -e 's/\\$//' "$dep" | tr ' ' '\n' | sed '/^$/d' | tr '\n' '\0' |
    xargs -0 cat | sed "s|$base|.|g"
} | sha256sum | cut -d' ' -f1 > "$out.sum"
