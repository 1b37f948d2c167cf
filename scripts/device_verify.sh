#!/usr/bin/env bash
# A short device call after a change to the training step: the GPU tests, a profiled bf16 run
# with accumulation (asynchronous uploads between micro-batches), fp16 with loss scaling, and the
# seed run, into $OUT (verify.log, gpu_tests.log, profile.json, train_results.json).
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-bench/results/tmp}
mkdir -p "$OUT"
[ -x .carry/bin/anatomy ] || tar -C .carry -xJf .carry/bundle.tar.xz
export LD_LIBRARY_PATH="$PWD/.carry/lib" OMP_WAIT_POLICY=PASSIVE ANATOMY_SOURCE_DIR="$PWD"
a=.carry/bin/anatomy
{
  timeout 200 .carry/bin/anatomy_gpu_tests > "$OUT/gpu_tests.log" 2>&1
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/gpu_tests.log"
  echo "== bf16 bs32, accumulation 2, profiled"
  timeout 150 $a train --preset bert-large --max-seq-length 512 --precision bf16 --per-device-train-batch-size 32 --gradient-accumulation-steps 2 \
    --num-samples 1024 --output-dir /tmp/bf16 --disable-tqdm --logging-steps 4 --save-strategy no --profile-steps 3 2>&1 | tail -75
  cp /tmp/bf16/profile.json /tmp/bf16/train_results.json "$OUT/"
  echo "== fp16 bs8, accumulation 2"
  timeout 100 $a train --preset bert-large --max-seq-length 512 --precision fp16 --per-device-train-batch-size 8 --gradient-accumulation-steps 2 \
    --num-samples 256 --output-dir /tmp/fp16 --disable-tqdm --logging-steps 4 --save-strategy no 2>&1 | tail -8
  echo "== seed"
  timeout 100 $a train --seed-experiment --output-dir /tmp/seed --disable-tqdm --logging-steps 0 --save-strategy no 2>&1 | tail -4
} > "$OUT/verify.log" 2>&1
cat "$OUT/verify.log"
