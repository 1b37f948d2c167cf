#!/usr/bin/env bash
# The memory levers on the GPU (issue: memory anatomy): bert-large, seq 512, bf16 batch 32 with
# each optimizer and each checkpointing policy, plus the fp32 seed run; planned vs allocated vs
# NVML and samples/s for each. Then compute-sanitizer over the op tests. Run through the device tool.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${LEVERS_OUT:-${OUT:-bench/results/tmp}}
[ -x .carry/bin/anatomy ] || tar -C .carry -xJf .carry/bundle.tar.xz
export LD_LIBRARY_PATH="$PWD/.carry/lib" OMP_WAIT_POLICY=PASSIVE
a=.carry/bin/anatomy
row() {  # name, extra flags...
  local name=$1; shift
  timeout 120 $a train --preset bert-large --seq-len 512 --device cuda --disable-tqdm --logging-steps 0 \
    --save-strategy no --output-dir "/tmp/levers/$name" "$@" > "/tmp/levers/$name.log" 2>&1
  python3 scripts/results_row.py levers "$name" "/tmp/levers/$name/train_results.json"
}
mkdir -p /tmp/levers
{
  echo "| run | samples/s (steady) | planned MiB | allocated MiB | gradients in activations MiB | NVML used MiB | NVML minus baseline and context MiB | optimizer B/param | gradient B/param | activations MiB | last loss |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  row seed_fp32_bs4 --precision fp32 --per-device-train-batch-size 4 --num-samples 512
  row seed_fp32_bs4_grads_own --precision fp32 --per-device-train-batch-size 4 --num-samples 512 --gradient-placement own
  row seed_fp32_bs4_selective --precision fp32 --per-device-train-batch-size 4 --num-samples 512 --gradient-checkpointing selective
  for o in adamw adamw-8bit sgd adafactor; do
    row "bf16_bs32_$o" --precision bf16 --per-device-train-batch-size 32 --num-samples 384 --optim $o
  done
  for c in selective layer; do
    row "bf16_bs32_ckpt_$c" --precision bf16 --per-device-train-batch-size 32 --num-samples 384 --gradient-checkpointing $c
  done
  row bf16_bs32_ckpt_layer_grads_own --precision bf16 --per-device-train-batch-size 32 --num-samples 384 --gradient-checkpointing layer --gradient-placement own
  row bf16_bs8_accum4 --precision bf16 --per-device-train-batch-size 8 --gradient-accumulation-steps 4 --num-samples 384
} | tee "$OUT/levers.md"
$a plan --preset bert-large --max-seq-length 512 --batch-size 4 --precision fp32 --gpu-memory 16GB 2>&1 | tee "$OUT/plan_v100.txt"
[ "${1:-all}" = levers ] && exit 0
timeout 240 compute-sanitizer --tool memcheck .carry/bin/anatomy_gpu_tests --gtest_filter='CudaOps.*:Attention.*:Optim*' 2>&1 \
  | grep -E "ERROR SUMMARY|PASSED|FAILED" | tee "$OUT/memcheck.txt"
timeout 150 compute-sanitizer --tool racecheck .carry/bin/anatomy_gpu_tests --gtest_filter='Attention.Bf16FastPath:Attention.Fp32*:CudaOps.LayerNorm*:CudaOps.BiasGrad' 2>&1 \
  | grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" | tee "$OUT/racecheck.txt"
