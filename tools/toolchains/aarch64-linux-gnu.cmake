# Cross-building for 64-bit ARM Linux from an x86-64 Debian 12 with the multiarch packages that
# tools/check aarch64 installs (g++-aarch64-linux-gnu and the :arm64 libraries). Programs the
# build runs (ctest, the tests' discovery) go through qemu-user: QEMU_CPU picks the CPU model.
# No -L /usr/aarch64-linux-gnu: that prefix supplies the cross toolchain's dynamic loader, which
# then loads the multiarch libc6:arm64 of another build (the libraries' dependency); the two
# disagree on glibc's private interfaces and a guest hangs in its first pthread_create. Without
# the prefix, /lib/ld-linux-aarch64.so.1 and libc both come from libc6:arm64.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Debian installs arm64 libraries under the multiarch directories of the host's /usr.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr/lib/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static)
