// Collectives between the ranks of a data-parallel run (one rank per device), and how the flat
// parameter buffers are split among them (ZeRO's shards: Note [ZeRO over the flat buffers] in
// dist/zero.h).
//
// Every rank of a group calls the same collectives in the same order, each on its own buffers of
// equal layout; the calls return once this rank's part is enqueued on its backend's stream (NCCL)
// or done (the in-process CPU group). Buffers are F32 (gradients, master weights, a norm).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "ops/backend.h"

namespace anatomy {

class Backend;

// Rank r owns elements [begin, end) of a flat buffer.
struct ShardRange {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};

// `world` near-equal shards of `total` elements; every boundary a multiple of `align` elements
// (the last shard takes the remainder; shards past the end are empty). The default is the
// gradient norm's block (kNormBlock), so every block has one owner (Note [canonical gradient
// norm] in optim/grad_norm.h) and shard starts stay 16-byte aligned in any dtype.
std::vector<ShardRange> shard_ranges(size_t total, int world, size_t align = kNormBlock);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // buf = sum over ranks of buf (every element, every rank).
  virtual void all_reduce_sum(const Tensor& buf) = 0;
  // Rank r's shard of buf = sum over ranks of that shard; the rest of buf is left as it was.
  virtual void reduce_scatter_sum(const Tensor& buf, const std::vector<ShardRange>& shards) = 0;
  // Every rank's shard of buf, copied from its owner to every rank: F32, or a 16-bit type whose
  // bits are copied (the half weights of Note [ZeRO gathers half weights] in dist/zero.h).
  virtual void all_gather(const Tensor& buf, const std::vector<ShardRange>& shards) = 0;
  // Small host values (metrics, loss scale decisions, counts): every rank ends with the same
  // values, combined element by element in rank order 0, 1, ..., size-1 (Sum: ((v0 + v1) + v2)...).
  enum class Op : uint8_t { Sum, Max, Min };
  virtual void all_reduce_host(std::span<double> v, Op op) = 0;
  virtual void broadcast_host(std::span<double> v, int root) = 0;
  virtual void barrier() = 0;
  // A barrier for ranks waiting on one that works alone (rank 0 loading the data, writing the
  // model or a checkpoint, predicting): it waits as long as that takes. A rank's failure ends it
  // (the failure watch); ANATOMY_DIST_TIMEOUT, which bounds Gloo's other collectives, does not
  // (NCCL's collectives have no bound of their own).
  virtual void wait_for_all() { barrier(); }
  // Between begin_async() and end_async(), all_reduce_sum and reduce_scatter_sum run on a side
  // stream of their own, each after the work enqueued so far on the backend's stream, so that
  // what the backend enqueues next overlaps them; end_async() makes the backend's stream wait
  // for them. Groups whose collectives are done when they return (the CPU ones) ignore both.
  virtual void begin_async() {}
  virtual void end_async() {}
  // Note [overlap timing]: while on (--profile-steps), a group whose collectives overlap
  // (overlaps(): NCCL's side stream) times them with events: `reduce_ms` is the time the side
  // stream spent in the collectives of begin_async..end_async regions, `exposed_ms` how long the
  // last of them ended after the backend's stream reached end_async (what backward did not
  // hide). take_overlap() waits for the events and starts the totals again. The CPU groups'
  // collectives block their caller: nothing overlaps, and the caller times them on the clock.
  struct OverlapTiming {
    double reduce_ms = 0, exposed_ms = 0;
  };
  virtual bool overlaps() const { return false; }
  virtual void time_overlap(bool) {}
  virtual OverlapTiming take_overlap() { return {}; }
  virtual const char* kind() const = 0;  // "local", "nccl" or "gloo"
  // A rank that fails calls this on its own communicator (any number of times): it leaves the
  // group, and collectives in flight or to come on the other ranks throw instead of waiting for
  // it forever (each of them then aborts too).
  virtual void abort() noexcept = 0;
};

// What a collective throws on a rank whose group another rank has left by abort(): the run's
// error is that other rank's, so a launcher reports it in preference to this one.
class GroupAborted : public Error {
 public:
  GroupAborted() : Error("data parallel: another rank of the group failed") {}
};

// out[i] = gathered[0][i] op gathered[1][i] op ... in rank order, where gathered holds `world`
// rows of out.size() values (row r from rank r): how every group combines host values.
void combine_in_rank_order(std::span<double> out, std::span<const double> gathered, int world, Communicator::Op op);

// In-process group for the CPU backend (and tests): `world` communicators whose ranks run on
// threads of one process, each on host buffers. Sums are taken in rank order 0, 1, ..., so a
// reduction is bitwise the same whichever collective does it.
std::vector<std::unique_ptr<Communicator>> make_local_group(int world);

// One NCCL communicator per CUDA device 0 .. world-1 of this process (ncclCommInitAll); rank r
// must run its collectives on backends[r]'s stream. Throws when NCCL or the devices are missing.
std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<Backend*>& backends);

}  // namespace anatomy
