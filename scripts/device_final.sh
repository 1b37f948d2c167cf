#!/usr/bin/env bash
# The final device calls of a change (run on the GPU machine by the device tool), into $OUT:
#   scripts/device_final.sh bench   side by side with the HF Trainer and PyTorch (one call, ~10 min)
#   scripts/device_final.sh check   GPU tests, a profiled bf16 step, the memory levers, inference
#                                   sorted vs file order, compute-sanitizer on the new kernels
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-bench/results/tmp}
mkdir -p "$OUT"
[ -x .carry/bin/anatomy ] || tar -C .carry -xJf .carry/bundle.tar.xz
export LD_LIBRARY_PATH="$PWD/.carry/lib" OMP_WAIT_POLICY=PASSIVE ANATOMY_SOURCE_DIR="$PWD"
b=.carry/bin
a=$b/anatomy
case "${1:-}" in
  bench)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu_info.txt"
    python3 bench/side_by_side.py --out "$OUT" --anatomy-bin "$a" \
      --configs seed,seed_own,bf16_bs4,bf16_bs32,layer_bs32,best --batches 32,48,64 --timeout 200 --budget 560 2>&1 | tail -40 ;;
  check)
    timeout 200 $b/anatomy_gpu_tests > "$OUT/gpu_tests.log" 2>&1
    grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/gpu_tests.log"
    [ -x $b/anatomy_bench_ops ] && timeout 60 $b/anatomy_bench_ops > "$OUT/bench_ops.md" 2>&1 && cat "$OUT/bench_ops.md"
    timeout 120 $a train --preset bert-large --max-seq-length 512 --precision bf16 --per-device-train-batch-size 32 --num-samples 640 \
      --output-dir /tmp/bf16 --disable-tqdm --logging-steps 0 --save-strategy no --profile-steps 3 > "$OUT/profile_bf16_bs32.log" 2>&1
    grep -E "tensor_contraction|statistical|elementwise|optimizer|forward .* backward|add up|^Time|^Samples" "$OUT/profile_bf16_bs32.log"
    mkdir -p "$OUT/runs/bf16" && cp /tmp/bf16/*.json /tmp/bf16/*.jsonl "$OUT/runs/bf16/" 2>/dev/null
    LEVERS_OUT="$OUT" bash scripts/device_levers.sh levers
    scripts/make_eval_fixture.sh $a /tmp/large /tmp/varied.jsonl
    for order in --sort-by-length --no-sort-by-length; do
      for sp in --skip-padding --no-skip-padding; do
        timeout 100 $a eval --model-name-or-path /tmp/large --eval-file /tmp/varied.jsonl --max-seq-length 512 \
          --per-device-eval-batch-size 64 --precision bf16 $order $sp > "$OUT/eval$order$sp.log" 2>&1
        echo "$order $sp: $(grep -E '^Samples/second|^Tokens' "$OUT/eval$order$sp.log" | tr '\n' ' ')"
      done
    done | tee "$OUT/eval_summary.txt"
    timeout 150 compute-sanitizer --tool memcheck $b/anatomy_gpu_tests \
      --gtest_filter='CudaOps.LayerNorm*:CudaOps.BiasGrad*:RowsCuda.*:DropoutBitsCuda.*:OptimizerSkipCuda.*' 2>&1 \
      | grep -E "ERROR SUMMARY|PASSED|FAILED" | tee "$OUT/memcheck.txt"
    timeout 120 compute-sanitizer --tool racecheck $b/anatomy_gpu_tests \
      --gtest_filter='CudaOps.LayerNorm*:CudaOps.BiasGrad*:DropoutBitsCuda.*Attention*' 2>&1 \
      | grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" | tee "$OUT/racecheck.txt" ;;
  *) echo "usage: $0 bench|check"; exit 2 ;;
esac
