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
//            shards are broadcast back to every rank (grouped ncclBroadcast = all-gather);
//            every rank then casts the masters to its half-precision copy.
//   stage 2: as stage 1, but the gradients are reduce-scattered after every micro-batch and each
//            rank accumulates only its shard, in a buffer of 4/N bytes/param (Gradients). The
//            full gradients are then needed only from one micro-batch's backward to its
//            reduction, so they live in activation memory backward is done with (Note
//            [gradients in freed activations]) even with accumulation, where stages 0 and 1
//            keep a full buffer of 4 bytes/param. With one micro-batch per step stage 2 is
//            stage 1 (no shard buffer). The shard sums micro-batches in the order
//            ((g0 + g1) + g2)..., each g already summed over ranks; stage 0 sums each rank's
//            micro-batches first, so with accumulation the two agree to rounding, not bitwise.
#pragma once
#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "memory/allocator.h"
#include "optim/grad_norm.h"
#include "optim/optimizer.h"

namespace anatomy {

class BertForSequenceClassification;
class ParamLayout;

// Bytes of optimizer state rank `rank` holds.
size_t zero_optimizer_state_bytes(OptimizerKind k, const ParamLayout& layout, int world, int stage, int rank = 0);
// Bytes of the gradient shard buffer rank `rank` holds (ZeRO-2 with accumulation; else 0).
size_t zero_gradient_shard_bytes(const ParamLayout& layout, int world, int stage, int64_t accumulation, int rank = 0);

class DataParallelStep {
 public:
  DataParallelStep(Backend& be, Communicator& comm, const OptimizerOptions& o, const ParamLayout& layout, int stage,
                   int64_t accumulation = 1);
  // Whether the gradients are reduced after each micro-batch (stage 2): the caller then clears
  // them before each micro-batch rather than accumulating into them.
  bool reduces_each_micro_batch() const { return m_stage == 2; }
  // Stage 2, after micro-batch m of `accumulation`'s backward: its gradients reduce-scattered and
  // added into this rank's shard (on the last one the shard sum is left in grads' own range).
  void reduce_micro_batch(BertForSequenceClassification& model, int64_t m);
  // After every rank's backward (gradients scaled for the global batch, times `loss_scale`):
  // the update of `lr`. The update kernels skip themselves when the global norm is not finite
  // (every rank sees the same norm, so every rank skips), so nothing non-finite reaches the
  // weights; the caller reads the norm after the step to decide what that means.
  void step(BertForSequenceClassification& model, float lr, float max_grad_norm, float loss_scale = 1.0f);
  // The squared global gradient norm of the last step (device F32 scalar, times loss_scale^2).
  const Tensor& norm_sq() const { return m_norm.norm_sq(); }
  const ShardRange& shard() const { return m_shard; }
  int stage() const { return m_stage; }  // 0 in a world of one
  Optimizer& optimizer() { return *m_opt; }

 private:
  Backend& m_be;
  Communicator& m_comm;
  int m_stage;
  int64_t m_accum;
  std::vector<ShardRange> m_shards;
  ShardRange m_shard;
  GradNorm m_norm;  // the squared gradient norm and its block partials (the trainer's, as planned)
  std::unique_ptr<Optimizer> m_opt;
  Buffer m_grad_shard;  // stage 2 with accumulation: this rank's summed gradients so far
};

}  // namespace anatomy
