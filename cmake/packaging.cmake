# The Debian package: `cd build && cpack` (CPACK_GENERATOR is DEB) writes
# fsdp_<version>_<arch>.deb with exactly what `cmake --install` installs (the programs, the
# layer libraries, the headers, the CMake package and fsdp-plan's hardware files), under /usr,
# from the tree as built (no rebuild: build first, e.g. scripts/run.sh build).
# scripts/check_package.sh makes it, unpacks it and builds examples/minimal against it.
#
# [Note: LibTorch is not a Debian dependency]
# Everything here is built against the LibTorch inside PyTorch's pip wheel (torch 2.11.0), which
# no Debian package provides, so the package cannot depend on it. The user installs the wheel;
# the CMake package finds it through CMAKE_PREFIX_PATH (or Torch_DIR), and the programs find its
# shared libraries through LD_LIBRARY_PATH. The installed files carry no RPATH/RUNPATH (CMake's
# default for installed targets: the build tree's RPATH, which names the builder's venv, is
# removed on install), so nothing points into the build tree or the builder's environment.
# dpkg-shlibdeps is told where LibTorch's libraries are (-l) so that it can read them, and
# skips them as belonging to no package (--ignore-missing-info, which CPack passes).

set(FSDP_PACKAGE_MAINTAINER "fsdp maintainers <fsdp-maintainers@example.org>"
    CACHE STRING "The Debian package's Maintainer field")

# cpack packages the tree as built, as `cmake --install` does: its "preinstall" step would
# otherwise build `all` first, the test suite included, which the package does not hold.
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME fsdp)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${FSDP_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_VENDOR "fsdp")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Fully Sharded Data Parallel (FSDP2) training for LibTorch: library and programs")
# The extended description: CPack puts the summary first and indents the lines as Debian's
# control file wants (a blank line becomes " .").
set(CPACK_PACKAGE_DESCRIPTION
    "A C++ library that gives LibTorch what torch.distributed.fsdp.fully_shard gives
Python: parameters, gradients and optimizer state sharded across ranks. Holds
the static libraries, headers and CMake package (find_package(fsdp), target
fsdp::fsdp), and the programs fsdp-train, fsdp-estimate, fsdp-plan,
fsdp-tokenize and fsdp-comm-bench.

Requires LibTorch from PyTorch's pip wheel, torch ${Torch_VERSION}, which no
Debian package provides (python3 -m pip install torch==${Torch_VERSION}).
CMake: put the wheel's prefix (python3 -c 'import torch;
print(torch.utils.cmake_prefix_path)') on CMAKE_PREFIX_PATH, or set Torch_DIR,
when configuring a project that calls find_package(fsdp). Programs: put the
wheel's torch/lib on LD_LIBRARY_PATH.")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)   # fsdp_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# The architecture is dpkg's (CPack asks `dpkg --print-architecture`): amd64 on the machines
# this is built on; the programs are native code, so naming another would be wrong.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS "${TORCH_INSTALL_PREFIX}/lib")
# Without a CUDA toolkit, torch::cudart is the wheel's libcudart (CMakeLists.txt), in a folder of
# its own; with one, it is a toolkit target and the programs do not load it directly.
if(TARGET torch::cudart)
  get_target_property(_fsdp_cudart torch::cudart INTERFACE_LINK_LIBRARIES)
  if(_fsdp_cudart AND IS_ABSOLUTE "${_fsdp_cudart}")
    get_filename_component(_fsdp_cudart "${_fsdp_cudart}" DIRECTORY)
    list(APPEND CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS "${_fsdp_cudart}")
  endif()
endif()
# dpkg-shlibdeps finds what the programs load (libc, libstdc++, libxxhash, libpcre2, utf8proc,
# Open MPI, ...). The CMake package needs more at a user's link time: the static libraries'
# own dependencies (the .so links and CMake configs of the -dev packages that
# fsdpTargets.cmake and fsdpConfig.cmake name).
set(_fsdp_dev_depends nlohmann-json3-dev libxxhash-dev libpcre2-dev libutf8proc-dev)
if(FSDP_WITH_MPI)
  list(APPEND _fsdp_dev_depends libopenmpi-dev)
endif()
list(JOIN _fsdp_dev_depends ", " CPACK_DEBIAN_PACKAGE_DEPENDS)
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "cmake, g++")
include(CPack)
