# Cross-compiling for ARM64 on Debian with g++-aarch64-linux-gnu and the arm64 -dev packages
# (dpkg --add-architecture arm64; scripts/test-arm64.sh installs them).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Headers-only and arch-independent packages (nlohmann-json, CLI11, msgpack) live in /usr;
# libraries are taken from the arm64 multiarch directory only.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "")
# Tests run under qemu-user (Debian's qemu-user) with the loader, libc and libraries of the arm64
# multiarch packages (-L /): the cross package's loader (/usr/aarch64-linux-gnu) with the multiarch
# libc.so.6 is a mismatched glibc pair whose first pthread_create never returns (test-arm64.sh).
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /)
