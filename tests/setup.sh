#!/bin/bash
# setup.sh - install every package kvxfer needs on Debian 12 (as root), then
# configure and build. Usage: tests/setup.sh [build-dir] [meson options...]
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(gcc g++ make pkg-config meson ninja-build binutils python3 iproute2
      libucx-dev ucx-utils libnng-dev libjson-c-dev libhwloc-dev libgtest-dev
      libamdhip64-dev openmpi-bin libopenmpi-dev
      clang-14 libclang-rt-14-dev python3-pytest
      python3-setuptools python3-pip python3-venv openssl)

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
        missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "setup.sh: missing packages ${missing[*]}; run as root" >&2
        exit 1
    fi
    echo "setup.sh: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

build=${1:-build}
shift || true
if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" "$@" >/dev/null
fi
ninja -C "$build"
