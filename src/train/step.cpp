#include "train/step.h"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "dist/communicator.h"
#include "model/heads.h"

namespace anatomy {

TrainStep::TrainStep(const TrainOptions& opt, EncoderModel& model, Backend& be, Communicator& comm,
                     const BatchPlan& plan, int64_t total_steps)
    : m_opt(opt), m_model(model), m_be(be), m_comm(comm), m_plan(plan), m_B(model.shape().max_batch),
      m_T(model.shape().max_seq), m_total_steps(total_steps),
      m_sched{plan.batches_per_epoch(), opt.gradient_accumulation_steps},
      m_dps(be, comm, opt.optim, model.layout(), opt.zero_stage, opt.gradient_accumulation_steps,
            static_cast<size_t>(opt.ddp_bucket_cap_mb) << 20),
      m_ids(be.allocator(), DType::I32, {m_B, m_T}, Category::Other),
      m_types(be.allocator(), DType::I32, {m_B, m_T}, Category::Other),
      m_mask(be.allocator(), DType::I32, {m_B, m_T}, Category::Other),
      m_labels(be.allocator(), label_dtype(model.config()), label_shape(model.config(), m_B, m_T), Category::Other),
      m_loss_sums(be.allocator(), DType::F32, {m_B}, Category::Other),
      m_host(static_cast<float*>(be.host_alloc(2 * static_cast<size_t>(2 * m_B + 1) * sizeof(float)))),
      m_staging(be, m_B, m_T, label_width(model.config(), m_T)) {
  if (opt.precision == Precision::Fp16) m_scaler.scale = opt.fp16_initial_scale;
  if (model.shape().packed_tokens) {
    m_rows = Buffer(be.allocator(), DType::I32, {m_B * m_T}, Category::Other);
    m_first = Buffer(be.allocator(), DType::I32, {m_B + 1}, Category::Other);  // first rows, or the offsets
    m_row_multiple = be.device() == Device::CUDA ? 128 : 1;
  }
}

TrainStep::~TrainStep() { m_be.host_free(m_host); }

// Note [labelled tokens per step]
// transformers' Trainer (4.46 on) scores a per-token task as the sum of the token losses of the
// whole optimizer step over the count of labelled tokens in it, num_items_in_batch: every
// micro-batch of the accumulation, summed over the data-parallel ranks. So does this: the step's
// micro-batches are read before the first forward, their labelled tokens (labels != -100, in the
// rows that count) summed here and over the ranks (one exchange of one number), and each
// micro-batch runs with DeviceBatch::masked_tokens = b M and weight s (b its rows, M the step's
// count, s the loss scale): the head weights each token loss by b / (b M) = 1 / M and its
// gradient by s / M (Note [masked LM head] in model/heads.h). A token then has the same weight
// whichever micro-batch or rank holds it: accumulation of 2 x B equals one batch of 2B, and 2
// ranks x B equal one rank x 2B, up to the order of fp32 sums. The per-sample losses are each
// sequence's token losses over M, so their sum over the step is its mean token loss.
int64_t TrainStep::labelled_tokens_of_step(Prefetcher& source, int64_t micro, int64_t micro_batches, double& data_wait,
                                           const std::function<std::pair<int64_t, int64_t>(int64_t)>& real_rows) {
  m_ahead.resize(static_cast<size_t>(micro_batches));
  double count = 0;
  for (int64_t m = 0; m < micro_batches; ++m) {
    double waited = 0;
    HostBatch& hb = m_ahead[static_cast<size_t>(m)];
    ANATOMY_CHECK(source.next(hb, waited), "internal error: the data loader ran dry");
    data_wait += waited;
    const int64_t real = real_rows(micro + m).second;
    for (int64_t i = 0; i < real * hb.seq; ++i) count += hb.token_labels[static_cast<size_t>(i)] != -100;
  }
  m_comm.all_reduce_host(std::span<double>(&count, 1), Communicator::Op::Sum);
  return static_cast<int64_t>(count);
}

TrainStep::Launched TrainStep::launch(Prefetcher& source, int64_t& micro, double& data_wait, int signal) {
  const int64_t N = m_comm.size(), r = m_comm.rank();
  // Note [accumulation within an epoch]: the epoch's last step may take fewer.
  const int64_t accum = m_sched.count_from(micro);
  ANATOMY_ASSERT(m_launched - m_finished < 2);  // at most two steps in flight: two figure slots
  Launched out;
  out.signal = signal;
  m_be.set_phase(Phase::Optimizer);  // clearing the gradients is the update's bookkeeping, not data
  // In activation memory, backward clears each gradient range itself, just before writing it;
  // a buffer of their own is cleared once per step, or per micro-batch when ZeRO-2 reduces each.
  const bool clear_each = m_dps.reduces_each_micro_batch() && !m_model.gradients_in_activations();
  if (!m_model.gradients_in_activations() && !clear_each) m_model.zero_grads();
  m_be.fill(m_loss_sums, 0.0f);
  int64_t widest = 0, mine = 0;
  // The global micro-batch holds g samples; this rank's slice is rows [r B, r B + B) of it. A
  // rank past its end runs one row with weight 0, so that every rank takes part in the step.
  auto real_rows = [&](int64_t mb) {
    const int64_t g = static_cast<int64_t>(m_plan.indices(mb / m_sched.per_epoch, mb % m_sched.per_epoch).size());
    return std::make_pair(g, std::clamp<int64_t>(g - r * m_B, 0, m_B));
  };
  // Per-token tasks read the step's micro-batches first, to count its labelled tokens.
  const bool per_token = has_token_labels(m_model.config());
  const int64_t step_tokens = per_token ? labelled_tokens_of_step(source, micro, accum, data_wait, real_rows) : 0;
  for (int64_t m = 0; m < accum; ++m, ++micro) {
    double waited = 0;
    if (per_token) std::swap(m_hb, m_ahead[static_cast<size_t>(m)]);  // both keep their capacity: no allocation
    else ANATOMY_CHECK(source.next(m_hb, waited), "internal error: the data loader ran dry");
    data_wait += waited;
    const auto [g, real] = real_rows(micro);
    const int64_t b = m_hb.batch, t = m_hb.seq;
    auto rows = [&](const Buffer& buf) { return buf.tensor().view({m_B * m_T}).slice(0, b * t).view({b, t}); };
    DeviceBatch db{rows(m_ids), rows(m_types), rows(m_mask), m_labels.tensor().slice(0, b)};
    float weight = real > 0 ? m_scaler.scale / static_cast<float>(g * accum) : 0.0f;
    if (per_token) {  // token labels [b, t]; Note [labelled tokens per step]
      db.labels = rows(m_labels);
      db.masked_tokens = b * step_tokens;
      if (real > 0) weight = m_scaler.scale;
    }
    PackedRows packing;
    if (m_model.shape().packed_tokens) {
      packing = pack_token_rows(m_hb.attention_mask.data(), b, t, m_row_multiple);
      db.token_rows = m_rows.tensor().slice(0, static_cast<int64_t>(packing.token_rows.size()));
      db.first_rows = m_first.tensor().slice(0, b);
      if (packing.right_padded()) {  // Note [packed attention] in ops/cpu/attention.cpp
        db.seq_offsets = m_first.tensor().slice(0, b + 1);
        db.attended_pairs = packing.attended_pairs;
      }
    }
    if (clear_each) {
      m_be.set_phase(Phase::Optimizer);
      m_model.zero_grads();
    }
    m_be.set_phase(Phase::Data);
    m_staging.upload(m_hb, db, micro, &packing);
    m_dps.before_backward(m_model, m, m == accum - 1);
    m_model.forward_backward(db, weight, static_cast<uint64_t>(micro * N + r) << 12);
    m_be.set_phase(Phase::Optimizer);
    m_dps.after_backward(m_model, m, m == accum - 1);
    m_be.set_phase(Phase::Data);
    if (m == accum - 1) {  // its losses stay in the model's buffer until the next forward
      out.last_rows = real;
    } else {
      if (real > 0) {
        const Tensor sums = m_loss_sums.tensor().slice(0, real);
        m_be.add(sums, sums, m_model.losses().slice(0, real));
      }
      mine += real;
      widest = std::max(widest, real);
    }
  }
  out.micro_batches = accum;
  ANATOMY_CHECK(!(r == N - 1 && m_dps.optimizer().steps() == m_opt.fail_last_rank_at_step), "rank ", r, " failed at step ",
                m_dps.optimizer().steps(), " (injected by the test)");
  m_be.set_phase(Phase::Optimizer);
  out.lr = scheduled_lr(m_opt.lr_scheduler_type, m_opt.learning_rate, m_dps.optimizer().steps(), m_total_steps,
                        m_opt.warmup(m_total_steps));
  m_dps.step(m_model, out.lr, m_opt.max_grad_norm, m_scaler.scale);
  m_model.fp8_scale_update();  // Note [fp8 training]: the next step's scales from this step's amax
  m_be.set_phase(Phase::Data);
  // The figures leave in stream order, before the next step's work can overwrite them.
  out.index = m_launched++;
  float* host = figures(out.index);
  out.token = m_be.download_async(host, m_dps.norm_sq());
  if (widest > 0) out.token = m_be.download_async(host + 1, m_loss_sums.tensor().slice(0, widest));
  if (out.last_rows > 0) out.token = m_be.download_async(host + 1 + m_B, m_model.losses().slice(0, out.last_rows));
  out.widest = widest;
  out.mine = mine;
  out.scale = m_scaler.scale;
  out.micro_end = micro;
  out.data_wait_end = data_wait;
  return out;
}

StepOutcome TrainStep::finish(const Launched& l) {
  ANATOMY_ASSERT(l.index == m_finished);  // in launch order, each once
  ++m_finished;
  m_be.wait_copy(l.token);  // the end of this rank's step
  const float* host = figures(l.index);
  const float norm_sq = host[0];
  double first = 0, last = 0;
  for (int64_t i = 0; i < l.widest; ++i) first += host[1 + i];
  for (int64_t i = 0; i < l.last_rows; ++i) last += host[1 + m_B + i];
  StepOutcome out;
  out.lr = l.lr;
  // The step's global figures and decisions, in one exchange.
  double v[6] = {first, last, static_cast<double>(l.mine), static_cast<double>(l.last_rows),
                 l.signal == SIGINT ? 1.0 : 0.0, l.signal == SIGTERM ? 1.0 : 0.0};
  m_comm.all_reduce_host(v, Communicator::Op::Sum);
  out.samples = static_cast<int64_t>(v[2] + v[3]);
  // Note [loss per step]: the mean of the micro-batches' means, as the gradient weighs them (every
  // micro-batch but an epoch's last is full, so the others share one size); as a sum over the
  // samples it reads back as that mean (StepOutcome::loss_sum / samples). Per-token tasks: the
  // parts already sum to the step's mean over its labelled tokens, transformers' logged loss.
  const double C = static_cast<double>(l.micro_batches);
  const double mean = has_token_labels(m_model.config()) ? v[0] + v[1]
                      : ((C - 1) * (v[2] > 0 ? v[0] / v[2] : 0.0) + (v[3] > 0 ? v[1] / v[3] : 0.0)) / C;
  out.loss_sum = mean * static_cast<double>(out.samples);
  out.stop_signal = v[4] > 0 ? SIGINT : v[5] > 0 ? SIGTERM : 0;
  out.grad_norm = std::sqrt(static_cast<double>(norm_sq)) / l.scale;
  // Note [non-finite steps]: a non-finite loss comes from non-finite logits, whose gradient is
  // non-finite too, so the update kernels have skipped such a step on every rank (dist/zero.h)
  // whichever quantity the check names first.
  const bool finite = std::isfinite(norm_sq);
  if (m_opt.precision == Precision::Fp16 && !m_scaler.at_floor() && !finite) {
    // An overflow while the scale can still shrink is the scaler's business, not an error.
    m_scaler.update(true);
    out.applied = false;
    out.overflow = true;
    out.grad_norm = 0;
  } else {
    if (m_opt.precision == Precision::Fp16) m_scaler.update(!finite);
    out.applied = finite;
    if (!std::isfinite(out.loss_sum)) out.nonfinite = "loss";
    else if (!finite) out.nonfinite = "grad_norm";
  }
  if (!out.applied) m_dps.optimizer().set_steps(m_dps.optimizer().steps() - 1);  // the update did not happen
  return out;
}

}  // namespace anatomy
