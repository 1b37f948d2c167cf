#include "train/eval_ranks.h"

#include <algorithm>

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

}  // namespace

EvalResult evaluate_over_ranks(EncoderModel& model, const Dataset& ds, const std::vector<int64_t>& lengths,
                               int64_t batch_size, Communicator& comm) {
  const size_t n = ds.size(), N = static_cast<size_t>(comm.size()), r = static_cast<size_t>(comm.rank());
  const size_t begin = n * r / N, end = n * (r + 1) / N;
  EvalOptions eo;
  eo.batch_size = batch_size;
  eo.keep_probabilities = false;
  eo.skip_padding = eo.skip_padding && !model.config().is_modernbert();  // ModernBERT computes padded
  if (!lengths.empty())
    eo.lengths.assign(lengths.begin() + static_cast<std::ptrdiff_t>(begin), lengths.begin() + static_cast<std::ptrdiff_t>(end));
  EvalResult part;
  if (end > begin) {
    const RangeDataset slice(ds, begin, end);
    part = evaluate(model, slice, eo);
  }
  if (N == 1) return part;
  ANATOMY_CHECK(!part.masked_lm && !part.token_classification,
                "evaluation of --task mlm or token-classification over several ranks is not supported; evaluate with one process");
  // Every rank's samples at their places in one buffer: predictions, labels, losses; summed.
  // Float labels (regression, multi-label) add the logits and targets [n, C] after them.
  const bool floats = has_float_labels(problem_type_of(model.config()));
  const size_t C = static_cast<size_t>(model.config().num_labels), wide = floats ? n * C : 0;
  std::vector<double> all(3 * n + 1 + 2 * wide, 0.0);
  for (size_t i = begin; i < end; ++i) {
    all[i] = part.predictions[i - begin];
    all[n + i] = part.labels[i - begin];
    all[2 * n + i] = part.losses.empty() ? 0.0 : part.losses[i - begin];
    for (size_t c = 0; c < wide / std::max<size_t>(1, n); ++c) {
      all[3 * n + 1 + i * C + c] = part.outputs[(i - begin) * C + c];
      if (!part.targets.empty()) all[3 * n + 1 + wide + i * C + c] = part.targets[(i - begin) * C + c];
    }
  }
  all[3 * n] = part.runtime;
  comm.all_reduce_host(all, Communicator::Op::Sum);
  EvalResult res = part;
  res.samples = static_cast<int64_t>(n);
  res.predictions.resize(n);
  res.labels.resize(n);
  res.losses.assign(all.begin() + static_cast<std::ptrdiff_t>(2 * n), all.begin() + static_cast<std::ptrdiff_t>(3 * n));
  for (size_t i = 0; i < n; ++i) {
    res.predictions[i] = static_cast<int32_t>(all[i]);
    res.labels[i] = static_cast<int32_t>(all[n + i]);
  }
  res.runtime = all[3 * n] / static_cast<double>(N);
  res.samples_per_second = static_cast<double>(n) / std::max(res.runtime, 1e-9);
  double loss = 0;
  for (double l : res.losses) loss += l;
  res.loss = loss / static_cast<double>(std::max<size_t>(1, n));
  if (floats) {
    res.problem = problem_type_of(model.config());
    const auto first = all.begin() + static_cast<std::ptrdiff_t>(3 * n + 1);
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
