#!/usr/bin/env bash
# Runs on the GPU machine (through the device tool) over the staged binaries in .carry/:
#   scripts/gpu.sh tests     CUDA op tests vs the CPU twin, golden fixture on the GPU
#   scripts/gpu.sh golden    writes the Hugging Face golden fixture (needs torch + transformers)
#   scripts/gpu.sh bench     the side-by-side benchmark against the HF Trainer and PyTorch
# Everything it prints is also written under $OUT (or bench/results/tmp).
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH="$PWD/.carry/lib:${LD_LIBRARY_PATH:-}"
# No address-space cap on the unit tests here: the CUDA driver reserves address space (Note [test memory cap]).
export ANATOMY_SOURCE_DIR="$PWD" OMP_WAIT_POLICY=PASSIVE ANATOMY_TEST_MEMORY_CAP_MB=0
OUT=${OUT:-bench/results/tmp}
mkdir -p "$OUT"
bin=.carry/bin
[ -x "$bin/anatomy" ] || tar -C .carry -xJf .carry/bundle.tar.xz
for what in "$@"; do
  case "$what" in
    info)
      nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$OUT/gpu_info.txt"
      python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' | tee -a "$OUT/gpu_info.txt" ;;
    golden)
      python3 tests/golden/make_golden.py "$OUT/golden" 2>&1 | tail -5 ;;
    tests)
      "$bin/anatomy_gpu_tests" 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |OK \]|FAILED|Failure|rel|TFLOP" | head -150 ;;
    unit)
      "$bin/anatomy_tests" --gtest_filter='Golden*' 2>&1 | tail -5 ;;
    hfload)  # a model written by anatomy, loaded by transformers
      "$bin/anatomy" train --device cuda --preset bert-tiny --seq-len 64 --num-samples 64 --max-steps 2 \
        --overwrite-output-dir --output-dir /tmp/anatomy_tiny --disable-tqdm --logging-steps 0 >/dev/null 2>&1
      python3 tests/golden/verify_hf_load.py /tmp/anatomy_tiny 2>&1 | tail -3 | tee "$OUT/hf_load.log" ;;
    sanitize)
      compute-sanitizer --tool memcheck "$bin/anatomy_gpu_tests" --gtest_filter='-*Bench*:*Golden*' 2>&1 | tail -4 | tee "$OUT/memcheck.log"
      compute-sanitizer --tool racecheck "$bin/anatomy_gpu_tests" --gtest_filter='*Attention*:-*Bench*' 2>&1 | tail -4 | tee "$OUT/racecheck.log" ;;
    bench)
      python3 bench/side_by_side.py --out "$OUT" --anatomy-bin "$bin/anatomy" ${BENCH_ARGS:-} 2>&1 | tail -40 ;;
    *) echo "gpu.sh: unknown step '$what'"; exit 2 ;;
  esac
done
