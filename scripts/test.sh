#!/usr/bin/env bash
# Quick start, second command: set up, build, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd build && ctest --output-on-failure -j "$(nproc)" "$@"
../scripts/fuzz.sh 15  # libFuzzer targets on their corpora, 15 s each (we are in build/)
