#!/usr/bin/env bash
# Builds the CUDA binaries here (sm_90a) and stages them, with the few shared libraries the GPU
# machine lacks (OpenBLAS and its Fortran runtime, utf8proc, Gloo), into .carry/ for the device tool:
# that machine has the CUDA toolkit and driver but none of our Debian build dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# BUILD_DIR=build reuses the test build (same flags: Release, CUDA on, sm_90a) instead of a second tree.
dir=${BUILD_DIR:-build-gpu}
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DANATOMY_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a "$@" >/dev/null
cmake --build "$dir" -j "$(nproc)"
rm -rf .carry && mkdir -p .carry/bin .carry/lib
cp "$dir/anatomy" "$dir/anatomy_tests" "$dir/anatomy_gpu_tests" .carry/bin/
for tool in anatomy_bench_step anatomy_bench_attention anatomy_bench_ops anatomy_pg_worker; do
  [ -x "$dir/$tool" ] && cp "$dir/$tool" .carry/bin/
done
# Gloo (CPU process groups; linked into every binary) and what it needs.
for lib in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libutf8proc.so.3 libutf8proc.so.2 \
           libgloo.so.0 libhiredis.so.0.14 libibverbs.so.1 libnl-route-3.so.200 libnl-3.so.200; do
  # awk reads to the end: leaving early would end ldconfig with SIGPIPE, which pipefail and -e
  # turn into a silent exit of this script when ldconfig had not finished writing.
  path=$(ldconfig -p | awk -v l="$lib" '$1 == l && !found {print $NF; found = 1}')
  [ -n "$path" ] && cp -L "$path" .carry/lib/
done
# The working tree that travels is limited to 64 MiB: strip and compress (OpenBLAS alone is 36 MB).
# xz -9's 64 MiB dictionary spans several binaries, so the kernels every one of them links are
# stored once: 46 MB at xz's default level, 15 MB at -9.
strip .carry/bin/*
XZ_OPT=-9 tar -C .carry -cJf .carry/bundle.tar.xz bin lib && rm -rf .carry/bin .carry/lib
# The commit the binaries were built from ("-dirty": with uncommitted changes), for the results'
# records: the device machine's copy of the repository may carry an older git base.
git describe --always --dirty > .carry/BUILD
# BEFORE=<rev>: also build that revision (a temporary worktree) and stage its binaries as
# .carry/before.tar.xz, for same-call before/after timings (scripts/device.sh stepab, opsab).
if [ -n "${BEFORE:-}" ]; then
  # Beside the checkout, so that ccache (CCACHE_BASEDIR above both) reuses the objects of the same sources.
  wt=$(mktemp -d "$(dirname "$PWD")/anatomy-before.XXXX")
  git worktree add -q --detach "$wt" "$BEFORE"
  cmake -S "$wt" -B "$wt/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DANATOMY_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DANATOMY_TESTS=OFF "$@" >/dev/null
  cmake --build "$wt/build" -j "$(nproc)" --target anatomy anatomy_bench_step anatomy_bench_ops
  mkdir -p .carry/before && cp "$wt/build/anatomy" "$wt/build/anatomy_bench_step" "$wt/build/anatomy_bench_ops" .carry/before/
  strip .carry/before/*
  XZ_OPT=-9 tar -C .carry -cJf .carry/before.tar.xz before && rm -rf .carry/before
  git worktree remove --force "$wt"
fi
du -sh .carry
