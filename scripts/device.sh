#!/usr/bin/env bash
# Everything that runs on the GPU machine (through the device tool), over the binaries that
# scripts/stage_device.sh staged into .carry/. One call runs several steps in order; each writes
# under $OUT (default bench/results/tmp) and prints a short summary.
#
#   OUT=$OUT scripts/device.sh STEP...
#
# More than eight files under $OUT at the end go back as one archive, $OUT/out.tgz.
#
#   info      GPU, driver, torch and transformers versions
#   tests     every GPU test (CUDA ops vs the CPU twin, golden fixture on the GPU, training); GPU_TESTS_FILTER=
#             a gtest filter runs only those
#   unit      the CPU golden tests, on this machine's CPU
#   golden    rewrite the transformers golden fixture (torch + transformers)
#   hfload    a model written by anatomy, loaded by transformers
#   yardstick PyTorch's own bf16 error (autocast) on every golden fixture, next to the bf16 GPU tests' bounds
#   family    the encoder variants (RoBERTa, XLM-R, DistilBERT, ELECTRA): their golden fixtures on the
#             GPU (fp32, bf16, AdamW, real tokens), then `anatomy train` bf16 on each tiny model directory
#             of tests/fixtures/models with its tokenizer, loaded back by transformers
#   modernbert ModernBERT on the GPU: its golden fixtures (fp32, AdamW), the twins of its ops (rotary,
#             gated GELU, attention with a local window at the odd sizes), the attention kernel tests
#   mbtrain   ModernBERT through `anatomy train`: its GPU tests (golden fp32/bf16/fp16, bf16 AdamW, bf16
#             plan == allocation), the tiny ModernBERT bf16 (saved, loaded by transformers), and preset
#             modernbert-base bf16 seq 512 batch 32 for 20 steps (and with layer checkpointing):
#             samples/s, planned vs allocated vs NVML (~10 min at most; alone in a call)
#   familybench each variant at base size, bf16 batch 32 seq 512: anatomy vs the Trainer (~8 min; alone in a call)
#   sanitize  compute-sanitizer memcheck, racecheck and synccheck over the GPU tests (SANITIZE_FILTER: which)
#   ops       each op alone: achieved TFLOP/s and GB/s (anatomy_bench_ops, also --registry: every op)
#   profile   bert-large bf16 batch 32 with --profile-steps 3 (time by op class)
#   verify    bf16 with accumulation (profiled), fp16 with loss scaling, the seed run
#   levers    the memory levers: each optimizer and checkpointing policy, planned vs NVML
#   selective bf16 batch 32 with selective recompute against none, alternated twice (issue 16's memory target)
#   eval      inference, sorted vs file order, skipping padding or not
#   probe     attention vs PyTorch SDPA, one step eager vs CUDA graph, NVML growth by op
#   realtext  real text of varied length (.carry/fortunes from bench/fortunes_dataset.py): bert-base and the
#             MiniLM shape, anatomy on real tokens / padded / grouped (3 runs each) vs the Trainer random /
#             grouped (~7.5 min; alone in a call); REALTEXT_ARGS: more flags of bench/real_text.py
#   tokenruns MiniLM (4 runs, then 2 pinned to cores 2-5 with taskset) and bert-base on real tokens, 3 epochs,
#             no evaluation: steady samples/s per run (tokenruns.txt), every run's metrics.jsonl lines (samples/s
#             every 25 steps) in tokenruns.metrics.jsonl
#   mbtext    ModernBERT (modernbert-base's shape, WordPiece vocabulary) on the same real text, 2 epochs: anatomy on
#             real tokens / padded / grouped vs the Trainer random / grouped (~6 min; needs .carry/fortunes);
#             MBTEXT_ARGS: more flags of bench/real_text.py
#   tokenprofile bert-base (TOKENPROFILE_MODEL: another bench/real_text.py model) on real text (.carry/fortunes):
#             the time anatomy (--profile-steps) of training
#             on real tokens vs length-grouped padded batches, one epoch each (issue 16's real-token gap)
#   kernels   where a small model's step goes on the GPU: every kernel's duration (ncu, serialized) over a window of
#             1000 launches of one epoch of TOKENPROFILE_MODEL (default minilm) on real text, summed by kernel
#   packed    training on real tokens: the packed-attention and packed-training GPU tests (twins at the
#             small, odd and long sizes; the per-token heads), then tokenprofile (needs .carry/fortunes)
#   attention the attention table: ours (the default forward, then the mma.sync one) vs PyTorch SDPA
#             (flash, cuDNN), T 128/512, D 32/64, p 0/0.1
#   wgmmatiles the wgmma forward with and without its overlap, and the mma.sync forward, on the same shapes
#   attentionab the attention kernels' variants, each an environment setting of ATTN_AB (default: the backward's:
#             mma.sync, wgmma with one warpgroup a CTA, query tiles by cp.async, dQ by atomics instead of the default TMA reduces),
#             on ATTN_SHAPE's shapes, alternated twice. Earlier results' loadab is ATTN_AB='ANATOMY_ATTENTION_FWD_AHEAD=1
#             ANATOMY_ATTENTION_FWD_LOAD=cp.async ANATOMY_ATTENTION_FWD_LOAD=tma', fwd32ab ATTN_AB='ANATOMY_ATTENTION_FWD=mma
#             ANATOMY_ATTENTION_FWD=wgmma' with ATTN_SHAPE='--batch 32 --seq 128 --seq 512 --head-dim 32', bwdab the default.
#             ATTN_AB=default is the build's defaults; with .carry/before staged, its rows come first in each round,
#             labelled before (session 23's attnab: ATTN_AB=default ATTN_SHAPE='--batch 32 --seq 512 --head-dim 64
#             --head-dim 32')
#   gemmalgos bert-large's twelve layer GEMMs (bench/gemm_algos.cu): cuBLASLt's first heuristic pick vs the
#             fastest of its first 16, each timed alone (compiled here by nvcc); GEMMALGOS_ARGS='16384 --sustained':
#             the energy a call of each of the first 6 at the power limit instead
#   fp8       --precision fp8: its GPU tests, bert-large batch 32's per-op profile, fp8 vs bf16 vs the PyTorch loop
#             (bench/side_by_side.py fp8_bs32), bert-base on real text in bf16 and fp8 with loss curves (~9 min; alone)
#   pretext   the real text after masked-LM pretraining of each model: the Trainer vs anatomy
#             (real tokens, padded, grouped; seeds 0-2) fine-tuning from the same weights (~7 min; alone)
#   fp8curves fp8 vs bf16 loss curves and accuracy on the real text where the model learns (~3 min)
#   bench     side by side with the Hugging Face Trainer and PyTorch (~10 min; alone in a call); BENCH_ARGS: more
#             flags of bench/side_by_side.py (e.g. --configs bf16_bs32 --anatomy-args '--gemm-tuning measure')
#   dist      data parallelism on a machine with two GPUs: ZeRO 0/1/2, the overlap, ZeRO-2 memory
#   distab    the overlap on two GPUs: bert-large bf16 batch 32 a GPU, ZeRO 1, under each DISTAB setting
#             (';'-separated, each flags and/or VAR=value words; default: the 25 MB buckets, one bucket, 100 MB
#             buckets, NCCL_MAX_CTAS=8), alternated twice; then the first two with --profile-steps 4 (the
#             collectives' time and the part backward did not hide)
#   trainab   one GPU: bert-large bf16 batch 32 under each TRAINAB setting (';'-separated flags and/or VAR=value
#             words; default: --gemm-tuning off, then measure), alternated twice; then each profiled (its matmul
#             lines, or TRAINAB_OPS's: an extended regex), and the tuned run's gemm_tuning.md (earlier results'
#             fwdab: TRAINAB='ANATOMY_ATTENTION_FWD=mma;ANATOMY_ATTENTION_FWD=wgmma'). The word BUILD=before runs
#             .carry/before's anatomy (scripts/stage_device.sh BEFORE=rev): TRAINAB=';BUILD=before' is an A/B of builds
#             (this build first: a trailing empty setting would be dropped)
#   launchab  two GPUs under torchrun (process groups, NCCL through the bootstrap store): .carry/before's anatomy
#             and .carry/bin's, alternated twice, bert-base bf16 batch 32 seq 128, 300 steps: the wall time of
#             the whole command (group formation included), steady samples/s and train_runtime (launchab.md)
#   power     the GPU's SM clock, power and clock event reasons (nvidia-smi every 100 ms) while the PyTorch loop and
#             anatomy each train bert-large bf16 batch 32 (120 steps): power.md (is the steady step held by
#             the power limit rather than by its kernels?)
#   attnpower the attention ops alone (anatomy_bench_attention, B 32, T 512, D 64, 8000 calls of each, p 0.1 and 0)
#             with nvidia-smi's samples beside: do they hold the power limit, at what clock (attnpower.md)
#   realtextab the real-text runs (bench/real_text.py, REALTEXTAB_ARGS; default: anatomy on real tokens, bert-base and
#             MiniLM, 2 epochs) of .carry/before and .carry/bin, alternated twice (needs .carry/fortunes); with
#             REALTEXTAB_ENV='VAR=value ...', of .carry/bin under those settings and without
#   stepab    the training step of two builds in one call: .carry/bin (B) vs .carry/before (A)
#   opsab     the ops of .carry/before (A, when staged) and .carry/bin (B): anatomy_bench_ops (the memory-bound
#             backward ops and the weight gradients at bert-large shapes) A B A B, then bert-large bf16 batch 32's
#             per-op profile of A and B, every op (earlier results' lnab and epilogue steps)
#   envab     the bert-large bf16 batch 32 step (anatomy_bench_step) without and with each setting of ENVAB
#             (e.g. ENVAB='ANATOMY_ATTENTION_BWD=mma', or several, space-separated; a setting may join VAR=value
#             and anatomy_bench_step flags with commas: '--gemm-tuning ANATOMY_ATTENTION_BWD=mma,--gemm-tuning'),
#             alternated twice; the "with"
#             runs' stderr kept; with ENVAB_OPS (a regex of op names) also those ops' per-op profile lines a side
#   ncuattn   Nsight Compute's every section on the attention backward (B 32, T 512, D 64, p 0.1 and 0), with
#             per-instruction stall samples of the p 0.1 launch (ncu_attn_bwd_sass.csv); NCU_KERNEL=wgmma_fwd: the
#             forward's (ncu_wgmma_fwd*)
#   ncuops    Nsight Compute's every section and per-instruction samples of NCU_KERNEL's launches (default the
#             LayerNorm backward's group kernel) in anatomy_bench_ops at bert-large shapes
#   ncu       Nsight Compute's sections (speed of light, occupancy, launch, warp states, instructions)
#             of every kernel of the registry ops NCU_OPS (anatomy_bench_ops --registry, bert-base sizes)
#   launch    process groups under torchrun: collectives bitwise against the in-process group (NCCL
#             with two GPUs, also as two "nodes" on sockets; Gloo on the CPU), a failing rank, a rank lost
#             before NCCL's init (one GPU is enough), and
#             `anatomy train` launched by torchrun on the CPU (3 processes) and the GPU(s)
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-bench/results/tmp}
mkdir -p "$OUT"
# No address-space cap on the unit tests here: the CUDA driver reserves address space
# (Note [test memory cap] in tests/common/memory_cap.cpp).
export LD_LIBRARY_PATH="$PWD/.carry/lib:${LD_LIBRARY_PATH:-}" OMP_WAIT_POLICY=PASSIVE ANATOMY_SOURCE_DIR="$PWD" \
  ANATOMY_TEST_MEMORY_CAP_MB=0
b=.carry/bin
a=$b/anatomy
quiet=(--device cuda --disable-tqdm --logging-steps 0 --save-strategy no)

passed() { grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$1"; }

train_row() {  # kind (levers|dist), name, flags...
  local kind=$1 name=$2; shift 2
  timeout 150 $a train --preset bert-large --seq-len 512 "${quiet[@]}" --output-dir "/tmp/$kind/$name" "$@" \
    > "/tmp/$kind/$name.log" 2>&1
  python3 scripts/results_row.py "$kind" "$name" "/tmp/$kind/$name/train_results.json"
}

step_info() {
  nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv | tee "$OUT/gpu_info.txt"
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' \
    | tee -a "$OUT/gpu_info.txt"
}

step_tests() {
  timeout 420 $b/anatomy_gpu_tests ${GPU_TESTS_FILTER:+--gtest_filter=$GPU_TESTS_FILTER} > "$OUT/gpu_tests.log" 2>&1
  passed "$OUT/gpu_tests.log"
}

step_unit() { $b/anatomy_tests --gtest_filter='Golden*' 2>&1 | tail -3; }

step_golden() { python3 tests/golden/make_golden.py "$OUT/golden" 2>&1 | tail -5; }

step_hfload() {
  $a train "${quiet[@]}" --preset bert-tiny --seq-len 64 --num-samples 64 --max-steps 2 --save-strategy final \
    --output-dir /tmp/anatomy_tiny >/dev/null 2>&1
  python3 tests/golden/verify_hf_load.py /tmp/anatomy_tiny 2>&1 | tail -3 | tee "$OUT/hf_load.log"
}

step_family() {
  timeout 300 $b/anatomy_gpu_tests --gtest_filter='Arch/GoldenFamilyCuda.*' > "$OUT/family_gpu_tests.log" 2>&1
  passed "$OUT/family_gpu_tests.log"
  mkdir -p /tmp/family
  for arch in roberta xlm-roberta distilbert electra; do
    head -64 tests/data/text/sentiment.jsonl > "/tmp/family/$arch.jsonl"
    timeout 120 $a train "${quiet[@]}" --save-strategy final --precision bf16 --model-name-or-path "tests/fixtures/models/$arch" \
      --train-file "/tmp/family/$arch.jsonl" --max-seq-length 32 --per-device-train-batch-size 8 --max-steps 8 \
      --overwrite-output-dir --output-dir "/tmp/family/$arch" > "$OUT/family_train_$arch.log" 2>&1
    echo "$arch: exit $? $(python3 tests/golden/verify_hf_load.py "/tmp/family/$arch" 2>/dev/null | cut -c1-160)" \
      | tee -a "$OUT/family.log"
  done
}

step_modernbert() {
  timeout 300 $b/anatomy_gpu_tests --gtest_filter='Fixtures/GoldenModernBertCuda.*:Registry/OpTwin.*attention*:Registry/OpTwin.*rotary*:Registry/OpTwin.*geglu*:Registry/OpTwin.*masked_mean*:Attention.*' \
    > "$OUT/modernbert_gpu_tests.log" 2>&1
  passed "$OUT/modernbert_gpu_tests.log"
}

step_mbtrain() {
  timeout 200 $b/anatomy_gpu_tests \
    --gtest_filter='Fixtures/GoldenModernBertCuda.*:Fixtures/ModernBertCuda.*:ModernBertCudaTrain.*' \
    > "$OUT/mbtrain_gpu_tests.log" 2>&1
  passed "$OUT/mbtrain_gpu_tests.log"
  mkdir -p /tmp/mbtrain/tiny_config /tmp/levers
  # The golden fixture's architecture with the learnable task's vocabulary (2101 ids at least).
  python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["vocab_size"] = 2200; json.dump(c, open(sys.argv[2], "w"))' \
    tests/data/golden_family/modernbert/config.json /tmp/mbtrain/tiny_config/config.json
  timeout 120 $a train "${quiet[@]}" --save-strategy final --precision bf16 --model-name-or-path /tmp/mbtrain/tiny_config \
    --dataset learnable --num-samples 1024 --max-seq-length 64 --per-device-train-batch-size 16 --max-steps 60 \
    --learning-rate 2e-3 --logging-steps 10 --overwrite-output-dir --output-dir /tmp/mbtrain/tiny > "$OUT/mbtrain_tiny.log" 2>&1
  echo "tiny bf16: exit $?"
  python3 -c 'import json, sys; l = [j["loss"] for j in map(json.loads, open(sys.argv[1])) if "loss" in j]; print("tiny bf16 loss:", l[0], "->", l[-1])' \
    /tmp/mbtrain/tiny/metrics.jsonl
  python3 scripts/results_row.py levers mb_tiny_bf16 /tmp/mbtrain/tiny/train_results.json
  python3 tests/golden/verify_hf_load.py /tmp/mbtrain/tiny 2>&1 | tail -2
  {
    echo "| run | samples/s (steady) | planned MiB | allocated MiB | gradients in activations MiB | NVML used MiB | NVML minus baseline and context MiB | optimizer B/param | gradient B/param | activations MiB | last loss |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    timeout 150 $a train --preset modernbert-base --seq-len 512 --precision bf16 --per-device-train-batch-size 32 \
      --num-samples 1024 --max-steps 20 "${quiet[@]}" --output-dir /tmp/levers/mb_base_bf16_bs32 \
      > /tmp/levers/mb_base_bf16_bs32.log 2>&1
    python3 scripts/results_row.py levers mb_base_bf16_bs32 /tmp/levers/mb_base_bf16_bs32/train_results.json
    timeout 150 $a train --preset modernbert-base --seq-len 512 --precision bf16 --per-device-train-batch-size 32 \
      --num-samples 1024 --max-steps 20 --gradient-checkpointing layer "${quiet[@]}" \
      --output-dir /tmp/levers/mb_base_bf16_bs32_layer > /tmp/levers/mb_base_bf16_bs32_layer.log 2>&1
    python3 scripts/results_row.py levers mb_base_bf16_bs32_layer /tmp/levers/mb_base_bf16_bs32_layer/train_results.json
  } | tee "$OUT/mbtrain.md"
  grep -A9 "Memory anatomy" /tmp/levers/mb_base_bf16_bs32.log | tee -a "$OUT/mbtrain.md"
  grep -E "Samples/second|error" /tmp/levers/mb_base_bf16_bs32.log | tee -a "$OUT/mbtrain.md"
  $a plan --preset modernbert-base --seq-len 512 --per-device-train-batch-size 32 --precision bf16 --gpu-memory 80GiB 2>&1 \
    | tee "$OUT/mbtrain_plan.txt"
}

step_familybench() {  # FAMILY_PRESETS=a,b limits the presets (default: bench/family_bench.py's)
  python3 bench/family_bench.py --anatomy-bin "$a" --out "$OUT" ${FAMILY_PRESETS:+--presets "$FAMILY_PRESETS"} 2>&1 | tail -16
}

# memcheck, racecheck and synccheck (barriers: every thread of a CTA at the same one), the tests'
# output in the .log files. SANITIZE_FILTER: one gtest filter for all three; default: memcheck over all
# but the benchmarks and goldens, racecheck and synccheck over the kernels' shared-memory users.
# SANITIZE_MEMCHECK / SANITIZE_KERNELS override one side; SANITIZE_TOOLS picks tools (default all three);
# SANITIZE_LIMIT: seconds per tool (default memcheck 240, the others 150). The whole suite under memcheck
# takes longer than that: a tool that runs out of time is killed with its tests (timeout kills its process group, so
# that no test binary goes on unsanitized beside the next tool) and its .txt says so.
step_sanitize() {
  local mem=${SANITIZE_MEMCHECK:-${SANITIZE_FILTER:--*Bench*:*Golden*}} tool filter limit rc
  local kernels=${SANITIZE_KERNELS:-${SANITIZE_FILTER:-Attention.Bf16FastPath:Attention.HopperTakesTheWgmmaForward:Attention.HopperWgmmaBackward:Attention.Fp32*:CudaOps.LayerNorm*:CudaOps.BiasGrad*:DropoutBitsCuda.*Attention*:Registry/OpTwin.*attention*}}
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
    filter=$kernels limit=${SANITIZE_LIMIT:-150}
    [ $tool = memcheck ] && filter=$mem limit=${SANITIZE_LIMIT:-240}
    rc=0 t0=$SECONDS
    timeout -s KILL $limit compute-sanitizer --tool $tool $b/anatomy_gpu_tests --gtest_filter="$filter" \
      > "$OUT/$tool.log" 2>&1 || rc=$?
    { grep -E "SUMMARY|PASSED|FAILED" "$OUT/$tool.log"
      # Killed at the limit (137 alone could be another SIGKILL: the out-of-memory killer).
      if [ $rc = 137 ] && [ $((SECONDS - t0)) -ge $limit ]; then
        echo "$tool: TIMED OUT after ${limit}s: incomplete ($(grep -cE '^\[ *(OK|FAILED) *\]' "$OUT/$tool.log") tests finished)"
      elif [ $rc = 137 ]; then echo "$tool: KILLED (SIGKILL) after $((SECONDS - t0))s, before its limit"; fi
    } | tee "$OUT/$tool.txt"
  done
}

step_ops() {
  [ -x $b/anatomy_bench_ops ] && timeout 120 $b/anatomy_bench_ops > "$OUT/bench_ops.md" 2>&1
  cat "$OUT/bench_ops.md"
  # Every op of the per-op registry at bert-base sizes (tests/common/op_registry.h).
  [ -x $b/anatomy_bench_ops ] && timeout 240 $b/anatomy_bench_ops --registry --reps 20 --warmup 3 \
    > "$OUT/bench_ops_registry.md" 2>&1
  cat "$OUT/bench_ops_registry.md"
}

step_profile() {
  timeout 150 $a train --preset bert-large --max-seq-length 512 --precision bf16 --per-device-train-batch-size 32 --num-samples 640 \
    "${quiet[@]}" --output-dir /tmp/bf16 --profile-steps 3 > "$OUT/profile_bf16_bs32.log" 2>&1
  grep -E "tensor_contraction|statistical|elementwise|optimizer|forward .* backward|add up|^Time|^Samples|^ +(matmul|bias_grad) " \
    "$OUT/profile_bf16_bs32.log"
  mkdir -p "$OUT/runs" && cp /tmp/bf16/profile.json "$OUT/runs/profile_bf16_bs32.json" 2>/dev/null
}

step_verify() {
  {
    echo "== bf16 bs32, accumulation 2, profiled"
    timeout 150 $a train --preset bert-large --max-seq-length 512 --precision bf16 --per-device-train-batch-size 32 \
      --gradient-accumulation-steps 2 --num-samples 1024 --output-dir /tmp/bf16acc --disable-tqdm --logging-steps 4 \
      --save-strategy no --profile-steps 3 2>&1 | tail -75
    echo "== fp16 bs8, accumulation 2"
    timeout 100 $a train --preset bert-large --max-seq-length 512 --precision fp16 --per-device-train-batch-size 8 \
      --gradient-accumulation-steps 2 --num-samples 256 --output-dir /tmp/fp16 --disable-tqdm --logging-steps 4 \
      --save-strategy no 2>&1 | tail -8
    echo "== seed"
    timeout 100 $a train --seed-experiment --output-dir /tmp/seed --disable-tqdm --logging-steps 0 --save-strategy no \
      2>&1 | tail -4
  } > "$OUT/verify.log" 2>&1
  cat "$OUT/verify.log"
}

step_selective() {  # issue 16's memory target: bf16 batch 32, selective recompute vs none, alternated twice
  mkdir -p /tmp/levers
  {
    echo "| run | samples/s (steady) | planned MiB | allocated MiB | gradients in activations MiB | NVML used MiB | NVML minus baseline and context MiB | optimizer B/param | gradient B/param | activations MiB | last loss |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    for round in 1 2; do
      train_row levers "bf16_bs32_none_$round" --precision bf16 --per-device-train-batch-size 32 --num-samples 384
      train_row levers "bf16_bs32_selective_$round" --precision bf16 --per-device-train-batch-size 32 --num-samples 384 \
        --gradient-checkpointing selective
    done
  } | tee "$OUT/selective.md"
}

step_yardstick() {
  python3 tests/golden/bf16_yardstick.py --device cuda 2>/dev/null | tee "$OUT/bf16_yardstick.md"
}

step_levers() {
  mkdir -p /tmp/levers
  {
    echo "| run | samples/s (steady) | planned MiB | allocated MiB | gradients in activations MiB | NVML used MiB | NVML minus baseline and context MiB | optimizer B/param | gradient B/param | activations MiB | last loss |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    train_row levers seed_fp32_bs4 --precision fp32 --per-device-train-batch-size 4 --num-samples 512
    train_row levers seed_fp32_bs4_grads_own --precision fp32 --per-device-train-batch-size 4 --num-samples 512 \
      --gradient-placement own
    train_row levers seed_fp32_bs4_selective --precision fp32 --per-device-train-batch-size 4 --num-samples 512 \
      --gradient-checkpointing selective
    for o in adamw adamw-8bit sgd adafactor; do
      train_row levers "bf16_bs32_$o" --precision bf16 --per-device-train-batch-size 32 --num-samples 384 --optim $o
    done
    for c in selective layer; do
      train_row levers "bf16_bs32_ckpt_$c" --precision bf16 --per-device-train-batch-size 32 --num-samples 384 \
        --gradient-checkpointing $c
    done
    train_row levers bf16_bs8_accum4 --precision bf16 --per-device-train-batch-size 8 --gradient-accumulation-steps 4 \
      --num-samples 384
  } | tee "$OUT/levers.md"
  $a plan --preset bert-large --max-seq-length 512 --batch-size 4 --precision fp32 --gpu-memory 16GB 2>&1 | tee "$OUT/plan_v100.txt"
}

step_eval() {
  scripts/make_eval_fixture.sh $a /tmp/large /tmp/varied.jsonl
  for order in --sort-by-length --no-sort-by-length; do
    for sp in --skip-padding --no-skip-padding; do
      timeout 100 $a eval --model-name-or-path /tmp/large --eval-file /tmp/varied.jsonl --max-seq-length 512 \
        --per-device-eval-batch-size 64 --precision bf16 $order $sp > "$OUT/eval$order$sp.log" 2>&1
      echo "$order $sp: $(grep -E '^Samples/second|^Tokens' "$OUT/eval$order$sp.log" | tr '\n' ' ')"
    done
  done | tee "$OUT/eval_summary.txt"
}

step_probe() {
  { [ -x $b/anatomy_bench_attention ] && timeout 120 $b/anatomy_bench_attention
    timeout 120 python3 bench/attention_sdpa.py; } > "$OUT/attention.md" 2>&1
  cat "$OUT/attention.md"
  [ -x $b/anatomy_bench_step ] && timeout 150 $b/anatomy_bench_step > "$OUT/cuda_graph.md" 2>&1
  cat "$OUT/cuda_graph.md"
  timeout 150 $a train --seed-experiment --trace-memory-growth --output-dir /tmp/seed --disable-tqdm --logging-steps 0 \
    --save-strategy no > "$OUT/memtrace_seed.log" 2>&1
  grep -A40 "Memory anatomy" "$OUT/memtrace_seed.log"
}

step_attention() {
  local shape=(--batch 32 --seq 128 --seq 512 --head-dim 32 --head-dim 64)
  { timeout 200 $b/anatomy_bench_attention "${shape[@]}"
    ANATOMY_ATTENTION_FWD=mma ANATOMY_ATTENTION_BWD=mma timeout 200 $b/anatomy_bench_attention "${shape[@]}" | grep "^| anatomy"
    for be in flash cudnn; do timeout 200 python3 bench/attention_sdpa.py "${shape[@]}" --backend $be; done
  } > "$OUT/attention_table.md" 2>&1
  grep -E "^\| (anatomy|torch)" "$OUT/attention_table.md"
}

# The wgmma forward with and without its overlap (ANATOMY_ATTENTION_WGMMA=sync), and the mma.sync
# forward, on the attention table's shapes.
step_wgmmatiles() {
  local shape=(--batch 32 --seq 128 --seq 512 --head-dim 32 --head-dim 64)
  for mode in overlap sync mma; do
    ANATOMY_ATTENTION_WGMMA=$mode ANATOMY_ATTENTION_FWD=$([ $mode = mma ] && echo mma || echo wgmma) timeout 200 $b/anatomy_bench_attention "${shape[@]}" |
      grep "^| anatomy" | sed "s/^| anatomy [a-z]*\/[a-z]*/| $mode/"
  done | tee "$OUT/wgmma_tiles.md"
}

# The attention table's anatomy rows under each setting of ATTN_AB (NAME=VALUE of the environment;
# default: the backward kernels' variants) on ATTN_SHAPE (anatomy_bench_attention's shape flags),
# the settings alternated twice in one call, each row labelled with its setting.
step_attentionab() {
  local shape=(${ATTN_SHAPE:---batch 32 --seq 128 --seq 512 --head-dim 32 --head-dim 64}) round v setting
  local ab=(${ATTN_AB:-ANATOMY_ATTENTION_BWD=mma ANATOMY_ATTENTION_BWD=wgmma64 ANATOMY_ATTENTION_BWD_LOAD=cp.async
            ANATOMY_ATTENTION_BWD_DQ=atomics})
  for round in 1 2; do
    if [ -x .carry/before/anatomy_bench_attention ]; then
      timeout 100 .carry/before/anatomy_bench_attention "${shape[@]}" | grep "^| anatomy" |
        sed "s/^| anatomy [a-z0-9]*\/[a-z0-9]*/| before/"
    fi
    for v in "${ab[@]}"; do
      setting=()
      [ "$v" = default ] || setting=("$v")
      env "${setting[@]}" timeout 100 $b/anatomy_bench_attention "${shape[@]}" | grep "^| anatomy" |
        sed "s/^| anatomy [a-z0-9]*\/[a-z0-9]*/| ${v#ANATOMY_ATTENTION_}/"
    done
  done | tee "$OUT/attentionab.md"
}

step_gemmalgos() {
  nvcc -O2 -std=c++17 -arch=sm_90 bench/gemm_algos.cu -lcublasLt -o /tmp/gemm_algos || return
  # shellcheck disable=SC2086  # GEMMALGOS_ARGS: the token count, then --sustained
  /tmp/gemm_algos ${GEMMALGOS_ARGS:-} | tee "$OUT/gemm_algos.md"
}

step_realtext() {
  [ -f .carry/fortunes/train.jsonl ] || { echo "realtext: no .carry/fortunes (python3 bench/fortunes_dataset.py .carry/fortunes)"; return; }
  timeout 60 python3 bench/real_text.py --data .carry/fortunes --anatomy-bin $a --vocab tests/data/tokenizer/vocab.txt \
    --out "$OUT/smoke" --models tiny --epochs 1 --limit 256 --repeat 1 2>&1 | tail -8
  # shellcheck disable=SC2086  # REALTEXT_ARGS: more flags of bench/real_text.py (e.g. --repeat 1 --warmup-ratio 0.1)
  timeout 540 python3 bench/real_text.py --data .carry/fortunes --anatomy-bin $a --vocab tests/data/tokenizer/vocab.txt \
    --out "$OUT" ${REALTEXT_ARGS:-} 2>&1 | grep -v '^{' | tail -24
  rm -rf "$OUT/smoke"
}

# The real-text runs of two builds, .carry/before (scripts/stage_device.sh BEFORE=rev) and .carry/bin, alternated
# twice (before, this build, before, this build): REALTEXTAB_ARGS, default anatomy alone on real tokens, bert-base and
# MiniLM, 2 epochs. One real_text.md a run, the tables gathered in realtextab.md. REALTEXTAB_ENV (VAR=value ...):
# instead of .carry/before, this build under those settings (side "env").
step_realtextab() {
  [ -f .carry/fortunes/train.jsonl ] || { echo "realtextab: no .carry/fortunes (python3 bench/fortunes_dataset.py .carry/fortunes)"; return; }
  local first=before
  if [ -n "${REALTEXTAB_ENV:-}" ]; then first="env"; else
    [ -x .carry/before/anatomy ] || { echo "realtextab: no .carry/before (scripts/stage_device.sh BEFORE=rev)"; return; }
  fi
  local round side
  for round in 1 2; do
    for side in $first bin; do
      local bin=.carry/$side/anatomy settings=()
      [ "$side" = env ] && { bin=.carry/bin/anatomy; read -r -a settings <<<"$REALTEXTAB_ENV"; }
      # shellcheck disable=SC2086  # REALTEXTAB_ARGS: flags of bench/real_text.py
      env "${settings[@]}" timeout 240 python3 bench/real_text.py --data .carry/fortunes --anatomy-bin "$bin" \
        --vocab tests/data/tokenizer/vocab.txt --out "$OUT/realtextab_${side}_$round" \
        ${REALTEXTAB_ARGS:---only anatomy --anatomy-runs tokens --models bert-base,minilm --epochs 2 --repeat 1} \
        > "$OUT/realtextab_${side}_$round.log" 2>&1
      echo "== $side (round $round): exit $?"
      grep -E "^\| [a-z]" "$OUT/realtextab_${side}_$round/real_text.md" 2>/dev/null | grep -v "^| model"
    done
  done | tee "$OUT/realtextab.md"
}

# Fine-tuning after domain pretraining: each model (PRETEXT="model:mlm_lr ...", default MiniLM at 3e-4 and
# bert-base at 1e-4) pretrained by anatomy's masked LM on the train texts (PRETEXT_MLM_EPOCHS, default 30), then
# fine-tuned 3 epochs at lr 5e-5, warm-up 0.1: the Trainer in random order and anatomy on real tokens, padded and
# grouped (seed 0), then anatomy on real tokens and padded at seeds 1 and 2 (the seed-to-seed spread).
step_pretext() {
  [ -f .carry/fortunes/train.jsonl ] || { echo "pretext: no .carry/fortunes (python3 bench/fortunes_dataset.py .carry/fortunes)"; return; }
  local spec model mlr seed
  # Every path of the script first, on a tiny model and 256 samples: a failure here ends the step.
  timeout 120 python3 bench/real_text.py --data .carry/fortunes --anatomy-bin $a --vocab tests/data/tokenizer/vocab.txt \
    --out "$OUT/smoke" --models tiny --limit 256 --mlm-epochs 1 --epochs 1 --repeat 1 --trainer-runs random \
    --anatomy-runs tokens > /tmp/pretext_smoke.log 2>&1 || { tail -20 /tmp/pretext_smoke.log; return; }
  rm -rf "$OUT/smoke"
  for spec in ${PRETEXT:-minilm:3e-4 bert-base:1e-4}; do
    IFS=: read -r model mlr <<< "$spec"
    local common=(--data .carry/fortunes --anatomy-bin $a --vocab tests/data/tokenizer/vocab.txt --models "$model"
                  --mlm-epochs "${PRETEXT_MLM_EPOCHS:-30}" --mlm-lr "$mlr" --lr 5e-5 --warmup-ratio 0.1 --epochs 3 --repeat 1)
    timeout 300 python3 bench/real_text.py "${common[@]}" --trainer-runs random --out "$OUT/${model}_s0" 2>&1 | grep -v "^{" | tail -12
    for seed in 1 2; do
      timeout 120 python3 bench/real_text.py "${common[@]}" --only anatomy --anatomy-runs tokens,padded --seed $seed \
        --out "$OUT/${model}_s$seed" 2>&1 | grep "^|" | tail -2
    done
  done
  find "$OUT" -name real_text.jsonl -delete  # (the tables have them; the device tool returns few files)
}

step_tokenruns() {
  [ -f .carry/fortunes/train.jsonl ] || { echo "tokenruns: no .carry/fortunes (python3 bench/fortunes_dataset.py .carry/fortunes)"; return; }
  local mini base
  mini=$(real_text_model minilm /tmp/tokenruns/models)
  base=$(real_text_model bert-base /tmp/tokenruns/models)
  one() {  # tag model [prefix...]
    local tag=$1 model=$2
    shift 2
    timeout 120 "$@" $a train --model-name-or-path "$model" --train-file .carry/fortunes/train.jsonl --max-seq-length 256 \
      --per-device-train-batch-size 32 --precision bf16 --num-train-epochs 3 --learning-rate 1e-4 --seed 0 --device cuda \
      --save-strategy no --logging-steps 25 --disable-tqdm --output-dir "/tmp/tokenruns/$tag" \
      --dataset-cache-dir /tmp/tokenruns/cache > "/tmp/tokenruns/$tag.log" 2>&1 || cp "/tmp/tokenruns/$tag.log" "$OUT/"
    # One file for every run's metrics (the device tool brings back a few files only).
    python3 -c 'import json, sys
for line in open(sys.argv[1]): print(json.dumps(dict(json.loads(line), run=sys.argv[2])))' \
      "/tmp/tokenruns/$tag/metrics.jsonl" "$tag" >> "$OUT/tokenruns.metrics.jsonl"
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))
print(sys.argv[2], round(r["steady_samples_per_second"]), round(r["train_samples_per_second"]), round(r["data_wait_s"], 3))' \
      "/tmp/tokenruns/$tag/train_results.json" "$tag"
  }
  rm -f "$OUT/tokenruns.metrics.jsonl"
  {
    echo "run steady_samples_per_second train_samples_per_second data_wait_s"
    for i in 1 2 3 4; do one "minilm_$i" "$mini"; done
    for i in 1 2; do one "minilm_pin_$i" "$mini" taskset -c 2-5; done
    one bertbase_1 "$base"
  } | tee "$OUT/tokenruns.txt"
}

step_mbtext() {
  [ -f .carry/fortunes/train.jsonl ] || { echo "mbtext: no .carry/fortunes (python3 bench/fortunes_dataset.py .carry/fortunes)"; return; }
  timeout 560 python3 bench/real_text.py --data .carry/fortunes --anatomy-bin $a --vocab tests/data/tokenizer/vocab.txt \
    --out "$OUT/modernbert" --models modernbert --epochs 2 ${MBTEXT_ARGS:-} 2>&1 | grep -v '^{' | tail -14
}

# real_text_model NAME DIR: bench/real_text.py's model NAME (transformers' initialization, seed 0,
# the fortunes topics as labels, the test vocabulary) written under DIR; prints its directory.
real_text_model() {
  python3 -c 'import json, sys; sys.path.insert(0, "bench"); import real_text as r
labels = sorted({json.loads(l)["label"] for l in open(sys.argv[1])})
print(r.make_model(sys.argv[3], labels, sys.argv[2], sys.argv[4]))' \
    .carry/fortunes/train.jsonl tests/data/tokenizer/vocab.txt "$1" "$2" 2>/dev/null | tail -1
}

step_tokenprofile() {
  [ -f .carry/fortunes/train.jsonl ] || { echo "tokenprofile: no .carry/fortunes (python3 bench/fortunes_dataset.py .carry/fortunes)"; return; }
  # bench/real_text.py's model (TOKENPROFILE_MODEL, default bert-base): transformers' initialization,
  # seed 0, the topics as labels. Logs tokenprofile[_MODEL]_{tokens,grouped}.log, table tokenprofile[_MODEL].md.
  local name=${TOKENPROFILE_MODEL:-bert-base} model sfx=""
  [ "$name" = bert-base ] || sfx="_$name"
  model=$(real_text_model "$name" /tmp/tokenprofile/models)
  for run in tokens grouped; do
    local flags=()
    [ $run = grouped ] && flags=(--group-by-length --no-skip-padding)
    timeout 150 $a train --model-name-or-path "$model" --train-file .carry/fortunes/train.jsonl --max-seq-length 256 \
      --per-device-train-batch-size 32 --precision bf16 --num-train-epochs 1 --seed 0 "${quiet[@]}" --profile-steps 20 \
      --output-dir /tmp/tokenprofile/$name/$run "${flags[@]}" > "$OUT/tokenprofile${sfx}_$run.log" 2>&1
    echo "== $name $run: exit $?"
    grep -A40 "Time anatomy" "$OUT/tokenprofile${sfx}_$run.log" | head -45
    grep -E "Samples/second|steady" "$OUT/tokenprofile${sfx}_$run.log" | head -3
  done | tee "$OUT/tokenprofile${sfx}.md"
}

step_kernels() {
  [ -f .carry/fortunes/train.jsonl ] || { echo "kernels: no .carry/fortunes (python3 bench/fortunes_dataset.py .carry/fortunes)"; return; }
  local name=${TOKENPROFILE_MODEL:-minilm} model
  model=$(real_text_model "$name" /tmp/kernels/models)
  timeout 200 ncu --launch-skip 20000 --launch-count 1000 --metrics gpu__time_duration.sum --csv --print-units base \
    $PWD/$a train --model-name-or-path "$model" --train-file .carry/fortunes/train.jsonl --max-seq-length 256 \
    --per-device-train-batch-size 32 --precision bf16 --num-train-epochs 1 --seed 0 "${quiet[@]}" \
    --output-dir /tmp/kernels/out --overwrite-output-dir > "$OUT/kernels_$name.csv" 2> "$OUT/kernels_$name.log"
  python3 scripts/kernel_times.py "$OUT/kernels_$name.csv" | tee "$OUT/kernels_$name.md"
}

step_packed() {
  GTEST_FILTER='Registry/OpTwin.*attention*:OpTwinLong.*:PackedTrainingCuda.*:RowsCuda.*' \
    timeout 200 $b/anatomy_gpu_tests > "$OUT/gpu_tests_packed.log" 2>&1
  passed "$OUT/gpu_tests_packed.log"
  step_tokenprofile
}

step_fp8() {  # issue 16 point 5 (Note [fp8 training]): tests, the per-op profile, the side-by-side, real-text loss curves
  GTEST_FILTER="${GTEST_FILTER:-*Fp8*:*fp8*}" CUBLASLT_LOG_LEVEL=1 timeout 240 $b/anatomy_gpu_tests > "$OUT/fp8_tests.log" 2>&1
  passed "$OUT/fp8_tests.log"
  grep -E "bert-tiny 60 steps|cublasLt|Failure|Expected|Which is|fallback" "$OUT/fp8_tests.log" | head -30
  timeout 150 $a train --preset bert-large --max-seq-length 512 --precision fp8 --per-device-train-batch-size 32 \
    --num-samples 640 "${quiet[@]}" --output-dir /tmp/fp8prof --profile-steps 3 > "$OUT/profile_fp8_bs32.log" 2>&1
  grep -E "tensor_contraction|statistical|elementwise|optimizer|^Time|^Samples|^ +(fp8 matmul|matmul|bias_grad)" \
    "$OUT/profile_fp8_bs32.log"
  timeout 320 python3 bench/side_by_side.py --out "$OUT/side" --anatomy-bin "$a" --configs fp8_bs32 --timeout 150 \
    --budget 300 2>&1 | tail -10
  [ -f .carry/fortunes/train.jsonl ] || { echo "fp8: no .carry/fortunes for the loss curves"; return; }
  for p in bf16 fp8; do
    timeout 150 python3 bench/real_text.py --data .carry/fortunes --anatomy-bin $a --vocab tests/data/tokenizer/vocab.txt \
      --out "$OUT/text_$p" --models bert-base --only anatomy --anatomy-runs tokens --repeat 1 --epochs 3 --precision $p \
      --logging-steps 25 2>&1 | tail -3
  done
}

# fp8 against bf16 on the real text (.carry/fortunes), anatomy on real tokens, one run each:
# FP8CURVES="model:lr:epochs:warmup_ratio ..." (default MiniLM lr 5e-4 and bert-base lr 1e-4, 10
# epochs, warm-up 0.1; bert-base from these random weights stays in the majority class at lr 1e-4
# or 2e-4 without warm-up); FP8CURVES_PRECISIONS (default "bf16 fp8 fp8-e4m3": fp8 with E5M2 and
# with E4M3 output gradients), FP8CURVES_SEEDS (anatomy's --seed, default "0"); the table and the loss
# every 25 steps in text_<model>_<lr>_<precision>_s<seed>/.
step_fp8curves() {
  [ -f .carry/fortunes/train.jsonl ] || { echo "fp8curves: no .carry/fortunes"; return; }
  for spec in ${FP8CURVES:-minilm:5e-4:10:0.1 bert-base:1e-4:10:0.1}; do
    IFS=: read -r model lr epochs warmup <<< "$spec"
    for seed in ${FP8CURVES_SEEDS:-0}; do
      for p in ${FP8CURVES_PRECISIONS:-bf16 fp8 fp8-e4m3}; do
        local dir="$OUT/text_${model}_${lr}_${p}_s$seed"
        timeout 200 python3 bench/real_text.py --data .carry/fortunes --anatomy-bin $a --vocab tests/data/tokenizer/vocab.txt \
          --out "$dir" --models $model --only anatomy --anatomy-runs tokens --repeat 1 --epochs $epochs --lr $lr \
          --warmup-ratio "${warmup:-0}" --precision $p --seed $seed --logging-steps 25 > /dev/null 2>&1
        rm -f "$dir/real_text.jsonl"  # (the table has it; the device tool returns few files)
        echo "$p seed $seed $(tail -1 "$dir/real_text.md")"
      done
    done
  done
  python3 bench/fp8_curves_table.py "$OUT" > "$OUT/fp8curves.md"
}

step_bench() {
  local extra=()
  eval "extra=(${BENCH_ARGS:-})"  # BENCH_ARGS: other flags of bench/side_by_side.py, shell-quoted (later ones win)
  python3 bench/side_by_side.py --out "$OUT" --anatomy-bin "$a" \
    --configs seed,seed_own,bf16_bs4,bf16_bs32,layer_bs32,best --batches 32,48,64 --timeout 200 --budget 560 \
    "${extra[@]}" 2>&1 | grep -v '^{' | tail -40
}

# The header of a table of scripts/results_row.py dist rows; $1 names the first column.
dist_header() {
  echo "| $1 | GPUs | ZeRO stage | samples/s (steady) | first step loss | last step loss | optimizer state MiB per rank | NVML used MB per GPU | SM clock, power (steady, median) |"
  echo "|---|---|---|---|---|---|---|---|---|"
}

step_dist() {
  mkdir -p /tmp/dist
  {
    dist_header run
    train_row dist bf16_bs32_1gpu --precision bf16 --per-device-train-batch-size 32 --num-samples 1024
    for z in 0 1 2; do
      train_row dist "bf16_bs32_2gpu_z$z" --precision bf16 --per-device-train-batch-size 32 --num-samples 2048 \
        --nproc-per-node 2 --zero-stage $z
    done
    # The overlap (Note [bucketed reduction]): one bucket when backward ends hides nothing.
    train_row dist bf16_bs32_2gpu_z1_one_bucket --precision bf16 --per-device-train-batch-size 32 --num-samples 2048 \
      --nproc-per-node 2 --zero-stage 1 --ddp-bucket-cap-mb 65536
    # ZeRO-2's memory: with accumulation only a shard of the summed gradients is kept.
    for z in 1 2; do
      train_row dist "bf16_bs16x2_2gpu_z$z" --precision bf16 --per-device-train-batch-size 16 \
        --gradient-accumulation-steps 2 --num-samples 2048 --nproc-per-node 2 --zero-stage $z
    done
  } | tee "$OUT/dist.md"
}

# setting_row KIND ID SETTING FLAGS...: train_row KIND ID with FLAGS and SETTING, whose VAR=value words go
# to the environment and the rest to the flags.
setting_row() {
  local kind=$1 id=$2 words flags=() envs=() w a=$a
  read -ra words <<< "$3"
  shift 3
  for w in "${words[@]}"; do
    if [[ $w == BUILD=* ]]; then a=.carry/${w#BUILD=}/anatomy  # BUILD=before: .carry/before's binary
    elif [[ $w == [A-Z]*=* ]]; then envs+=("$w"); else flags+=("$w"); fi
  done
  (((${#envs[@]})) && export "${envs[@]}"; train_row "$kind" "$id" "$@" "${flags[@]}")
}

# ab_table NAME SETTINGS FLAGS...: the table (results_row.py dist) of each ';'-separated setting over FLAGS,
# alternated twice; runs /tmp/dist/NAME_s<setting>_r<round>.
ab_table() {
  local kind=dist name=$1 settings i round
  IFS=';' read -ra settings <<< "$2"
  shift 2
  mkdir -p "/tmp/$kind"
  for i in "${!settings[@]}"; do echo "- s$i: '${settings[i]:-the defaults}'"; done
  echo
  dist_header "setting, round"
  for round in 1 2; do
    for i in "${!settings[@]}"; do setting_row "$kind" "${name}_s${i}_r$round" "${settings[i]}" "$@"; done
  done
}

step_distab() {
  local base=(--precision bf16 --per-device-train-batch-size 32 --num-samples 2048 --nproc-per-node 2 --zero-stage 1)
  local settings="${DISTAB:-;--ddp-bucket-cap-mb 65536;--ddp-bucket-cap-mb 100;NCCL_MAX_CTAS=8}" i
  {
    ab_table distab "$settings" "${base[@]}"
    echo
    IFS=';' read -ra settings <<< "$settings"
    for i in 0 1; do
      setting_row dist "distab_s${i}_profile" "${settings[i]}" "${base[@]}" --profile-steps 4 >/dev/null
      echo "- s$i profiled: $(grep -h 'gradient reduction\|backward/forward' "/tmp/dist/distab_s${i}_profile.log" | tr -s ' ' | paste -sd' ')"
    done
  } | tee "$OUT/distab.md"
}

# One GPU: bert-large bf16 batch 32 under each TRAINAB setting (default: GEMM tuning off and on), alternated
# twice; then each setting profiled (--profile-steps 3: its matmul lines) and the tuned run's gemm_tuning.md.
step_trainab() {
  local base=(--precision bf16 --per-device-train-batch-size 32 --num-samples 1920)
  local settings="${TRAINAB:-;--gemm-tuning measure}" i
  {
    ab_table trainab "$settings" "${base[@]}"
    echo
    IFS=';' read -ra settings <<< "$settings"
    for i in "${!settings[@]}"; do
      setting_row dist "trainab_s${i}_profile" "${settings[i]}" "${base[@]}" --profile-steps 3 >/dev/null
      echo "- s$i profiled:"
      grep -hE "one step|${TRAINAB_OPS:-matmul}" "/tmp/dist/trainab_s${i}_profile.log" | sed 's/^/    /'
    done
  } | tee "$OUT/trainab.md"
  cat /tmp/dist/trainab_s1_profile/gemm_tuning.md 2>/dev/null | tee "$OUT/gemm_tuning.md"
}

# nvidia-smi's samples every 100 ms (scripts/power_summary.py's columns) into $1 until killed.
power_samples() {
  local smi=(nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw,enforced.power.limit,temperature.gpu)
  nvidia-smi --query-gpu=clocks_event_reasons.active --format=csv >/dev/null 2>&1 && smi[1]+=,clocks_event_reasons.active \
    || smi[1]+=,clocks_throttle_reasons.active
  exec "${smi[@]}" --format=csv,noheader,nounits -lms 100 > "$1"
}

step_power() {
  local pid side
  for side in torch anatomy; do
    power_samples "$OUT/power_$side.csv" & pid=$!
    sleep 1
    if [ $side = torch ]; then
      timeout 200 python3 bench/hf_anchor.py torch_bf16_bs32 --steps 120 > "$OUT/power_torch.log" 2>&1
    else
      timeout 200 $a train --preset bert-large --seq-len 512 --precision bf16 --per-device-train-batch-size 32 \
        --num-samples 3840 "${quiet[@]}" --output-dir /tmp/power > "$OUT/power_anatomy.log" 2>&1
    fi
    kill $pid; wait $pid 2>/dev/null
  done
  {
    python3 scripts/power_summary.py torch="$OUT/power_torch.csv" anatomy="$OUT/power_anatomy.csv"
    echo
    echo "- PyTorch loop: $(grep -o '"steady_samples_per_s": *[0-9.]*' "$OUT/power_torch.log")"
    echo "- anatomy: $(grep -o '"steady_samples_per_second": *[0-9.]*' /tmp/power/train_results.json)"
  } | tee "$OUT/power.md"
}

step_attnpower() {  # the attention ops alone, long enough to hold the power limit, with the board's power beside
  local pid
  power_samples "$OUT/power_attention.csv" & pid=$!
  sleep 1
  timeout 150 $b/anatomy_bench_attention --batch 32 --seq 512 --head-dim 64 --reps 8000 --warmup 800 \
    > "$OUT/attnpower.log" 2>&1
  kill $pid; wait $pid 2>/dev/null
  { python3 scripts/power_summary.py attention="$OUT/power_attention.csv"; echo; grep "^|" "$OUT/attnpower.log"; } \
    | tee "$OUT/attnpower.md"
}

step_stepab() {  # same shapes, the two builds alternated twice: A B A B
  [ -x .carry/before/anatomy_bench_step ] || { echo "stepab: no .carry/before (scripts/stage_device.sh BEFORE=rev)"; return; }
  for round in 1 2; do
    for side in before bin; do
      echo "== $side (round $round)"
      timeout 150 .carry/$side/anatomy_bench_step 2>&1 | tail -6
    done
  done | tee "$OUT/stepab.md"
}


# The per-op profile of bert-large bf16 batch 32 for .carry/before (when staged) and .carry/bin,
# the lines of `pattern` (an extended regex of op names) and the totals.
profile_sides() {
  local pattern=$1 side bin
  for side in before bin; do
    bin=.carry/$side/anatomy
    [ -x "$bin" ] || continue
    echo "== $side: bert-large bf16 batch 32, per op"
    timeout 150 $bin train --preset bert-large --max-seq-length 512 --precision bf16 --per-device-train-batch-size 32 \
      --num-samples 640 "${quiet[@]}" --output-dir "/tmp/profile_$side" --profile-steps 3 > "$OUT/profile_$side.log" 2>&1
    grep -E "^Time|one step|forward .* backward|^ +($pattern) " "$OUT/profile_$side.log"
  done
}


step_opsab() {
  local round side
  for round in 1 2; do
    for side in before bin; do
      [ -x .carry/$side/anatomy_bench_ops ] || continue
      echo "== $side (round $round)"
      timeout 150 .carry/$side/anatomy_bench_ops 2>&1 | grep -E "^\| "
    done
  done | tee "$OUT/opsab_bench_ops.md"
  profile_sides "[a-z_+()]+" | tee "$OUT/opsab.md"
}

step_envab() {  # ENVAB: one or more VAR=value settings, each a "with" side; ENVAB_OPS: op lines to profile
  local round setting i cfg=(--config bert-large:bf16:32:512)
  for round in 1 2; do
    echo "== without (round $round)"
    timeout 150 $b/anatomy_bench_step "${cfg[@]}" 2>&1 | tail -1
    i=0
    for setting in ${ENVAB:-}; do
      i=$((i + 1))
      echo "== with $setting (round $round)"
      local v items envs=() args=()
      IFS=, read -ra items <<< "$setting"  # VAR=value items go to the environment, --flag items to the command
      for v in "${items[@]}"; do if [[ $v == --* ]]; then args+=("$v"); else envs+=("$v"); fi; done
      env "${envs[@]}" timeout 200 $b/anatomy_bench_step "${cfg[@]}" "${args[@]}" > "$OUT/envab_with_${i}_$round.log" 2>&1
      tail -1 "$OUT/envab_with_${i}_$round.log"
    done
  done | tee "$OUT/envab.md"
  [ -n "${ENVAB_OPS:-}" ] || return 0
  for setting in "" ${ENVAB:-}; do  # one per-op profile a side: the lines of ENVAB_OPS (a regex of op names)
    echo "== ${setting:-without}: bert-large bf16 batch 32, per op"
    env $setting timeout 150 $b/anatomy train --preset bert-large --max-seq-length 512 --precision bf16 \
      --per-device-train-batch-size 32 --num-samples 640 "${quiet[@]}" --output-dir /tmp/envab_profile \
      --overwrite-output-dir --profile-steps 3 2>&1 | grep -E "one step|^ +($ENVAB_OPS) "
  done | tee "$OUT/envab_ops.md"
}

step_ncu() {
  local op sections=(--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
                     --section InstructionStats --section ComputeWorkloadAnalysis)
  {
    for op in ${NCU_OPS:-gelu_forward gelu_backward layernorm_forward layernorm_backward}; do
      echo "=== $op"
      timeout 150 ncu --clock-control none "${sections[@]}" --launch-count 6 \
        $b/anatomy_bench_ops --registry --op "$op" --reps 2 --warmup 0 2>&1
    done
    echo "=== attention B 32 T 512 D 64 (p 0.1, then p 0)"
    timeout 150 ncu --clock-control none "${sections[@]}" --kernel-name regex:wgmma --launch-count 4 \
      $b/anatomy_bench_attention --batch 32 --seq 512 --head-dim 64 --reps 1 --warmup 0 2>&1
  } > "$OUT/ncu.txt"
  # The static instruction mix of the same kernels (the attention forward with and without dropout).
  cuobjdump -sass $b/anatomy_bench_attention 2>/dev/null \
    | python3 scripts/sass_mix.py 'wgmma_fwd_kernel|wgmma_bwd_kernel|map1_kernel|column_sum_vec|ln_forward|ln_backward' \
    > "$OUT/sass_mix.txt"
  cat "$OUT/sass_mix.txt" | head -80
  grep -E "^=== |^  [A-Za-z_].*\(|Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Issue Slots Busy|Executed Ipc A|Warp Cycles Per Issued|Block Size|Grid Size|Executed Instructions  |Pipe" \
    "$OUT/ncu.txt" | head -300
}

# The attention backward under Nsight Compute, every section, with its SASS stall samples
# (ncu_attn_bwd.txt: details of the p 0.1 and p 0 launches; ncu_attn_bwd_sass.csv: per instruction).
step_ncuattn() {  # NCU_KERNEL=wgmma_fwd: the forward (files ncu_wgmma_fwd*; the default's are ncu_attn_bwd*)
  local k=${NCU_KERNEL:-wgmma_bwd} name
  name=$([ "$k" = wgmma_bwd ] && echo attn_bwd || echo "$k")
  timeout 240 ncu --clock-control none --set full --import-source yes --kernel-name "regex:$k" --launch-count 2 \
    -f -o "$OUT/$name" $b/anatomy_bench_attention --batch 32 --seq 512 --head-dim 64 --reps 1 --warmup 0 \
    > "$OUT/ncu_${name}_run.log" 2>&1
  ncu -i "$OUT/$name.ncu-rep" --page details > "$OUT/ncu_$name.txt" 2>&1
  ncu -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass --launch-count 1 \
    > "$OUT/ncu_${name}_sass.csv" 2>&1
  rm -f "$OUT/$name.ncu-rep"
  grep -E "Duration|SM Frequency|Issue Slots Busy|Executed Ipc A|Warp Cycles Per Issued|Registers Per|Achieved Occ|Shared Memory|Stall|stall" \
    "$OUT/ncu_$name.txt" | head -60
}

# Nsight Compute's every section on the kernels matching NCU_KERNEL (default the LayerNorm backward's group
# kernel) in anatomy_bench_ops at bert-large shapes, one launch of each of its rows (warm-up 0), with the
# per-instruction samples: ncu_ops.txt, ncu_ops_sass.csv (scripts/ncu_stalls.py reads it).
step_ncuops() {
  local k=${NCU_KERNEL:-ln_backward_group}
  timeout 240 ncu --clock-control none --set full --import-source yes --kernel-name "regex:$k" --launch-count 3 \
    -f -o "$OUT/ops" $b/anatomy_bench_ops --reps 1 --warmup 0 > "$OUT/ncu_ops_run.log" 2>&1
  ncu -i "$OUT/ops.ncu-rep" --page details > "$OUT/ncu_ops.txt" 2>&1
  ncu -i "$OUT/ops.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_ops_sass.csv" 2>&1
  rm -f "$OUT/ops.ncu-rep"
  grep -E "^  [a-z_]+.*\(|Duration|Memory Throughput|DRAM Throughput|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|Achieved Occ|Theoretical Occ|Block Limit" \
    "$OUT/ncu_ops.txt" | head -60
  local i
  for i in 0 1 2; do python3 scripts/ncu_stalls.py "$OUT/ncu_ops_sass.csv" --kernel $i --top 8 2>&1 | head -40; done
}

step_launch() {
  export ANATOMY_DIST_TIMEOUT=60
  local w=$PWD/.carry/bin/anatomy_pg_worker gpus
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  run_check() {  # name, command...: status, seconds, ranks bitwise equal; output in $OUT/name.log
    local name=$1; shift
    local t0=$EPOCHREALTIME
    timeout 150 "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    local cmd="$*"
    cmd=$(tr -s ' \n' ' ' <<< "$cmd")  # one table line
    echo "| $name | $rc | $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') | $(grep -c 'bitwise equal' "$OUT/$name.log") | \`${cmd% }\` |"
  }
  local tiny=(train --device cpu --preset bert-tiny --num-samples 96 --max-steps 6 --per-device-train-batch-size 4
              --disable-tqdm --overwrite-output-dir)
  {
    echo "| check | exit status | seconds | ranks bitwise equal | command |"
    echo "|---|---|---|---|---|"
    run_check gloo_torchrun_3 torchrun --no-python --nproc-per-node 3 $w check
    run_check train_cpu_torchrun_3 torchrun --no-python --nproc-per-node 3 $a "${tiny[@]}" --output-dir /tmp/launch/cpu3
    run_check train_gpu_torchrun_1 torchrun --no-python --nproc-per-node 1 $a train --device cuda --preset bert-base \
      --max-seq-length 128 --num-samples 512 --max-steps 20 --per-device-train-batch-size 32 --precision bf16 \
      --disable-tqdm --overwrite-output-dir --output-dir /tmp/launch/gpu1
    # Rank 1 joins the store and dies before NCCL's init: rank 0 must end with the error in seconds
    # (Note [non-blocking NCCL]); one GPU is enough, the lost rank never touches one.
    run_check nccl_rank_lost_after_join bash -c "
      export ANATOMY_PG_DEVICE=cuda MASTER_ADDR=127.0.0.1 MASTER_PORT=29631 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2
      RANK=1 LOCAL_RANK=1 $w vanish 1 & RANK=0 LOCAL_RANK=0 $w vanish 1; s=\$?; wait; exit \$s"
    if ((gpus >= 2)); then
      run_check nccl_torchrun_2 env ANATOMY_PG_DEVICE=cuda torchrun --no-python --nproc-per-node 2 $w check
      run_check nccl_sockets_2nodes bash -c "
        export ANATOMY_PG_DEVICE=cuda NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo
        CUDA_VISIBLE_DEVICES=0 torchrun --no-python --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29611 $w check &
        CUDA_VISIBLE_DEVICES=1 torchrun --no-python --nnodes 2 --node-rank 1 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29611 $w check
        wait"
      run_check nccl_rank_fails env ANATOMY_PG_DEVICE=cuda torchrun --no-python --nproc-per-node 2 $w fail 1
      run_check train_gpu_torchrun_2 torchrun --no-python --nproc-per-node 2 $a train --device cuda --preset bert-base \
        --max-seq-length 128 --num-samples 512 --max-steps 20 --per-device-train-batch-size 32 --precision bf16 \
        --disable-tqdm --overwrite-output-dir --output-dir /tmp/launch/gpu2
    else
      echo "| nccl checks | - | - | - | need two GPUs (this machine has $gpus) |"
    fi
  } | tee "$OUT/launch.md"
  grep -h "Samples/second\|error" "$OUT"/train_*.log | head -8
}

step_launchab() {
  [ -x .carry/before/anatomy ] || { echo "launchab: no .carry/before (scripts/stage_device.sh BEFORE=rev)"; return; }
  local i side t0 rc
  {
    echo "| build | round | exit status | wall s | steady samples/s | train_runtime s |"
    echo "|---|---|---|---|---|---|"
    for i in 1 2; do
      for side in before bin; do
        t0=$EPOCHREALTIME
        timeout 150 torchrun --no-python --nproc-per-node 2 ".carry/$side/anatomy" train --device cuda --preset bert-base \
          --max-seq-length 128 --num-samples 20000 --max-steps 300 --per-device-train-batch-size 32 --precision bf16 \
          --disable-tqdm --overwrite-output-dir --output-dir "/tmp/launchab/$side$i" > "$OUT/launchab_$side$i.log" 2>&1
        rc=$?
        echo "| $side | $i | $rc | $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }') | $(python3 -c "
import json; d = json.load(open('/tmp/launchab/$side$i/train_results.json'))
print(round(d['steady_samples_per_second'], 1), '|', d['train_runtime'])" 2>/dev/null || echo "- | -") |"
      done
    done
  } | tee "$OUT/launchab.md"
}

(($#)) || { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
for s in "$@"; do
  declare -F "step_$s" >/dev/null || { echo "device.sh: unknown step '$s'" >&2; exit 2; }
done
[ -x .carry/bin/anatomy ] || tar -C .carry -xJf .carry/bundle.tar.xz
[ -f .carry/before.tar.xz ] && [ ! -d .carry/before ] && tar -C .carry -xJf .carry/before.tar.xz
for s in "$@"; do
  echo "== $s ($(date +%T))"
  "step_$s"
done
# The device tool brings back about eight files of $OUT: past that, everything goes back as one
# archive (out.tgz; `tar -xzf` it into the results folder).
if [ "$(find "$OUT" -type f | wc -l)" -gt 8 ]; then
  tar -C "$OUT" -czf /tmp/device_out.tgz . && find "$OUT" -mindepth 1 -delete && mv /tmp/device_out.tgz "$OUT/out.tgz"
  echo "(more than 8 files: all in $OUT/out.tgz)"
fi
