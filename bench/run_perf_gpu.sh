#!/usr/bin/env bash
# The GPU side of bench/perf_notes.md in one call, correctness first: the GPU tests that cover
# the changed kernels (dropout masks bit for bit against the CPU function, attention against
# the float64 reference, the optimizers' device-side skip, training), then the benchmarks.
# Each table goes to the console and to ${OUT:-bench_out}/.
#   BUILD=build-perf bash bench/run_perf_gpu.sh            # everything (~5 min on an H100/H200)
#   BUILD=build-perf bash bench/run_perf_gpu.sh tests      # the tests only
set -u
B=${BUILD:-build-perf}
O=${OUT:-bench_out}
mkdir -p "$O"
what=${1:-all}
status=0
if [[ $what == all || $what == tests ]]; then
  OMP_WAIT_POLICY=PASSIVE "$B/anatomy_gpu_tests" \
    --gtest_filter='DropoutBitsCuda.*:OptimizerSkipCuda.*:Attention.*:CudaOps.*:CudaOptimizers.*:TrainCuda.*:GoldenCuda.*' \
    > "$O/gpu_tests.log" 2>&1 || status=1
  grep -E '^\[  (PASSED|FAILED)|^\[==========\]|FAILED' "$O/gpu_tests.log" | tail -20
fi
if [[ $what == all || $what == bench ]]; then
  "$B/anatomy_bench_attention" | tee "$O/bench_attention.md" || status=1
  python3 bench/attention_sdpa.py | tee "$O/attention_sdpa.md" || status=1
  "$B/anatomy_bench_step" | tee "$O/bench_step.md" || status=1
fi
exit $status
