#!/usr/bin/env bash
# Quick start, first command: set up, build, and run the seed experiment of "Model training
# anatomy" (bert-large, seq 512, 512 samples, batch 4, fp32) on the best device present.
# Without a GPU it runs the same experiment on the CPU with the small bert-tiny preset.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec build/anatomy train --seed-experiment --output-dir runs/seed "$@"
