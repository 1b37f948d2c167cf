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

// The counts of every evaluation, each rank's part summed into the whole set's (a rank may hold
// no sample when there are fewer samples than ranks: the result is made from the sums, never from
// one rank's part). put_counts writes a part's into c[0, kCounts); take_counts reads the sums
// back; the runtime and the batch size are the largest rank's (slowest_part: a maximum).
enum Count { kLabelled, kTokens, kPadded, kComputed, kBatches, kPacked, kSkipPadding, kCounts };

void put_counts(const EvalResult& part, double* c) {
  c[kLabelled] = part.labelled ? 1 : 0;
  c[kTokens] = static_cast<double>(part.tokens);
  c[kPadded] = static_cast<double>(part.padded_tokens);
  c[kComputed] = static_cast<double>(part.computed_tokens);
  c[kBatches] = static_cast<double>(part.batches);
  c[kPacked] = static_cast<double>(part.packed_batches);
  c[kSkipPadding] = part.skip_padding ? 1 : 0;
}

struct Slowest {
  double runtime, batch;
};

Slowest slowest_part(const EvalResult& part, Communicator& comm) {
  double v[2] = {part.runtime, static_cast<double>(part.batch_size)};
  comm.all_reduce_host(std::span<double>(v, 2), Communicator::Op::Max);
  return {v[0], v[1]};
}

void take_counts(const double* c, size_t n, Slowest slowest, EvalResult& res) {
  res.samples = static_cast<int64_t>(n);
  res.batch_size = static_cast<int64_t>(slowest.batch);
  res.labelled = c[kLabelled] > 0;
  res.tokens = static_cast<int64_t>(c[kTokens]);
  res.padded_tokens = static_cast<int64_t>(c[kPadded]);
  res.computed_tokens = static_cast<int64_t>(c[kComputed]);
  res.batches = static_cast<int64_t>(c[kBatches]);
  res.packed_batches = static_cast<int64_t>(c[kPacked]);
  res.skip_padding = c[kSkipPadding] > 0;
  res.runtime = slowest.runtime;  // the set is evaluated when the slowest rank is done
  res.samples_per_second = static_cast<double>(n) / std::max(res.runtime, 1e-9);
}

// Per-token tasks (masked LM, token classification): the per-sample loss sums at their places,
// then the sums the metrics are made of, all summed over the ranks. The entity counts add up
// over sentences, so precision, recall and F1 are the whole set's (conlleval counts entities
// over the set, not per part). Each rank's per-word tags stay with it: evaluation during training
// writes metrics only.
enum PerTokenSum { kScored = kCounts, kHits, kPredicted, kGold, kCorrect, kLossSum, kSums };

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
    put_counts(part, sum);
    sum[kScored] = static_cast<double>(part.scored_tokens);
    sum[kHits] = static_cast<double>(part.correct_tokens);
  }
  if (tags && end > begin && part.labelled) {
    const EntityScores e = entity_scores(part.word_predictions, part.word_labels);
    sum[kPredicted] = static_cast<double>(e.predicted);
    sum[kGold] = static_cast<double>(e.gold);
    sum[kCorrect] = static_cast<double>(e.correct);
  }
  comm.all_reduce_host(all, Communicator::Op::Sum);
  EvalResult res;
  take_counts(sum, n, slowest_part(part, comm), res);
  res.num_labels = tags ? cfg.num_labels : 0;
  res.masked_lm = !tags;
  res.token_classification = tags;
  res.predictions.assign(n, 0);
  res.labels.assign(n, 0);
  res.losses.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n));
  res.scored_tokens = static_cast<int64_t>(sum[kScored]);
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
  // Then the counts (put_counts); float labels (regression, multi-label) add the logits and
  // targets [n, C] after them.
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
  if (end > begin) put_counts(part, all.data() + 3 * n);
  comm.all_reduce_host(all, Communicator::Op::Sum);
  EvalResult res;
  take_counts(all.data() + 3 * n, n, slowest_part(part, comm), res);
  res.num_labels = model.config().num_labels;
  res.predictions.resize(n);
  res.labels.resize(n);
  res.losses.assign(all.begin() + static_cast<std::ptrdiff_t>(2 * n), all.begin() + static_cast<std::ptrdiff_t>(3 * n));
  for (size_t i = 0; i < n; ++i) {
    res.predictions[i] = static_cast<int32_t>(all[i]);
    res.labels[i] = static_cast<int32_t>(all[n + i]);
  }
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
