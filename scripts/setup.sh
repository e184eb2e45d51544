#!/usr/bin/env bash
# Installs what kvserve needs to build and test on Debian 12 (idempotent; skips apt when
# everything is already there). Run as root or with sudo available.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config git curl ca-certificates python3
      libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev
      libcpp-httplib-dev libxxhash-dev libzstd-dev zlib1g-dev
      libhiredis-dev libzmq3-dev cppzmq-dev libmsgpack-cxx-dev
      redis-server haproxy python3-zmq python3-msgpack)
# redis-server and haproxy: the shared-KV-tier tests start their own on loopback ports; the
# package's own service (started by apt where an init system runs) is not used.
# The deployment test parses deploy/compose.yaml and deploy/k8s/kvserve.yaml.
PKGS+=(python3-yaml)
# The one-binary test runs the default build under qemu-user -cpu max (AVX2, no AVX-512).
PKGS+=(qemu-user)
# The dashboard's browser test drives Debian's chromium with playwright-core (npm).
PKGS+=(chromium)
# Node.js and npm run the openai npm package against the server in the tests; a machine that
# already has node (e.g. from NodeSource, which bundles npm) keeps it.
command -v node >/dev/null && command -v npm >/dev/null || PKGS+=(nodejs npm)
# --arm64: also what scripts/test-arm64.sh needs to cross-build for ARM64 and run it under
# qemu-aarch64 (the cross compiler, the libraries as arm64 -dev packages). The binaries run on
# libc6:arm64's loader and libc (qemu-aarch64 -L /), not the cross package's: see test-arm64.sh.
ARM64=0
[ "${1:-}" = --arm64 ] && ARM64=1
if [ $ARM64 = 1 ]; then
  PKGS+=(g++-aarch64-linux-gnu libc6:arm64 libgtest-dev:arm64 libxxhash-dev:arm64
         libzstd-dev:arm64 libhiredis-dev:arm64 libzmq3-dev:arm64 cppzmq-dev:arm64
         libcpp-httplib-dev:arm64 zlib1g-dev:arm64)
fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "installing: ${missing[*]}"
  if [ $ARM64 = 1 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $SUDO dpkg --add-architecture arm64
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
