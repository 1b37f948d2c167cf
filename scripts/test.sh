#!/usr/bin/env bash
# Quick start, second command: set up, build, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd build
# Each test process records its peak memory (Note [test memory cap] in tests/common/memory_cap.cpp).
export ANATOMY_TEST_PEAK_LOG="$PWD/test_peaks.txt"
rm -f "$ANATOMY_TEST_PEAK_LOG"
ctest --output-on-failure -j "$(nproc)" "$@"
if [ -s "$ANATOMY_TEST_PEAK_LOG" ]; then
  echo "largest peak resident memory per test process (kB), of $(wc -l <"$ANATOMY_TEST_PEAK_LOG") processes:"
  sort -k3 -n "$ANATOMY_TEST_PEAK_LOG" | tail -n 3 | sed 's/^/  /'
  echo "largest peak of a CLI process a test started (kB):"
  sort -k7 -n "$ANATOMY_TEST_PEAK_LOG" | tail -n 1 | sed 's/^/  /'
fi
../scripts/fuzz.sh 15  # libFuzzer targets on their corpora, 15 s each (we are in build/)
