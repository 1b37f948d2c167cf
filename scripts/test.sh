#!/usr/bin/env bash
# Quick start, second command: set up, build, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd build && ctest --output-on-failure -j "$(nproc)" "$@"
