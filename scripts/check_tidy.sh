#!/usr/bin/env bash
# clang-tidy, with the checked-in .clang-tidy, on the sources that need no LibTorch headers
# (the data library and fsdp-tokenize; LibTorch's headers make a file take minutes, not
# seconds). Any finding fails. Needs build/compile_commands.json (scripts/run.sh build).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-tidy >/dev/null; then
  echo "== installing clang-tidy"
  if [ "$(id -u)" = 0 ]; then apt-get install -y -qq clang-tidy >/dev/null; else sudo apt-get install -y -qq clang-tidy >/dev/null; fi
fi
files=(src/data/*.cpp tools/fsdp_tokenize/main.cpp)
found=0
for f in "${files[@]}"; do
  out="$(clang-tidy -p build --quiet "$f" 2>&1 | grep -E "(warning|error):" || true)"
  if [ -n "$out" ]; then echo "$out"; found=1; fi
done
[ "$found" = 0 ] || { echo "check_tidy: findings above"; exit 1; }
echo "check_tidy: ${#files[@]} files, no findings"
