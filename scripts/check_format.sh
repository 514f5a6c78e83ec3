#!/usr/bin/env bash
# Fails, listing them, if any tracked C++ file differs from what clang-format (with the
# checked-in .clang-format) makes of it. Fix with: clang-format -i FILE...
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "== installing clang-format"
  if [ "$(id -u)" = 0 ]; then apt-get install -y -qq clang-format >/dev/null; else sudo apt-get install -y -qq clang-format >/dev/null; fi
fi
bad=()
while IFS= read -r f; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
if [ ${#bad[@]} -gt 0 ]; then
  printf 'check_format: not clang-format clean: %s\n' "${bad[@]}"
  exit 1
fi
echo "check_format: $(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | wc -l) files clang-format clean"
