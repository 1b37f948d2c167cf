#!/usr/bin/env bash
# Process groups on the two-GPU machine (nvidia-h200-x2; torchrun installed there), run through
# the device tool after scripts/stage_device.sh: NCCL through torchrun on one machine, as two
# "nodes" forced onto sockets, a rank that fails, and Gloo on the CPU under torchrun. Each rank of
# `anatomy_pg_worker check` compares every collective with an in-process group (bitwise) and
# prints one line. Output in $OUT (launch.md and the logs).
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-bench/results/tmp}
mkdir -p "$OUT"
[ -x .carry/bin/anatomy_pg_worker ] || tar -C .carry -xJf .carry/bundle.tar.xz
export LD_LIBRARY_PATH="$PWD/.carry/lib" OMP_WAIT_POLICY=PASSIVE ANATOMY_DIST_TIMEOUT=60
w=$PWD/.carry/bin/anatomy_pg_worker
step() {  # name, command...: its status and seconds in the table, its output in $OUT/name.log
  local name=$1; shift
  local t0=$(date +%s.%N)
  timeout 120 "$@" > "$OUT/$name.log" 2>&1
  local rc=$? t=$(echo "$(date +%s.%N) - $t0" | bc)
  echo "| $name | $rc | $t | $(grep -c 'bitwise equal' "$OUT/$name.log") | \`$*\` |"
}
{
  echo "| check | exit status | seconds | ranks bitwise equal | command |"
  echo "|---|---|---|---|---|"
  step nccl_torchrun_2 env ANATOMY_PG_DEVICE=cuda torchrun --no-python --nproc-per-node 2 $w check
  # Two "nodes" of one GPU each, NCCL over sockets on loopback (no P2P, no shared memory).
  step nccl_sockets_2nodes bash -c "
    export ANATOMY_PG_DEVICE=cuda NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo
    CUDA_VISIBLE_DEVICES=0 torchrun --no-python --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29611 $w check &
    CUDA_VISIBLE_DEVICES=1 torchrun --no-python --nnodes 2 --node-rank 1 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29611 $w check
    wait"
  # Rank 1 fails after a first barrier; rank 0 must end with an error within seconds (status != 0).
  step nccl_rank_fails env ANATOMY_PG_DEVICE=cuda torchrun --no-python --nproc-per-node 2 $w fail 1
  step gloo_torchrun_3 torchrun --no-python --nproc-per-node 3 $w check
} | tee "$OUT/launch.md"
grep -h "error" "$OUT/nccl_rank_fails.log" | head -5
