// Masked-LM evaluation: the mean cross-entropy over the masked tokens, its perplexity, and the
// fraction of masked tokens predicted right (run_mlm.py's accuracy).
#include <cmath>

#include "data/dataset.h"
#include "train/evaluate.h"

namespace anatomy {

EvalResult evaluate_masked_lm(EncoderModel& model, const Dataset& ds, const EvalOptions& opt) {
  const int64_t V = model.config().vocab_size;
  double total = 0;
  EvalResult r = evaluate_per_token(
      model, ds, opt,
      [&](EvalResult& res, const HostBatch& hb, const std::vector<float>& logits, size_t first, int64_t T) {
        if (!res.labelled) return;
        ANATOMY_CHECK(hb.token_labels.size() == hb.input_ids.size(),
                      "evaluate: the data has no masked tokens (a masked-LM model evaluates masked texts)");
        for (size_t row = 0; row < hb.token_labels.size(); ++row) {
          const int32_t label = hb.token_labels[row];
          if (label == -100) continue;
          const size_t s = first + row / static_cast<size_t>(T);
          const std::span<const float> x(logits.data() + row * V, static_cast<size_t>(V));
          const double l = cross_entropy(x, label);
          ANATOMY_CHECK(std::isfinite(l), "evaluate: a non-finite masked-LM loss at sample ", s);
          res.losses[s] += l;
          total += l;
          res.correct_tokens += argmax(x) == label;
          ++res.scored_tokens;
        }
      });
  r.masked_lm = true;
  if (r.labelled && r.scored_tokens > 0) {
    r.loss = total / static_cast<double>(r.scored_tokens);
    r.perplexity = std::exp(r.loss);
    r.accuracy = static_cast<double>(r.correct_tokens) / static_cast<double>(r.scored_tokens);
  }
  return r;
}

}  // namespace anatomy
