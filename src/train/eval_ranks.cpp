#include "train/eval_ranks.h"

#include <algorithm>
#include <cmath>

#include "data/token_tags.h"

namespace anatomy {

namespace {

// Samples [begin, end) of a dataset.
class RangeDataset final : public Dataset {
 public:
  RangeDataset(const Dataset& ds, size_t begin, size_t end) : m_ds(ds), m_begin(begin), m_end(end) {}
  size_t size() const override { return m_end - m_begin; }
  int64_t seq_len() const override { return m_ds.seq_len(); }
  void get(size_t i, HostBatch& out, int64_t row) const override { m_ds.get(m_begin + i, out, row); }

 private:
  const Dataset& m_ds;
  size_t m_begin, m_end;
};

// Per-token tasks (masked LM, token classification): the per-sample loss sums at their places,
// then the sums the metrics are made of, all summed over the ranks. The entity counts add up
// over sentences, so precision, recall and F1 are the whole set's (conlleval counts entities
// over the set, not per part). Each rank's per-word tags stay with it: evaluation during training
// writes metrics only.
enum PerTokenSum { kLabelled, kScored, kHits, kPredicted, kGold, kCorrect, kTokens, kPadded, kComputed, kBatches,
                   kPacked, kSkipPadding, kRuntime, kLossSum, kSums };

EvalResult combine_per_token(const EvalResult& part, const BertConfig& cfg, size_t n, size_t begin, size_t end,
                             Communicator& comm) {
  const bool tags = is_token_classification(cfg);
  std::vector<double> all(n + kSums, 0.0);
  double* sum = all.data() + n;
  for (size_t i = begin; i < end && !part.losses.empty(); ++i) {
    all[i] = part.losses[i - begin];
    sum[kLossSum] += part.losses[i - begin];
  }
  if (end > begin) {
    sum[kLabelled] = part.labelled ? 1 : 0;
    sum[kScored] = static_cast<double>(part.scored_tokens);
    sum[kTokens] = static_cast<double>(part.tokens);
    sum[kPadded] = static_cast<double>(part.padded_tokens);
    sum[kComputed] = static_cast<double>(part.computed_tokens);
    sum[kBatches] = static_cast<double>(part.batches);
    sum[kPacked] = static_cast<double>(part.packed_batches);
    sum[kSkipPadding] = part.skip_padding ? 1 : 0;
    sum[kRuntime] = part.runtime;
    sum[kHits] = static_cast<double>(part.correct_tokens);
  }
  if (tags && end > begin && part.labelled) {
    const EntityScores e = entity_scores(part.word_predictions, part.word_labels);
    sum[kPredicted] = static_cast<double>(e.predicted);
    sum[kGold] = static_cast<double>(e.gold);
    sum[kCorrect] = static_cast<double>(e.correct);
  }
  comm.all_reduce_host(all, Communicator::Op::Sum);
  double batch = static_cast<double>(part.batch_size);  // rank 0 may hold no sample: the largest
  comm.all_reduce_host(std::span<double>(&batch, 1), Communicator::Op::Max);
  const int64_t N = comm.size();
  EvalResult res;
  res.samples = static_cast<int64_t>(n);
  res.batch_size = static_cast<int64_t>(batch);
  res.num_labels = tags ? cfg.num_labels : 0;
  res.masked_lm = !tags;
  res.token_classification = tags;
  res.labelled = sum[kLabelled] > 0;
  res.predictions.assign(n, 0);
  res.labels.assign(n, 0);
  res.losses.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n));
  res.scored_tokens = static_cast<int64_t>(sum[kScored]);
  res.tokens = static_cast<int64_t>(sum[kTokens]);
  res.padded_tokens = static_cast<int64_t>(sum[kPadded]);
  res.computed_tokens = static_cast<int64_t>(sum[kComputed]);
  res.batches = static_cast<int64_t>(sum[kBatches]);
  res.packed_batches = static_cast<int64_t>(sum[kPacked]);
  res.skip_padding = sum[kSkipPadding] > 0;
  res.runtime = sum[kRuntime] / static_cast<double>(N);
  res.samples_per_second = static_cast<double>(n) / std::max(res.runtime, 1e-9);
  if (!res.labelled || res.scored_tokens == 0) return res;
  res.correct_tokens = static_cast<int64_t>(sum[kHits]);
  res.loss = sum[kLossSum] / sum[kScored];
  res.accuracy = sum[kHits] / sum[kScored];
  if (!tags) {
    res.perplexity = std::exp(res.loss);
    return res;
  }
  const EntityScores e = entity_scores_of_counts(static_cast<int64_t>(sum[kPredicted]), static_cast<int64_t>(sum[kGold]),
                                                 static_cast<int64_t>(sum[kCorrect]));
  res.precision = e.precision;
  res.recall = e.recall;
  res.f1 = e.f1;
  return res;
}

}  // namespace

EvalResult evaluate_over_ranks(EncoderModel& model, const Dataset& ds, const std::vector<int64_t>& lengths,
                               int64_t batch_size, Communicator& comm) {
  const size_t n = ds.size(), N = static_cast<size_t>(comm.size()), r = static_cast<size_t>(comm.rank());
  const size_t begin = n * r / N, end = n * (r + 1) / N;
  EvalOptions eo;
  eo.batch_size = batch_size;
  eo.keep_probabilities = false;
  if (!lengths.empty())
    eo.lengths.assign(lengths.begin() + static_cast<std::ptrdiff_t>(begin), lengths.begin() + static_cast<std::ptrdiff_t>(end));
  EvalResult part;
  if (end > begin) {
    const RangeDataset slice(ds, begin, end);
    part = evaluate(model, slice, eo);
  }
  if (N == 1) return part;
  if (has_token_labels(model.config())) return combine_per_token(part, model.config(), n, begin, end, comm);
  // Every rank's samples at their places in one buffer: predictions, labels, losses; summed.
  // Then the counts (kCounts); float labels (regression, multi-label) add the logits and targets
  // [n, C] after them. A rank may hold no sample (fewer samples than ranks): the result's fields
  // come from the sums, never from one rank's part.
  enum Count { kRuntime, kLabelled, kTokens, kPadded, kComputed, kBatches, kPacked, kSkipPadding, kCounts };
  const bool floats = has_float_labels(problem_type_of(model.config()));
  const size_t C = static_cast<size_t>(model.config().num_labels), wide = floats ? n * C : 0;
  std::vector<double> all(3 * n + kCounts + 2 * wide, 0.0);
  for (size_t i = begin; i < end; ++i) {
    all[i] = part.predictions[i - begin];
    all[n + i] = part.labels[i - begin];
    all[2 * n + i] = part.losses.empty() ? 0.0 : part.losses[i - begin];
    for (size_t c = 0; c < wide / std::max<size_t>(1, n); ++c) {
      all[3 * n + kCounts + i * C + c] = part.outputs[(i - begin) * C + c];
      if (!part.targets.empty()) all[3 * n + kCounts + wide + i * C + c] = part.targets[(i - begin) * C + c];
    }
  }
  double* count = all.data() + 3 * n;
  if (end > begin) {
    count[kRuntime] = part.runtime;
    count[kLabelled] = part.labelled ? 1 : 0;
    count[kTokens] = static_cast<double>(part.tokens);
    count[kPadded] = static_cast<double>(part.padded_tokens);
    count[kComputed] = static_cast<double>(part.computed_tokens);
    count[kBatches] = static_cast<double>(part.batches);
    count[kPacked] = static_cast<double>(part.packed_batches);
    count[kSkipPadding] = part.skip_padding ? 1 : 0;
  }
  comm.all_reduce_host(all, Communicator::Op::Sum);
  double batch = static_cast<double>(part.batch_size);
  comm.all_reduce_host(std::span<double>(&batch, 1), Communicator::Op::Max);
  count = all.data() + 3 * n;
  EvalResult res;
  res.samples = static_cast<int64_t>(n);
  res.num_labels = model.config().num_labels;
  res.batch_size = static_cast<int64_t>(batch);
  res.labelled = count[kLabelled] > 0;
  res.tokens = static_cast<int64_t>(count[kTokens]);
  res.padded_tokens = static_cast<int64_t>(count[kPadded]);
  res.computed_tokens = static_cast<int64_t>(count[kComputed]);
  res.batches = static_cast<int64_t>(count[kBatches]);
  res.packed_batches = static_cast<int64_t>(count[kPacked]);
  res.skip_padding = count[kSkipPadding] > 0;
  res.predictions.resize(n);
  res.labels.resize(n);
  res.losses.assign(all.begin() + static_cast<std::ptrdiff_t>(2 * n), all.begin() + static_cast<std::ptrdiff_t>(3 * n));
  for (size_t i = 0; i < n; ++i) {
    res.predictions[i] = static_cast<int32_t>(all[i]);
    res.labels[i] = static_cast<int32_t>(all[n + i]);
  }
  res.runtime = count[kRuntime] / static_cast<double>(N);
  res.samples_per_second = static_cast<double>(n) / std::max(res.runtime, 1e-9);
  if (floats) res.problem = problem_type_of(model.config());
  if (!res.labelled) return res;
  double loss = 0;
  for (double l : res.losses) loss += l;
  res.loss = loss / static_cast<double>(std::max<size_t>(1, n));
  if (floats) {
    const auto first = all.begin() + static_cast<std::ptrdiff_t>(3 * n + kCounts);
    res.outputs.assign(first, first + static_cast<std::ptrdiff_t>(wide));
    res.targets.assign(first + static_cast<std::ptrdiff_t>(wide), first + static_cast<std::ptrdiff_t>(2 * wide));
    finish_float_metrics(res);
    return res;
  }
  res.accuracy = accuracy(res.predictions, res.labels);
  res.macro_f1 = macro_f1(res.predictions, res.labels);
  return res;
}

}  // namespace anatomy
