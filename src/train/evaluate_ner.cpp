// Token-classification evaluation: the loss over the labelled tokens, their accuracy, and CoNLL
// entity scores over the words' tags (each word's tag is its first sub-token's).
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "data/dataset.h"
#include "data/token_tags.h"
#include "io/atomic_file.h"
#include "train/evaluate.h"

namespace anatomy {

EvalResult evaluate_token_classification(EncoderModel& model, const Dataset& ds,
                                         const EvalOptions& options) {
  // Words read without tags (TokenTagOptions::tags_optional) are predicted, never scored.
  EvalOptions opt = options;
  if (const auto* tagged = dynamic_cast<const TokenTagDataset*>(&ds); tagged && !tagged->tagged()) opt.labelled = false;
  const BertConfig& cfg = model.config();
  const int64_t C = cfg.num_labels;
  auto name = [&](int32_t id) {
    auto it = cfg.id2label.find(id);
    return it != cfg.id2label.end() ? it->second : std::to_string(id);
  };
  std::vector<std::vector<std::string>> words_pred(ds.size()), words_gold(ds.size());
  double total = 0;
  EvalResult r = evaluate_per_token(
      model, ds, opt,
      [&](EvalResult& res, const HostBatch& hb, const std::vector<float>& logits, size_t first, int64_t T) {
        ANATOMY_CHECK(hb.token_labels.size() == hb.input_ids.size(),
                      "evaluate: the data has no per-word tags (a token-classification model evaluates tagged words)");
        // The labelled tokens are the words' first sub-tokens, in word order.
        for (size_t row = 0; row < hb.token_labels.size(); ++row) {
          const int32_t label = hb.token_labels[row];
          if (label == -100) continue;
          const size_t s = first + row / static_cast<size_t>(T);
          const std::span<const float> x(logits.data() + row * C, static_cast<size_t>(C));
          const int32_t pred = argmax(x);
          words_pred[s].push_back(name(pred));
          words_gold[s].push_back(name(label));
          if (!res.labelled) continue;
          const double l = cross_entropy(x, label);
          ANATOMY_CHECK(std::isfinite(l), "evaluate: a non-finite loss at sample ", s);
          res.losses[s] += l;
          total += l;
          res.correct_tokens += pred == label;
          ++res.scored_tokens;
        }
      });
  r.token_classification = true;
  r.num_labels = C;
  r.word_predictions = std::move(words_pred);
  r.word_labels = std::move(words_gold);
  if (r.labelled && r.scored_tokens > 0) {
    r.loss = total / static_cast<double>(r.scored_tokens);
    r.accuracy = static_cast<double>(r.correct_tokens) / static_cast<double>(r.scored_tokens);
    const EntityScores e = entity_scores(r.word_predictions, r.word_labels);
    r.precision = e.precision;
    r.recall = e.recall;
    r.f1 = e.f1;
  }
  return r;
}

int64_t predict_tags_into(const TrainOptions& opt, EncoderModel& model, const Dataset& ds,
                          int64_t batch) {
  EvalOptions eo;
  eo.batch_size = batch;
  eo.keep_probabilities = false;
  const EvalResult r = evaluate_token_classification(model, ds, eo);
  std::string lines;
  for (const auto& words : r.word_predictions) {
    for (size_t w = 0; w < words.size(); ++w) lines += (w ? " " : "") + words[w];
    lines += "\n";
  }
  const std::filesystem::path dir(opt.output_dir);
  write_file_atomic((dir / "predictions.txt").string(), lines);
  if (r.labelled) {
    nlohmann::json metrics = eval_metrics_json(r, "predict_");
    write_file_atomic((dir / "predict_results.json").string(), metrics.dump(4) + "\n");
  }
  std::fprintf(stderr, "anatomy: predicted the tags of %lld sentences of %s into %s%s\n",
               static_cast<long long>(r.samples), opt.test_file.c_str(), (dir / "predictions.txt").c_str(),
               r.labelled ? str_cat(" (", r.f1, " entity F1 in predict_results.json)").c_str() : "");
  return r.samples;
}

}  // namespace anatomy
