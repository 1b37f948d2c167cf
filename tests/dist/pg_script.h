// The collectives a process-group test runs, on buffers every rank fills alike from (rank, index):
// one function, run by each process of a real group (tests/dist/pg_worker.cpp) and by each
// thread of the in-process group (the expected bytes), so the two can be compared bitwise.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dist/communicator.h"
#include "memory/category.h"
#include "ops/backend.h"

namespace anatomy::pg_test {

// Values of mixed signs and magnitudes (so the order of a sum shows in its bits), -0.0 included;
// or, `exact`, small whole numbers, whose sums are exact in any order (NCCL's order is its own).
inline float value(int rank, size_t i, bool exact = false) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(rank + 1) * 40503u;
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  if (exact) return static_cast<float>(static_cast<int>(h % 201) - 100);
  if (h % 97 == 0) return -0.0f;
  const float mant = static_cast<float>(h & 0xffff) / 65536.0f - 0.5f;
  return std::ldexp(mant, static_cast<int>((h >> 16) % 24) - 12);
}

inline void append(std::vector<char>& out, const void* p, size_t bytes) {
  out.insert(out.end(), static_cast<const char*>(p), static_cast<const char*>(p) + bytes);
}

// Runs every collective once on a buffer of `be`'s device (filled from and read back to the
// host around each); returns what this rank holds after each.
inline std::vector<char> run_script(Communicator& comm, Backend& be, bool exact = false, size_t n = 10007) {
  const int rank = comm.rank(), world = comm.size();
  std::vector<char> out;
  std::vector<float> buf(n);
  void* mem = be.allocator().allocate(n * sizeof(float), Category::Temporary);
  const Tensor t(mem, DType::F32, Shape{static_cast<int64_t>(n)}, be.device());
  auto fill = [&](int salt) {
    for (size_t i = 0; i < n; ++i) buf[i] = value(rank * 7 + salt, i, exact);
    be.upload(t, buf.data());
  };
  auto keep = [&] {
    be.download(buf.data(), t);
    be.synchronize();
    append(out, buf.data(), n * sizeof(float));
  };
  fill(0);
  comm.all_reduce_sum(t);
  keep();
  for (size_t align : {size_t{16}, size_t{4096}}) {  // uneven shards; with 4096 and 3 ranks a short last one
    const std::vector<ShardRange> shards = shard_ranges(n, world, align);
    fill(1);
    comm.reduce_scatter_sum(t, shards);
    keep();
    fill(2);
    comm.all_gather(t, shards);
    keep();
  }
  {  // shards past the end are empty: with align 4096 rank 0 owns all of a short buffer
    const std::vector<ShardRange> shards = shard_ranges(100, world);
    const Tensor s = t.slice(0, 100);
    fill(3);
    comm.reduce_scatter_sum(s, shards);
    keep();
    fill(4);
    comm.all_gather(s, shards);
    keep();
  }
  {  // a 16-bit buffer (the half weights ZeRO gathers): the float buffer's bytes as 2n BF16 elements
    const Tensor h(mem, DType::BF16, Shape{static_cast<int64_t>(2 * n)}, be.device());
    fill(5);
    comm.all_gather(h, shard_ranges(2 * n, world, 16));
    keep();
  }
  be.allocator().deallocate(mem, n * sizeof(float), Category::Temporary);
  for (Communicator::Op op : {Communicator::Op::Sum, Communicator::Op::Max, Communicator::Op::Min}) {
    std::vector<double> h = {0.1 * (rank + 1), -1e-17 * rank, 1e16 + rank, static_cast<double>(rank % 2)};
    comm.all_reduce_host(h, op);
    append(out, h.data(), h.size() * sizeof(double));
  }
  std::vector<double> b = {1.5 * rank, -2.0 * rank, 3.0};
  comm.broadcast_host(b, world - 1);
  append(out, b.data(), b.size() * sizeof(double));
  comm.barrier();
  return out;
}

}  // namespace anatomy::pg_test
