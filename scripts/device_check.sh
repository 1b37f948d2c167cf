#!/usr/bin/env bash
# One device call's worth of checks (run on the GPU machine by the device tool): the golden
# fixture's weights, the GPU tests, and profiled bert-large runs. Prints a short summary last.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-bench/results/tmp}
scripts/gpu.sh info golden >/dev/null
cp "$OUT/golden/model.safetensors" tests/data/golden/ 2>/dev/null
sha256sum "$OUT/golden/golden.safetensors" tests/data/golden/golden.safetensors | tee "$OUT/golden_sha.txt"
rm -f "$OUT/golden/golden.safetensors" "$OUT/golden/config.json" "$OUT/golden/golden.json"
scripts/gpu.sh tests unit > "$OUT/tests_summary.txt" 2>&1
export LD_LIBRARY_PATH="$PWD/.carry/lib" OMP_WAIT_POLICY=PASSIVE
a=.carry/bin/anatomy
{
  timeout 150 $a train --seed-experiment --output-dir /tmp/seed --disable-tqdm --logging-steps 0 --profile-steps 2 2>&1 | tail -60
  timeout 120 $a train --preset bert-large --max-seq-length 512 --precision bf16 --per-device-train-batch-size 32 --num-samples 640 \
    --output-dir /tmp/bf16 --disable-tqdm --logging-steps 0 --save-strategy no --profile-steps 3 2>&1 | tail -60
  $a plan --preset bert-large --max-seq-length 512 --batch-size 4 --precision fp32 --gpu-memory 16GB 2>&1 || true
  $a plan --preset bert-large --max-seq-length 512 --per-device-train-batch-size 4 --precision fp32 --gpu-memory 16GB 2>&1
} > "$OUT/runs.log"
tar -C /tmp -czf "$OUT/run_dirs.tgz" seed/train_results.json seed/profile.json seed/metrics.jsonl seed/nvml.jsonl \
  seed/memory_timeline.json bf16/train_results.json bf16/profile.json bf16/nvml.jsonl bf16/memory_timeline.json 2>/dev/null
grep -E "PASSED|FAILED" "$OUT/tests_summary.txt"
grep -E "^Time|^Samples|^GPU memory|tensor_contraction|statistical|elementwise|forward .* ms, backward|ceilings|add up" "$OUT/runs.log"
