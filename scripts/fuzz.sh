#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) into build-fuzz and runs each for N seconds
# (default 20) on its committed corpus in tests/fuzz/corpus/<target>. Exits non-zero when any
# target finds a crash, a leak, undefined behaviour or a timeout; the input that triggered it is
# left in build-fuzz/findings/<target>/.
#   scripts/fuzz.sh [SECONDS] [TARGET...]       targets: safetensors config vocab tokenizer text_dataset
# New inputs go to build-fuzz/corpus/<target>, never into the committed corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-20}"
shift || true
targets=("$@")
((${#targets[@]})) || targets=(safetensors config vocab tokenizer text_dataset)

command -v clang++ >/dev/null || { echo "fuzz: clang++ not found (scripts/setup.sh installs it)" >&2; exit 1; }
if [ ! -f build-fuzz/build.ninja ]; then
  CXX=clang++ cmake -S tests/fuzz -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
if ! cmake --build build-fuzz -j "$(nproc)" --target $(printf 'fuzz_%s ' "${targets[@]}") \
     >build-fuzz/build.log 2>&1; then
  echo "fuzz: building the targets failed; the errors in build-fuzz/build.log:" >&2
  grep -E "error|undefined reference" build-fuzz/build.log | head -n 20 >&2
  exit 1
fi

# Largest input per target: a few header/record sizes, kept small so each second covers many.
declare -A max_len=([safetensors]=4096 [config]=4096 [vocab]=8192 [tokenizer]=4096 [text_dataset]=8192)
failed=()
for t in "${targets[@]}"; do
  work="build-fuzz/corpus/$t" findings="build-fuzz/findings/$t"
  mkdir -p "$work" "$findings"
  log="build-fuzz/fuzz_$t.log"
  echo "fuzz: $t for ${secs}s"
  if ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
     "build-fuzz/fuzz_$t" "$work" "tests/fuzz/corpus/$t" -max_total_time="$secs" \
       -max_len="${max_len[$t]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$findings/" >"$log" 2>&1; then
    grep -E "^stat::number_of_executed_units|^Done" "$log" | tr '\n' ' ' | sed 's/^/fuzz:   /'; echo
  else
    echo "fuzz: $t FAILED; the last lines of $log:" >&2
    tail -n 30 "$log" >&2
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: findings in ${failed[*]} (inputs in build-fuzz/findings/)" >&2
  exit 1
fi
echo "fuzz: no findings"
