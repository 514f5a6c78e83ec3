#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine:
#   bash scripts/run.sh train [fsdp-train flags...]   install, build, run the trainer
#   bash scripts/run.sh test  [ctest flags...]        install, build, run every test
# Installs only what is missing: Debian packages, then PyTorch's 2.11 wheel (whose LibTorch we
# build against) unless python3 already has it. Set FSDP_TORCH_PREFIX to a LibTorch (or a
# PyTorch cmake prefix) to build against your own instead; set FSDP_SKIP_INSTALL=1 to skip
# installing anything.
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
shift || true
case "$mode" in train|test|build) ;; *) echo "usage: $0 train|test|build [args...]" >&2; exit 2 ;; esac

TORCH_VERSION=2.11.0
DEBIAN_PACKAGES=(cmake g++ make python3 python3-venv python3-pip libgtest-dev libgmock-dev
                 libbenchmark-dev libgloo-dev libcli11-dev nlohmann-json3-dev libxxhash-dev time
                 libpcre2-dev fortunes)

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

install_debian_packages() {
  local missing=()
  for p in "${DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

has_torch() {
  "$1" -c "import torch,sys; sys.exit(0 if torch.__version__.split('+')[0]=='$TORCH_VERSION' else 1)" 2>/dev/null
}

# Picks a python3 with torch==$TORCH_VERSION, installing the wheel into .venv if needed.
find_python() {
  if has_torch python3; then PYTHON=python3; return; fi
  if [ -x .venv/bin/python3 ] && has_torch .venv/bin/python3; then PYTHON=.venv/bin/python3; return; fi
  echo "== installing PyTorch $TORCH_VERSION into .venv (LibTorch comes from its wheel)"
  python3 -m venv .venv
  .venv/bin/python3 -m pip install -q --upgrade pip
  .venv/bin/python3 -m pip install -q "torch==$TORCH_VERSION"
  PYTHON=.venv/bin/python3
}

if [ "${FSDP_SKIP_INSTALL:-0}" != 1 ]; then install_debian_packages; fi
if [ -n "${FSDP_TORCH_PREFIX:-}" ]; then
  prefix="$FSDP_TORCH_PREFIX"
else
  if [ "${FSDP_SKIP_INSTALL:-0}" = 1 ]; then PYTHON=python3; else find_python; fi
  prefix="$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
fi

echo "== building (LibTorch from $prefix)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build -j"$(nproc)"

# The checkpoint interop test loads our export with transformers (tests/checkpoint/hf_interop.py),
# in the python that has our torch; it fails, saying so, when they are missing. The tokenizer
# differential test (tests/data/tokenizer_reference.py) needs tokenizers in the same python.
if [ "$mode" = test ]; then
  PYTHON="${PYTHON:-python3}"
  if [ "${FSDP_SKIP_INSTALL:-0}" != 1 ] && ! "$PYTHON" -c "import transformers, safetensors, tokenizers" 2>/dev/null; then
    echo "== installing transformers, safetensors and tokenizers into $PYTHON (checkpoint interop and tokenizer tests)"
    "$PYTHON" -m pip install -q "transformers==5.23.0" "safetensors==0.8.0" "tokenizers==0.23.3"
  fi
  FSDP_TOKENIZERS_PYTHON="$(cd "$(dirname "$(command -v "$PYTHON")")" && pwd)/$(basename "$PYTHON")"
  export FSDP_TOKENIZERS_PYTHON
  export FSDP_PYTHON="$PYTHON"
fi

case "$mode" in
  train) exec ./build/fsdp-train "$@" ;;
  test) cd build && exec ctest --output-on-failure -j"$(nproc)" "$@" ;;
  build) ;;
esac
