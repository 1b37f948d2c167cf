#!/usr/bin/env bash
# Data parallelism on a two-GPU machine (nvidia-h200-x2), run through the device tool: the NCCL
# path against one GPU and ZeRO stage 0 against stage 1 (losses), then bert-large throughput and
# memory per GPU. Output in $OUT (dist.md and the logs).
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-bench/results/tmp}
mkdir -p "$OUT"
[ -x .carry/bin/anatomy ] || tar -C .carry -xJf .carry/bundle.tar.xz
export LD_LIBRARY_PATH="$PWD/.carry/lib" OMP_WAIT_POLICY=PASSIVE
a=.carry/bin/anatomy
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv | tee "$OUT/gpu_info.txt"
run() {  # name, flags...
  local name=$1; shift
  timeout 150 $a train --device cuda --disable-tqdm --logging-steps 0 --save-strategy no --output-dir "/tmp/dist/$name" "$@" \
    > "$OUT/$name.log" 2>&1
  python3 scripts/results_row.py dist "$name" "/tmp/dist/$name/train_results.json"
}
mkdir -p /tmp/dist
{
  echo "| run | GPUs | ZeRO stage | samples/s (steady) | first step loss | last step loss | optimizer state MiB per rank | NVML used MB per GPU |"
  echo "|---|---|---|---|---|---|---|---|"
  # Correctness: learnable task, no dropout differences matter for the comparison of stages.
  L="--preset bert-base --dataset learnable --seq-len 128 --num-samples 2048 --max-steps 40 --learning-rate 1e-4 --precision bf16"
  run base_1gpu_bs32 $L --per-device-train-batch-size 32
  run base_2gpu_bs16_z0 $L --per-device-train-batch-size 16 --nproc-per-node 2 --zero-stage 0
  run base_2gpu_bs16_z1 $L --per-device-train-batch-size 16 --nproc-per-node 2 --zero-stage 1
  # bert-large at seq 512: the seed run and bf16 batch 32 per GPU.
  run seed_fp32_bs4_1gpu --preset bert-large --max-seq-length 512 --precision fp32 --per-device-train-batch-size 4 --num-samples 256
  run seed_fp32_bs4_2gpu_z1 --preset bert-large --max-seq-length 512 --precision fp32 --per-device-train-batch-size 4 --num-samples 512 --nproc-per-node 2 --zero-stage 1
  run bf16_bs32_1gpu --preset bert-large --max-seq-length 512 --precision bf16 --per-device-train-batch-size 32 --num-samples 1024
  run bf16_bs32_2gpu_z0 --preset bert-large --max-seq-length 512 --precision bf16 --per-device-train-batch-size 32 --num-samples 2048 --nproc-per-node 2 --zero-stage 0
  run bf16_bs32_2gpu_z1 --preset bert-large --max-seq-length 512 --precision bf16 --per-device-train-batch-size 32 --num-samples 2048 --nproc-per-node 2 --zero-stage 1
} | tee "$OUT/dist.md"
