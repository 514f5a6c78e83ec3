#!/usr/bin/env bash
# The Debian package, checked as a user gets it. cpack makes fsdp_<version>_<arch>.deb from the
# tree as built (its install rules only: no rebuild; cmake/packaging.cmake); dpkg-deb must show
# its control fields and the programs, a header and the CMake package among its files; dpkg -x
# unpacks it (no root, no dpkg -i) into build/package/root, whose files must carry no
# RPATH/RUNPATH and no path into this clone; then scripts/check_example.sh builds and runs
# the examples (examples/minimal, examples/pretrain_llama) against its usr/, exactly as against `cmake --install`'s prefix. Needs a
# build (scripts/run.sh). The unpacked tree and the example's build stay at fixed paths in
# build/, so that the compiler cache hits on a rerun.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() {
  echo "check_package: $*" >&2
  exit 1
}

version="$(sed -n 's/^project(fsdp VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)"
arch="$(dpkg --print-architecture)"
deb="build/fsdp_${version}_${arch}.deb"
rm -f "$deb"
# cpack's log is kept, and shown with the package's listing and the free space when a check
# fails: CI once saw a package without bin/fsdp-estimate that no rerun here reproduced.
cpack_log=build/check_package_cpack.log
(cd build && cpack -G DEB) >"$cpack_log" 2>&1 || fail "cpack failed:
$(cat "$cpack_log")"
[ -f "$deb" ] || fail "cpack made no $deb:
$(cat "$cpack_log")"

info="$(dpkg-deb --info "$deb")"
for field in "Package: fsdp" "Version: $version" "Architecture: $arch" "Section: devel" \
  "Maintainer: " "Depends: .*libc6" "Depends: .*libxxhash-dev" "Description: " " .*torch/lib"; do
  grep -q "^ $field" <<< "$info" || fail "dpkg-deb --info $deb has no '$field':
$info"
done
listing="$(dpkg-deb --contents "$deb")"
contents="$(awk '{print $NF}' <<< "$listing")"
for f in bin/fsdp-train bin/fsdp-estimate bin/fsdp-plan bin/fsdp-tokenize bin/fsdp-comm-bench \
  include/fsdp/fully_shard.h include/fsdp/models/model.h include/fsdp/train/data_loader.h \
  lib/libfsdp_comm.a lib/libfsdp_models.a lib/libfsdp_train.a lib/cmake/fsdp/fsdpConfig.cmake \
  lib/cmake/fsdp/fsdpTargets.cmake share/fsdp/hardware/h100_sxm.json; do
  grep -qx "\./usr/$f" <<< "$contents" || fail "$deb holds no /usr/$f; it holds:
$listing
cpack's log:
$(cat "$cpack_log")
the staged tree's bin/: $(ls -l build/_CPack_Packages/*/DEB/*/usr/bin 2>&1)
free space: $(df -h build | tail -1)"
done

root=build/package/root
rm -rf "$root"
mkdir -p "$root"
dpkg -x "$deb" "$root"
# The build tree's RPATH names this clone's .venv; an installed file must not keep it.
while IFS= read -r f; do
  [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
  ! readelf -d "$f" | grep -E 'R(UN)?PATH' || fail "$f has an RPATH/RUNPATH"
done < <(find "$root" -type f)
! grep -rl "$PWD" "$root/usr/lib/cmake" "$root/usr/include" || fail "these files name $PWD"

bash scripts/check_example.sh "$root/usr" build/package/example
echo "check_package: $deb ($(du -h "$deb" | cut -f1)): fields, contents, no RPATH; the examples built and run against it"
