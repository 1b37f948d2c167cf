#!/usr/bin/env bash
# One device call (run on the GPU machine by the device tool) that answers the open questions
# of the CUDA backend and the memory anatomy, each into $OUT:
#   gpu_tests.log     every CUDA op against its CPU twin, the golden fixture on the GPU
#   attention.md      our fused attention alone vs PyTorch's SDPA, same shapes
#   cuda_graph.md     one training step eager vs captured in a CUDA graph and replayed
#   memtrace_*.log    which ops of the first step grow NVML's used memory (--trace-memory-growth)
#   eval_*.log        inference (anatomy eval) at 6 B/param, with and without skipping padding
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-bench/results/tmp}
mkdir -p "$OUT"
[ -x .carry/bin/anatomy ] || tar -C .carry -xJf .carry/bundle.tar.xz
export LD_LIBRARY_PATH="$PWD/.carry/lib" OMP_WAIT_POLICY=PASSIVE ANATOMY_SOURCE_DIR="$PWD"
b=.carry/bin
a=$b/anatomy
step() { echo "== $* ($(date +%T))"; }

step gpu tests
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu_info.txt"
timeout 240 $b/anatomy_gpu_tests 2>&1 > "$OUT/gpu_tests.log"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/gpu_tests.log"

step attention vs SDPA
[ -x $b/anatomy_bench_attention ] && timeout 120 $b/anatomy_bench_attention > "$OUT/attention.md" 2>&1
timeout 120 python3 bench/attention_sdpa.py >> "$OUT/attention.md" 2>&1
cat "$OUT/attention.md"

step cuda graph
[ -x $b/anatomy_bench_step ] && timeout 150 $b/anatomy_bench_step > "$OUT/cuda_graph.md" 2>&1
cat "$OUT/cuda_graph.md"

step memory growth
timeout 150 $a train --seed-experiment --trace-memory-growth --output-dir /tmp/seed --disable-tqdm --logging-steps 0 \
  --save-strategy no > "$OUT/memtrace_seed.log" 2>&1
timeout 120 $a train --preset bert-large --max-seq-length 512 --precision bf16 --per-device-train-batch-size 32 --num-samples 384 \
  --gradient-checkpointing layer --trace-memory-growth --output-dir /tmp/ckpt --disable-tqdm --logging-steps 0 \
  --save-strategy no > "$OUT/memtrace_bf16_layer.log" 2>&1
grep -A40 "Memory anatomy" "$OUT/memtrace_seed.log" "$OUT/memtrace_bf16_layer.log"

step inference
scripts/make_eval_fixture.sh $a /tmp/large /tmp/varied.jsonl
for sp in --skip-padding --no-skip-padding; do
  timeout 120 $a eval --model-name-or-path /tmp/large --eval-file /tmp/varied.jsonl --max-seq-length 512 \
    --per-device-eval-batch-size 64 --precision bf16 $sp --output-dir /tmp/eval$sp > "$OUT/eval$sp.log" 2>&1
  tail -25 "$OUT/eval$sp.log"
done
step done
