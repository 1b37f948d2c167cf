// Token-classification evaluation: the loss over the labelled tokens, their accuracy, and CoNLL
// entity scores over the words' tags (each word's tag is its first sub-token's).
#include <algorithm>
#include <chrono>
#include <cmath>

#include "data/dataset.h"
#include "data/token_tags.h"
#include "train/evaluate.h"

namespace anatomy {

EvalResult evaluate_token_classification(BertForSequenceClassification& model, const Dataset& ds,
                                         const EvalOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  Backend& be = model.backend();
  const size_t n = ds.size();
  ANATOMY_CHECK(n > 0, "evaluate: the evaluation data has no samples");
  const BertConfig& cfg = model.config();
  const int64_t max_seq = model.shape().max_seq, C = cfg.num_labels;
  const int64_t B = std::min(opt.batch_size, model.shape().max_batch);
  std::vector<int64_t> lengths = opt.lengths;
  if (const auto* t = dynamic_cast<const TokenTagDataset*>(&ds); t && lengths.empty()) lengths = t->lengths();
  auto name = [&](int32_t id) {
    auto it = cfg.id2label.find(id);
    return it != cfg.id2label.end() ? it->second : std::to_string(id);
  };
  EvalResult r;
  r.token_classification = true;
  r.samples = static_cast<int64_t>(n);
  r.num_labels = C;
  r.batch_size = B;
  r.labelled = opt.labelled;
  r.predictions.assign(n, 0);
  r.labels.assign(n, 0);
  r.losses.assign(n, 0.0);
  r.word_predictions.assign(n, {});
  r.word_labels.assign(n, {});
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
  int64_t hits = 0;
  for (size_t begin = 0; begin < n; begin += static_cast<size_t>(B)) {
    const size_t end = std::min(n, begin + static_cast<size_t>(B));
    const int64_t b = static_cast<int64_t>(end - begin);
    int64_t T = ds.seq_len();
    if (!lengths.empty()) {
      T = 1;
      for (size_t k = begin; k < end; ++k) T = std::max(T, lengths[k]);
      const int64_t m = std::max<int64_t>(1, opt.pad_to_multiple_of);
      T = std::min(max_seq, (T + m - 1) / m * m);
    }
    hb.resize(b, T);
    for (size_t k = begin; k < end; ++k) ds.get(k, hb, static_cast<int64_t>(k - begin));
    ANATOMY_CHECK(hb.token_labels.size() == static_cast<size_t>(b * T),
                  "evaluate: the data has no per-word tags (a token-classification model evaluates tagged words)");
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
    // The labelled tokens are the words' first sub-tokens, in word order.
    for (int64_t row = 0; row < b * T; ++row) {
      const int32_t label = hb.token_labels[static_cast<size_t>(row)];
      if (label == -100) continue;
      const size_t s = begin + static_cast<size_t>(row / T);
      const std::span<const float> x(logits.data() + row * C, static_cast<size_t>(C));
      const int32_t pred = argmax(x);
      r.word_predictions[s].push_back(name(pred));
      r.word_labels[s].push_back(name(label));
      if (!r.labelled) continue;
      const double l = cross_entropy(x, label);
      ANATOMY_CHECK(std::isfinite(l), "evaluate: a non-finite loss at sample ", s);
      r.losses[s] += l;
      total += l;
      hits += pred == label;
      ++r.scored_tokens;
    }
    ++r.batches;
  }
  be.synchronize();
  if (r.labelled && r.scored_tokens > 0) {
    r.loss = total / static_cast<double>(r.scored_tokens);
    r.accuracy = static_cast<double>(hits) / static_cast<double>(r.scored_tokens);
    const EntityScores e = entity_scores(r.word_predictions, r.word_labels);
    r.precision = e.precision;
    r.recall = e.recall;
    r.f1 = e.f1;
  }
  r.runtime = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.samples_per_second = static_cast<double>(n) / std::max(r.runtime, 1e-9);
  return r;
}

}  // namespace anatomy
