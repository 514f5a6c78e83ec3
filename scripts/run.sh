#!/usr/bin/env bash
# One entry point, for a new user on a fresh Debian 12 machine and for CI alike:
#   bash scripts/run.sh train [fsdp-train flags...]   set up, build fsdp-train only, train
#   bash scripts/run.sh test  [ctest flags...]        set up, build everything, run every test
#   bash scripts/run.sh build                         set up, build everything
#
# Set-up installs only what is missing:
# - Debian packages (apt-get, as root or through sudo);
# - the project's own Python environment, .venv inside the clone, with PyTorch's 2.11 wheel
#   (its LibTorch is what we build against) from scripts/requirements.txt, and for `test` also
#   the reference packages the tests compare with (scripts/requirements-test.txt).
# The machine's python3 only creates .venv: a torch it may have is never used, so every run,
# CI's included, takes the path a new user takes. pip's cache is used as usual.
#
# Environment: FSDP_TORCH_PREFIX=DIR builds against another LibTorch (or a PyTorch cmake
# prefix); FSDP_SKIP_INSTALL=1 installs nothing (the environment must be complete already).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

mode="${1:-}"
shift || true
case "$mode" in train|test|build) ;; *) echo "usage: $0 train|test|build [args...]" >&2; exit 2 ;; esac

DEBIAN_PACKAGES=(cmake g++ make python3 python3-venv python3-pip libgtest-dev libgmock-dev
                 libbenchmark-dev libgloo-dev libcli11-dev nlohmann-json3-dev libxxhash-dev time
                 libpcre2-dev libutf8proc-dev libtomlplusplus-dev fortunes libopenmpi-dev openmpi-bin
                 ccache libjemalloc-dev)
VENV="$ROOT/.venv"
PYTHON="$VENV/bin/python3"   # absolute: tests run from build/ and are handed this path

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

install_debian_packages() {
  local missing=()
  for p in "${DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes \
      apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# Installs requirement files into .venv unless the same files were installed before (a stamp
# in .venv holds their checksum), so a set-up run costs nothing the second time.
install_python_requirements() {
  local files=("$@") stamp="$VENV/.fsdp-requirements" sum
  sum="$(cat "${files[@]/#/scripts/}" | sha256sum | cut -d' ' -f1)"
  if [ -f "$stamp" ] && grep -qx "$sum" "$stamp"; then return; fi
  if [ ! -x "$PYTHON" ]; then
    echo "== creating the project's Python environment in .venv"
    python3 -m venv "$VENV"
    "$PYTHON" -m pip install -q --disable-pip-version-check --upgrade pip
  fi
  echo "== installing into .venv: $(cat "${files[@]/#/scripts/}" | grep -v '^#' | tr '\n' ' ')"
  "$PYTHON" -m pip install -q --disable-pip-version-check "${files[@]/#/-rscripts/}"
  echo "$sum" >> "$stamp"
}

requirements=(requirements.txt)
[ "$mode" = train ] || requirements+=(requirements-test.txt)
if [ "${FSDP_SKIP_INSTALL:-0}" != 1 ]; then
  install_debian_packages
  install_python_requirements "${requirements[@]}"
fi
if [ -n "${FSDP_TORCH_PREFIX:-}" ]; then
  prefix="$FSDP_TORCH_PREFIX"
else
  prefix="$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
fi

# The compiler cache, shared by every clone: see [Note: one compiler cache for every clone].
. scripts/lib/ccache_env.sh
# Without the cache, a .gch.sum left from a build with it would vouch for a newer .gch.
[ -n "${FSDP_CCACHE:-}" ] || find build -name '*.gch.sum' -delete 2>/dev/null || true
echo "== building (LibTorch from $prefix${FSDP_CCACHE:+, through ccache})"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CXX_COMPILER_LAUNCHER="${FSDP_CCACHE:-}" -DCMAKE_C_COMPILER_LAUNCHER="${FSDP_CCACHE:-}" \
  -DFSDP_PYTHON="$PYTHON" >/dev/null
if [ "$mode" = train ]; then
  cmake --build build -j"$(nproc)" --target fsdp-train
else
  cmake --build build -j"$(nproc)"
fi

export FSDP_PYTHON="$PYTHON"
case "$mode" in
  train) exec ./build/fsdp-train "$@" ;;
  test)
    cd build
    # A failure's output scrolls far up a 400-test log: on failure, run the failed tests once
    # more, alone, so the end of the log shows their messages and whether they fail again. The
    # exit status stays the first run's.
    status=0
    ctest --output-on-failure -j"$(nproc)" "$@" || status=$?
    if [ "$status" -ne 0 ]; then
      echo "== the failed tests again, one at a time, with their output"
      ctest --rerun-failed --output-on-failure "$@" || true
    fi
    exit "$status" ;;
  build) ;;
esac
