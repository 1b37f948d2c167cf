#include "dist/zero.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "model/encoder.h"
#include "model/params.h"

namespace anatomy {

size_t zero_optimizer_state_bytes(OptimizerKind k, const ParamLayout& layout, int world, int stage, int rank,
                                  bool sgd_momentum) {
  if (stage == 0 || world == 1) return optimizer_state_bytes(k, layout, sgd_momentum);
  return Optimizer::range_state_bytes(k, shard_ranges(layout.total(), world)[static_cast<size_t>(rank)].size(), sgd_momentum);
}

size_t zero_gradient_shard_bytes(const ParamLayout& layout, int world, int stage, int64_t accumulation, int rank) {
  if (stage != 2 || world == 1 || accumulation == 1) return 0;
  return 4 * shard_ranges(layout.total(), world)[static_cast<size_t>(rank)].size();
}

namespace {

// Each rank's shard clipped to [begin, end), relative to begin (a slice's shards).
std::vector<ShardRange> shards_within(const std::vector<ShardRange>& shards, size_t begin, size_t end) {
  std::vector<ShardRange> within(shards.size());
  for (size_t r = 0; r < shards.size(); ++r) {
    const size_t b = std::clamp(shards[r].begin, begin, end), e = std::clamp(shards[r].end, begin, end);
    within[r] = {b - begin, e - begin};
  }
  return within;
}

}  // namespace

DataParallelStep::DataParallelStep(Backend& be, Communicator& comm, const OptimizerOptions& o, const ParamLayout& layout,
                                   int stage, int64_t accumulation, size_t bucket_bytes)
    : m_be(be), m_comm(comm), m_stage(comm.size() == 1 ? 0 : stage), m_accum(accumulation),
      m_bucket_elems(bucket_bytes / 4), m_shards(shard_ranges(layout.total(), comm.size())),
      m_shard(m_shards[static_cast<size_t>(comm.rank())]), m_norm(be, layout.total()) {
  ANATOMY_CHECK(stage >= 0 && stage <= 2, "--zero-stage: expected 0, 1 or 2 (got ", stage, ")");
  m_opt = m_stage == 0 ? Optimizer::create(be, o, layout) : Optimizer::create_for_range(be, o, m_shard.size());
  const size_t shard_bytes = zero_gradient_shard_bytes(layout, comm.size(), m_stage, m_accum, comm.rank());
  if (shard_bytes) m_grad_shard = Buffer(be.allocator(), DType::F32, {static_cast<int64_t>(shard_bytes / 4)}, Category::Gradients);
}

void DataParallelStep::before_backward(EncoderModel& model, int64_t m, bool last) {
  if (m == 0) m_reduced = false;
  m_reducing = m_comm.size() > 1 && (m_stage == 2 || last);
  if (!m_reducing) return;
  const auto& stages = model.gradient_stages();
  m_low = m_pending = stages.back().first;  // the tail is final only when backward ends
  m_buckets = 0;
  const Tensor grads = model.grads();
  model.on_layer_gradients([this, grads](size_t b, size_t e) { ready(grads, b, e); });
  m_comm.begin_async();
}

void DataParallelStep::ready(const Tensor& grads, size_t begin, size_t end) {
  ANATOMY_CHECK(end == m_low, "internal error: layer gradients [", begin, ", ", end, ") are not below ", m_low);
  m_low = begin;
  if (m_pending - m_low < std::max<size_t>(m_bucket_elems, 1)) return;
  reduce(grads, m_low, m_pending);
  m_pending = m_low;
}

// One bucket: stage 0 all-reduces it, stages 1 and 2 reduce each shard's part to its owner.
void DataParallelStep::reduce(const Tensor& grads, size_t begin, size_t end) {
  if (end <= begin) return;
  const Tensor part = grads.view({static_cast<int64_t>(grads.numel())}).slice(static_cast<int64_t>(begin), static_cast<int64_t>(end));
  ++m_buckets;
  m_timed.buckets += m_timing;
  const auto t0 = m_timing ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  if (m_stage == 0) {
    m_comm.all_reduce_sum(part);
  } else {
    m_comm.reduce_scatter_sum(part, shards_within(m_shards, begin, end));
  }
  if (m_timing && !m_comm.overlaps()) {  // the collective blocked this thread: all of it is exposed
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    m_timed.reduce_ms += ms;
    m_timed.exposed_ms += ms;
  }
}

void DataParallelStep::time_reduction(bool on) {
  m_timing = on;
  m_comm.time_overlap(on);
  m_timed = {};
}

DataParallelStep::ReductionTiming DataParallelStep::take_reduction_timing() {
  ReductionTiming t = std::exchange(m_timed, {});
  if (m_comm.overlaps()) {
    const Communicator::OverlapTiming o = m_comm.take_overlap();
    t.reduce_ms = o.reduce_ms, t.exposed_ms = o.exposed_ms;
  }
  return t;
}

void DataParallelStep::after_backward(EncoderModel& model, int64_t m, bool last) {
  if (!m_reducing) return;
  model.on_layer_gradients(nullptr);
  const Tensor grads = model.grads();
  reduce(grads, 0, m_pending);  // the last bucket with the embeddings
  reduce(grads, model.gradient_stages().back().first, static_cast<size_t>(grads.numel()));  // the tail
  m_comm.end_async();
  m_reducing = false;
  m_reduced = last;
  // ZeRO-2: this rank's shard of each micro-batch's reduced gradients is summed in m_grad_shard,
  // and the sum lands in the gradients' own shard with the step's last micro-batch.
  if (m_stage != 2 || m_accum == 1 || m_shard.size() == 0 || (m == 0 && last)) return;
  const Tensor own = grads.view({static_cast<int64_t>(grads.numel())})
                         .slice(static_cast<int64_t>(m_shard.begin), static_cast<int64_t>(m_shard.end));
  const Tensor sum = m_grad_shard.tensor();
  if (m == 0)
    m_be.copy(sum, own);
  else if (!last)
    m_be.add(sum, sum, own);
  else
    m_be.add(own, sum, own);
}

void DataParallelStep::step(EncoderModel& model, float lr, float max_grad_norm, float loss_scale) {
  const Tensor grads = model.grads();
  const bool reduced = std::exchange(m_reduced, false);  // by after_backward's buckets
  if (m_comm.size() == 1) {  // one device: the norm and the update in place, nothing to exchange
    m_norm.compute(grads);
    ParamGroups g{model.master(), model.shape().compute == DType::F32 ? Tensor() : model.compute_params(), grads,
                  model.layout().decay_end()};
    m_opt->step(g, GradTransform{m_norm.norm_sq(), 1.0f / loss_scale, max_grad_norm, true}, lr);
    return;
  }
  const Tensor& norm = m_norm.norm_sq();
  if (m_stage == 0) {
    if (!reduced) m_comm.all_reduce_sum(grads);
    m_norm.compute(grads);
    ParamGroups g{model.master(), model.shape().compute == DType::F32 ? Tensor() : model.compute_params(), grads,
                  model.layout().decay_end()};
    m_opt->step(g, GradTransform{norm, 1.0f / loss_scale, max_grad_norm, true}, lr);
    return;
  }
  if (!reduced) m_comm.reduce_scatter_sum(grads, m_shards);
  const int64_t b = static_cast<int64_t>(m_shard.begin), e = static_cast<int64_t>(m_shard.end);
  auto own = [&](const Tensor& t) { return t.view({static_cast<int64_t>(t.numel())}).slice(b, e); };
  m_norm.compute_range(grads, m_shard.begin, m_shard.end);
  m_comm.all_reduce_sum(m_norm.partials());  // each block's partial from its owner, zeros elsewhere
  m_norm.finish();
  const size_t decay_end = model.layout().decay_end();
  const size_t local_decay = std::clamp<size_t>(decay_end, m_shard.begin, m_shard.end) - m_shard.begin;
  const bool half = model.shape().compute != DType::F32;
  ParamGroups g{own(model.master()), half ? own(model.compute_params()) : Tensor(), own(grads), local_decay};
  m_opt->step(g, GradTransform{norm, 1.0f / loss_scale, max_grad_norm, true}, lr);
  if (!half) {
    m_comm.all_gather(model.master(), m_shards);
    return;
  }
  // Note [ZeRO gathers half weights]: the half copy, and the fp32 masters forward reads (all but
  // the layers' matrices).
  m_comm.all_gather(model.compute_params(), m_shards);
  const auto& stages = model.gradient_stages();  // [embeddings, layer 0 .. L-1, tail]
  const size_t layers_begin = stages.front().second, layers_end = stages.back().first;
  for (auto [b, e] : {std::pair{size_t{0}, layers_begin}, std::pair{layers_end, static_cast<size_t>(grads.numel())}})
    if (e > b) m_comm.all_gather(ParamLayout::range(model.master(), b, {static_cast<int64_t>(e - b)}), shards_within(m_shards, b, e));
  m_masters_partial = layers_end > layers_begin;
}

void DataParallelStep::complete_masters(EncoderModel& model) {
  if (!std::exchange(m_masters_partial, false)) return;
  m_comm.all_gather(model.master(), m_shards);
}

}  // namespace anatomy
