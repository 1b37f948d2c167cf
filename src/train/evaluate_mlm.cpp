// Masked-LM evaluation: the mean cross-entropy over the masked tokens and its perplexity.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "data/dataset.h"
#include "train/evaluate.h"

namespace anatomy {

EvalResult evaluate_masked_lm(BertForSequenceClassification& model, const Dataset& ds, const EvalOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  Backend& be = model.backend();
  const size_t n = ds.size();
  ANATOMY_CHECK(n > 0, "evaluate: the evaluation data has no samples");
  const int64_t max_seq = model.shape().max_seq, V = model.config().vocab_size;
  const int64_t B = std::min(opt.batch_size, model.shape().max_batch);
  ANATOMY_CHECK(opt.lengths.empty() || opt.lengths.size() == n, "evaluate: ", opt.lengths.size(), " lengths for ", n,
                " samples");
  EvalResult r;
  r.masked_lm = true;
  r.samples = static_cast<int64_t>(n);
  r.batch_size = B;
  r.labelled = opt.labelled;
  r.predictions.assign(n, 0);
  r.labels.assign(n, 0);
  r.losses.assign(n, 0.0);
  Allocator& al = be.allocator();
  Buffer ids(al, DType::I32, {B * max_seq}, Category::Other), types(al, DType::I32, {B * max_seq}, Category::Other),
      mask(al, DType::I32, {B * max_seq}, Category::Other);
  auto front = [](const Buffer& buf, int64_t rows, int64_t cols) {
    return buf.tensor().slice(0, rows * cols).view({rows, cols});
  };
  HostBatch hb;
  std::vector<float> logits;
  std::vector<uint16_t> half;
  double total = 0;
  for (size_t begin = 0; begin < n; begin += static_cast<size_t>(B)) {
    const size_t end = std::min(n, begin + static_cast<size_t>(B));
    const int64_t b = static_cast<int64_t>(end - begin);
    int64_t T = ds.seq_len();
    if (!opt.lengths.empty()) {
      T = 1;
      for (size_t k = begin; k < end; ++k) T = std::max(T, opt.lengths[k]);
      const int64_t m = std::max<int64_t>(1, opt.pad_to_multiple_of);
      T = std::min(max_seq, (T + m - 1) / m * m);
    }
    hb.resize(b, T);
    for (size_t k = begin; k < end; ++k) ds.get(k, hb, static_cast<int64_t>(k - begin));
    ANATOMY_CHECK(!r.labelled || hb.token_labels.size() == static_cast<size_t>(b * T),
                  "evaluate: the data has no masked tokens (a masked-LM model evaluates masked texts)");
    be.set_phase(Phase::Data);
    DeviceBatch db{front(ids, b, T), front(types, b, T), front(mask, b, T), Tensor()};
    be.upload(db.input_ids, hb.input_ids.data());
    be.upload(db.token_type_ids, hb.token_type_ids.data());
    be.upload(db.attention_mask, hb.attention_mask.data());
    model.forward_eval(db);
    be.set_phase(Phase::Data);
    const Tensor out = model.logits().slice(0, b * T);
    logits.resize(out.numel());
    if (out.dtype == DType::F32) {
      be.download(logits.data(), out);
    } else {
      half.resize(out.numel());
      be.download(half.data(), out);
      for (size_t i = 0; i < half.size(); ++i)
        logits[i] = out.dtype == DType::BF16 ? bf16_to_f32(half[i]) : f16_to_f32(half[i]);
    }
    r.padded_tokens += b * T;
    r.computed_tokens += b * T;
    for (int32_t m : hb.attention_mask) r.tokens += m != 0;
    if (r.labelled)
      for (int64_t row = 0; row < b * T; ++row) {
        const int32_t label = hb.token_labels[static_cast<size_t>(row)];
        if (label == -100) continue;
        const std::span<const float> x(logits.data() + row * V, static_cast<size_t>(V));
        const double l = cross_entropy(x, label);
        ANATOMY_CHECK(std::isfinite(l), "evaluate: a non-finite masked-LM loss at sample ", begin + static_cast<size_t>(row / T));
        r.losses[begin + static_cast<size_t>(row / T)] += l;
        total += l;
        ++r.scored_tokens;
      }
    ++r.batches;
  }
  be.synchronize();
  if (r.labelled && r.scored_tokens > 0) {
    r.loss = total / static_cast<double>(r.scored_tokens);
    r.perplexity = std::exp(r.loss);
  }
  r.runtime = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.samples_per_second = static_cast<double>(n) / std::max(r.runtime, 1e-9);
  return r;
}

}  // namespace anatomy
