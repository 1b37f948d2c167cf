#!/usr/bin/env bash
# Installs every build and test dependency from Debian's packages. Idempotent: installs only
# what is missing, so a second run is quick.
set -euo pipefail
pkgs=(cmake g++ ninja-build pkg-config libopenblas-dev nlohmann-json3-dev libcli11-dev
      libgtest-dev python3 libutf8proc-dev clang libclang-rt-dev chromium)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
