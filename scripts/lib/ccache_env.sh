# Sourced by every script that compiles (run.sh, sanitize.sh, check_example.sh, the fuzz build,
# bench/gpu/run.sh): routes the compilers through Debian's ccache when it is installed.
#
# [Note: one compiler cache for every clone]
# CI builds a fresh clone in a new folder each time, twice (normal and ASan). With
# CCACHE_BASEDIR set to the clone's root (by ccache_launcher.sh, so that every build through it
# gets the same settings, however it was started), ccache rewrites the absolute paths under it to
# relative ones before hashing, so a clone in another folder hits the objects an earlier clone
# compiled. CCACHE_NOHASHDIR keeps the working directory out of the hash for builds with -g
# (RelWithDebInfo, ASan); their debug info then names paths relative to the build folder,
# which is what a sanitizer report prints anyway. The cache itself lives in ccache's default
# place (~/.cache/ccache) unless CCACHE_DIR says otherwise, shared by all clones of one user.
# The precompiled header needs a launcher of its own: see ccache_launcher.sh's
# [Note: precompiled headers in the compiler cache]; the launcher's sloppiness is what ccache's
# manual asks for precompiled headers (-include'd, so no #define in a source can change them)
# and for headers made during the build.
#
# Usage: . scripts/lib/ccache_env.sh
# Sets CMAKE_C_COMPILER_LAUNCHER / CMAKE_CXX_COMPILER_LAUNCHER (CMake reads them from the
# environment on first configure) and FSDP_CCACHE to the launcher, or leaves both unset with no ccache.
# FSDP_NO_CCACHE=1 turns it off.
if [ "${FSDP_NO_CCACHE:-0}" != 1 ] && command -v ccache >/dev/null 2>&1; then
  FSDP_CCACHE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/ccache_launcher.sh"
  export FSDP_CCACHE
  export CMAKE_C_COMPILER_LAUNCHER="$FSDP_CCACHE"
  export CMAKE_CXX_COMPILER_LAUNCHER="$FSDP_CCACHE"
else
  unset CMAKE_C_COMPILER_LAUNCHER CMAKE_CXX_COMPILER_LAUNCHER FSDP_CCACHE
fi
