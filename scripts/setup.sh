#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine of this kind lacks (the toolchain,
# CUDA, Google Benchmark and GoogleTest come with the image). Idempotent.
set -euo pipefail
need=()
for pkg in cmake g++ catch2 libbenchmark-dev ccache libcli11-dev gnuplot-nox clang libclang-rt-14-dev clang-tidy; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
