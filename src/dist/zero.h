// The optimizer step of a rank (one device is a world of one): reduce the gradients over the
// ranks, clip by the global norm, update, and leave every rank with the same weights.
//
// Note [ZeRO over the flat buffers]
// Parameters, gradients and optimizer state are flat buffers in one layout (model/params.h), so
// ZeRO's partitioning is a split of [0, n) into one contiguous range per rank (shard_ranges;
// boundaries are element indices, not parameter boundaries, which the element-wise optimizers
// do not care about; the weight-decay boundary is carried into each shard).
//   stage 0: every rank all-reduces the whole gradient and runs the whole optimizer
//            (plain data parallelism; 8 bytes/param of AdamW state on every rank);
//   stage 1: the gradients are reduced to each shard's owner only (grouped ncclReduce), the
//            owner clips with the global norm (its blocks' partials, all-reduced: Note
//            [canonical gradient norm] in optim/grad_norm.h), updates its shard of the fp32
//            masters with its shard of the optimizer state (8/N bytes/param), and the updated
//            shards are broadcast back to every rank (grouped ncclBroadcast = all-gather;
//            in half precision the half copy, Note [ZeRO gathers half weights]).
//   stage 2: as stage 1, but the gradients are reduce-scattered after every micro-batch and each
//            rank accumulates only its shard, in a buffer of 4/N bytes/param (Gradients). The
//            full gradients are then needed only from one micro-batch's backward to its
//            reduction, so they live in activation memory backward is done with (Note
//            [gradients in freed activations]) even with accumulation, where stages 0 and 1
//            keep a full buffer of 4 bytes/param. With one micro-batch per step stage 2 is
//            stage 1 (no shard buffer). The shard sums micro-batches in the order
//            ((g0 + g1) + g2)..., each g already summed over ranks; stage 0 sums each rank's
//            micro-batches first, so with accumulation the two agree to rounding, not bitwise.
//
// Note [bucketed reduction]
// The reduction of a step's last backward (every backward under stage 2) overlaps it: as soon
// as a layer's matrices are final (EncoderModel::on_layer_gradients), they join
// a bucket of adjacent ranges, and a bucket of at least `bucket_bytes` is reduced (all-reduce
// under stage 0, reduce-scatter of the shards it meets under stages 1 and 2) on the
// communicator's side stream (Communicator::begin_async) while the backend's stream goes on
// with the layers below. Backward walks the layout downwards, so buckets are adjacent ranges
// below each other; what is left when backward ends (the last bucket, the embeddings and the
// tail of vectors, pooler and classifier) is reduced then. Each element is still summed over
// the ranks in one order, so buckets change no bit on the CPU groups. On the CPU the
// collectives run when called (no overlap); on GPUs NCCL's side stream overlaps them.
//
// Note [ZeRO gathers half weights]
// In bf16 / fp16 (stages 1 and 2) the owner's update also writes its shard of the half copy, and
// the ranks gather that copy (2 bytes a parameter) instead of the fp32 masters (4), and no rank
// casts the whole buffer again: bert-large's 1.34 GB exchange becomes 0.67 GB, plus the fp32
// masters that forward reads (the embeddings, and the tail of vectors and head matrices: Note
// [normalization parameters in fp32] in model/bert.cpp), 0.13 GB. Each rank's compute copy is
// then the owner's cast of the owner's master, the bits the cast after a full gather gave. The
// layers' matrices are read through the half copy only, so their masters are current on their
// owner alone until complete_masters() gathers them: before every save (checkpoints and the
// final model), on every rank.
#pragma once
#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "memory/allocator.h"
#include "optim/grad_norm.h"
#include "optim/optimizer.h"

namespace anatomy {

class EncoderModel;
class ParamLayout;

// Bytes of optimizer state rank `rank` holds.
size_t zero_optimizer_state_bytes(OptimizerKind k, const ParamLayout& layout, int world, int stage, int rank = 0,
                                  bool sgd_momentum = false);
// Bytes of the gradient shard buffer rank `rank` holds (ZeRO-2 with accumulation; else 0).
size_t zero_gradient_shard_bytes(const ParamLayout& layout, int world, int stage, int64_t accumulation, int rank = 0);

class DataParallelStep {
 public:
  // bucket_bytes: the size from which a bucket is reduced during backward (0: every layer).
  DataParallelStep(Backend& be, Communicator& comm, const OptimizerOptions& o, const ParamLayout& layout, int stage,
                   int64_t accumulation = 1, size_t bucket_bytes = size_t{25} << 20);
  // Whether the gradients are reduced after each micro-batch (stage 2): the caller then clears
  // them before each micro-batch rather than accumulating into them.
  bool reduces_each_micro_batch() const { return m_stage == 2; }
  // Around micro-batch m's forward_backward (`last`: the step's last, which a step that ends an
  // epoch may reach before the accumulation steps): on the step's last micro-batch (every one under
  // stage 2) the gradients are reduced bucket by bucket as backward goes (Note [bucketed
  // reduction]); under stage 2 each rank then adds its shard into its sum (on the last
  // micro-batch the sum is left in the gradients' own range, where the update reads it).
  void before_backward(EncoderModel& model, int64_t m, bool last);
  void after_backward(EncoderModel& model, int64_t m, bool last);
  int64_t buckets_last_step() const { return m_buckets; }  // reductions of the last micro-batch
  // --profile-steps: the buckets reduced during backward, the collectives' time and what of it
  // backward did not hide (Note [overlap timing] in dist/communicator.h), totals since the last take.
  struct ReductionTiming {
    int64_t buckets = 0;
    double reduce_ms = 0, exposed_ms = 0;
  };
  void time_reduction(bool on);
  ReductionTiming take_reduction_timing();
  // After every rank's backward (gradients scaled for the global batch, times `loss_scale`):
  // the update of `lr`. The update kernels skip themselves when the global norm is not finite
  // (every rank sees the same norm, so every rank skips), so nothing non-finite reaches the
  // weights; the caller reads the norm after the step to decide what that means.
  void step(EncoderModel& model, float lr, float max_grad_norm, float loss_scale = 1.0f);
  // The squared global gradient norm of the last step (device F32 scalar, times loss_scale^2).
  const Tensor& norm_sq() const { return m_norm.norm_sq(); }
  // Every rank's fp32 masters made whole (Note [ZeRO gathers half weights]); a collective: every
  // rank calls it, before anything reads the masters of the layers' matrices (saving).
  void complete_masters(EncoderModel& model);
  const ShardRange& shard() const { return m_shard; }
  int stage() const { return m_stage; }  // 0 in a world of one
  Optimizer& optimizer() { return *m_opt; }

 private:
  Backend& m_be;
  Communicator& m_comm;
  int m_stage;
  int64_t m_accum;
  size_t m_bucket_elems;
  bool m_reducing = false, m_reduced = false;  // this micro-batch's buckets; the step's gradients
  size_t m_low = 0, m_pending = 0;  // [m_low, m_pending): ready, not yet reduced; below m_low: not ready
  int64_t m_buckets = 0;
  bool m_timing = false;
  ReductionTiming m_timed;
  std::vector<ShardRange> m_shards;
  ShardRange m_shard;
  GradNorm m_norm;  // the squared gradient norm and its block partials (the trainer's, as planned)
  std::unique_ptr<Optimizer> m_opt;
  Buffer m_grad_shard;  // stage 2 with accumulation: this rank's summed gradients so far
  bool m_masters_partial = false;  // the layers' matrices' masters current on their owner only

  void ready(const Tensor& grads, size_t begin, size_t end);
  void reduce(const Tensor& grads, size_t begin, size_t end);
};

}  // namespace anatomy
