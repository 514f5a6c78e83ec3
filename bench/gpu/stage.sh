#!/usr/bin/env bash
# Stages what the GPU machine lacks for the build, on a machine where apt works (this one, CI):
#
#   bash bench/gpu/stage.sh        (bench/gpu/rehearse.sh runs it first)
#
# Fills .gpu-stage/ (git-ignored; the device tool carries it beside the tree) with the Debian
# packages of bench/gpu/packages.txt, fetched with `apt-get download` at this machine's
# candidate versions and checked against apt's SHA256, plus MANIFEST.tsv (package, version,
# file, bytes, sha256). bench/gpu/run.sh unpacks them with dpkg -x into a private prefix.
# Nothing else goes there: the GPU image has python3 with torch 2.11.0+cu130, nvcc 13.0,
# CMake, ninja and (as nvcc needs one) a host C++ compiler with the C and C++ headers.
#
# [Note: what is staged, and why no runtime libraries]
# Headers and static archives only, so the build leaves no shared library behind that the GPU
# machine would have to find at run time:
# - gloo (declarations only; its symbols come from libtorch_cpu), CLI11, nlohmann-json, toml++
#   (compiled header-only): headers;
# - xxhash, PCRE2, utf8proc: headers and the .a archives, linked statically (C code: they
#   call nothing of libstdc++, and of glibc only symbols older than the floor checked below);
# - GoogleTest and GoogleMock as source (Debian's `googletest`), built by run.sh with the GPU
#   machine's own compiler: Debian's libgtest.a is C++ built by GCC 12 against glibc 2.36, and
#   would not link against an older libstdc++ or glibc.
# Google Benchmark and MPI are not staged: run.sh builds no benchmark target and no mpi backend.
#
# [Note: the glibc floor]
# The GPU machine's distribution is unknown; that it runs torch 2.11's manylinux_2_28 wheel
# tells us its glibc is 2.28 or newer. The check below lists the undefined symbols of every
# staged archive, looks each up in this machine's libc.so.6/libm.so.6 (Debian 12, glibc 2.36)
# for the version that introduced it, and refuses a package that needs a glibc newer than
# GLIBC_FLOOR (2.28).
#
# Downloads are kept in FSDP_STAGE_CACHE (default ~/.cache/fsdp/gpu-stage), so that a second run,
# or CI's next one, fetches nothing. Fails, naming the package, when apt cannot fetch one, when a
# file's checksum differs from apt's, or when .gpu-stage would exceed STAGE_LIMIT_MIB (48).
set -euo pipefail
export LC_ALL=C  # sort and join must agree on one collation
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
STAGE="$ROOT/.gpu-stage"
PACKAGE_LIST="$ROOT/bench/gpu/packages.txt"
CACHE="${FSDP_STAGE_CACHE:-$HOME/.cache/fsdp/gpu-stage}"
STAGE_LIMIT_MIB="${STAGE_LIMIT_MIB:-48}"
GLIBC_FLOOR="${GLIBC_FLOOR:-2.28}"

mapfile -t PACKAGES < <(sed 's/#.*//' "$PACKAGE_LIST" | awk 'NF { print $1 }')

die() {
  echo "stage.sh: $*" >&2
  exit 1
}

# APT_RECORDS: "package version filename sha256" of each package's candidate version, from one
# apt-cache call (each costs half a second).
apt_records() {
  apt-cache show --no-all-versions "${PACKAGES[@]}" 2> /dev/null | awk '
    /^Package: / { p = $2 } /^Version: / { v = $2 } /^Filename: / { f = $2 }
    /^SHA256: / { print p, v, f, $2 }'
}

# Puts a package's .deb (its apt record: package version filename sha256) in the cache unless
# it is there with the right checksum; prints its path.
fetch() {
  local pkg="$1" version="$2" file sha="$4" path
  file="$(basename "$3")"
  path="$CACHE/$file"
  if [ ! -f "$path" ] || [ "$(sha256sum < "$path" | cut -d' ' -f1)" != "$sha" ]; then
    rm -f "$path"
    (cd "$CACHE" && apt-get download -q -o APT::Sandbox::User=root "$pkg=$version" > /dev/null) \
      || die "apt-get download $pkg=$version failed"
    [ -f "$path" ] || die "apt-get download $pkg=$version wrote no $file"
    [ "$(sha256sum < "$path" | cut -d' ' -f1)" = "$sha" ] \
      || die "$file: SHA256 differs from apt's record ($sha)"
  fi
  echo "$path"
}

# LIBC_VERSIONS: every symbol of this machine's libc.so.6 and libm.so.6 with the glibc version
# a new link binds it to (its default version, unparenthesized in objdump -T), sorted for join.
LIBC_VERSIONS="$(mktemp)"
trap 'rm -f "$LIBC_VERSIONS"' EXIT
objdump -T /lib/x86_64-linux-gnu/libc.so.6 /lib/x86_64-linux-gnu/libm.so.6 \
  | awk 'NF > 2 && $(NF-1) ~ /^GLIBC_/ && !/\*UND\*/ { v = $(NF-1); sub(/GLIBC_/, "", v); print $NF, v }' \
  | sort -k1,1 -u > "$LIBC_VERSIONS"

# The newest glibc version (as "2.34") that the undefined symbols of the archives under DIR
# need, with the symbol: "2.34 pthread_key_create"; "0 -" with no archive.
glibc_needed() {
  find "$1" -name '*.a' -print0 | xargs -0 -r nm -u --format=posix 2> /dev/null \
    | awk 'NF { print $1 }' | sort -u | join - "$LIBC_VERSIONS" | awk '{ print $2, $1 }' \
    | sort -V | tail -1 | grep . || echo "0 -"
}

# Refuses a package whose archives need a glibc newer than GLIBC_FLOOR; prints what they need.
check_glibc() {
  local deb="$1" dir needed
  dir="$(mktemp -d)"
  dpkg-deb -x "$deb" "$dir"
  needed="$(glibc_needed "$dir")"
  rm -rf "$dir"
  if [ "$(printf '%s\n%s\n' "${needed%% *}" "$GLIBC_FLOOR" | sort -V | tail -1)" != "$GLIBC_FLOOR" ]; then
    die "$(basename "$deb") needs glibc ${needed} (newer than the floor $GLIBC_FLOOR: see [Note: the glibc floor])"
  fi
  echo "$needed"
}

main() {
  mkdir -p "$CACHE" "$STAGE"
  rm -f "$STAGE"/*.deb
  local records pkg record deb needed
  records="$(apt_records)"
  printf 'package\tversion\tfile\tbytes\tsha256\tglibc_needed\n' > "$STAGE/MANIFEST.tsv.new"
  for pkg in "${PACKAGES[@]}"; do
    record="$(awk -v p="$pkg" '$1 == p' <<< "$records" | head -1)"
    [ -n "$record" ] || die "apt knows no package '$pkg' (run apt-get update, or fix $PACKAGE_LIST)"
    # shellcheck disable=SC2086  # the record's four words are fetch's four arguments
    deb="$(fetch $record)"
    needed="$(check_glibc "$deb")"
    cp "$deb" "$STAGE/"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$pkg" "$(cut -d' ' -f2 <<< "$record")" \
      "$(basename "$deb")" "$(stat -c %s "$deb")" "$(cut -d' ' -f4 <<< "$record")" "$needed" \
      >> "$STAGE/MANIFEST.tsv.new"
  done
  mv "$STAGE/MANIFEST.tsv.new" "$STAGE/MANIFEST.tsv"
  local bytes
  bytes="$(du -sb "$STAGE" | cut -f1)"
  [ "$bytes" -le $((STAGE_LIMIT_MIB * 1024 * 1024)) ] \
    || die ".gpu-stage holds $bytes bytes, over the limit of $STAGE_LIMIT_MIB MiB"
  echo "stage.sh: ${#PACKAGES[@]} packages, $bytes bytes in $STAGE (glibc floor $GLIBC_FLOOR met)"
}

main
