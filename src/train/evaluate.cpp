#include "train/evaluate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <cmath>
#include <numeric>
#include <set>

#include "data/float_labels.h"
#include "data/text_dataset.h"
#include "io/atomic_file.h"
#include "ops/backend_memory.h"
#include "train/evaluate_float.h"

namespace anatomy {

// ---- metrics ----------------------------------------------------------------------------------

namespace {
void check_pairs(std::span<const int32_t> p, std::span<const int32_t> y, const char* what) {
  ANATOMY_CHECK(p.size() == y.size(), what, ": ", p.size(), " predictions for ", y.size(), " labels");
  ANATOMY_CHECK(!p.empty(), what, ": no samples");
}
}  // namespace

double accuracy(std::span<const int32_t> predictions, std::span<const int32_t> labels) {
  check_pairs(predictions, labels, "accuracy");
  size_t hits = 0;
  for (size_t i = 0; i < labels.size(); ++i) hits += predictions[i] == labels[i];
  return static_cast<double>(hits) / static_cast<double>(labels.size());
}

double macro_f1(std::span<const int32_t> predictions, std::span<const int32_t> labels) {
  check_pairs(predictions, labels, "macro_f1");
  std::set<int32_t> classes(labels.begin(), labels.end());
  classes.insert(predictions.begin(), predictions.end());
  double sum = 0;
  for (int32_t c : classes) {
    int64_t tp = 0, fp = 0, fn = 0;
    for (size_t i = 0; i < labels.size(); ++i) {
      const bool pred = predictions[i] == c, truth = labels[i] == c;
      tp += pred && truth;
      fp += pred && !truth;
      fn += !pred && truth;
    }
    sum += 2.0 * tp / static_cast<double>(2 * tp + fp + fn);  // > 0: c occurs or is predicted
  }
  return sum / static_cast<double>(classes.size());
}

namespace {
// log-sum-exp of a row, in double.
double log_sum_exp(std::span<const float> x) {
  double mx = -INFINITY;
  for (float v : x) mx = std::max(mx, static_cast<double>(v));
  if (std::isinf(mx)) return mx;
  double s = 0;
  for (float v : x) s += std::exp(static_cast<double>(v) - mx);
  return mx + std::log(s);
}
}  // namespace

double cross_entropy(std::span<const float> logits, int32_t label) {
  ANATOMY_CHECK(label >= 0 && static_cast<size_t>(label) < logits.size(), "cross_entropy: label ", label,
                " is not one of the ", logits.size(), " classes");
  return log_sum_exp(logits) - static_cast<double>(logits[label]);
}

double mean_cross_entropy(std::span<const float> logits, int64_t classes, std::span<const int32_t> labels) {
  ANATOMY_CHECK(classes > 0 && logits.size() == labels.size() * static_cast<size_t>(classes) && !labels.empty(),
                "mean_cross_entropy: ", logits.size(), " logits do not make ", labels.size(), " rows of ", classes);
  double s = 0;
  for (size_t i = 0; i < labels.size(); ++i) s += cross_entropy(logits.subspan(i * classes, classes), labels[i]);
  return s / static_cast<double>(labels.size());
}

std::vector<float> softmax(std::span<const float> logits) {
  const double lse = log_sum_exp(logits);
  std::vector<float> p(logits.size());
  for (size_t c = 0; c < logits.size(); ++c) p[c] = static_cast<float>(std::exp(static_cast<double>(logits[c]) - lse));
  return p;
}

int32_t argmax(std::span<const float> logits) {
  ANATOMY_CHECK(!logits.empty(), "argmax: no classes");
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// ---- evaluation -------------------------------------------------------------------------------

int64_t pack_evaluation_batch(Backend& be, const HostBatch& hb, DeviceBatch& db, const Buffer& rows_buffer,
                              const Buffer& first_buffer, const EvalOptions& opt) {
  const int64_t b = hb.batch, T = hb.seq;
  const int64_t row_multiple = be.device() == Device::CUDA ? 128 : 1;  // Note [evaluation batches]
  const PackedRows pr = pack_token_rows(hb.attention_mask.data(), b, T, row_multiple);
  const int64_t rows = static_cast<int64_t>(pr.token_rows.size());
  if (static_cast<double>(b * T - rows) < opt.skip_padding_min_fraction * static_cast<double>(b * T) || rows >= b * T)
    return b * T;
  db.token_rows = rows_buffer.tensor().slice(0, rows);
  db.first_rows = first_buffer.tensor().slice(0, b);
  be.upload(db.token_rows, pr.token_rows.data());
  be.upload(db.first_rows, pr.first_rows.data());
  if (pr.right_padded()) {  // Note [packed attention] in ops/cpu/attention.cpp: the offsets end the first rows
    db.seq_offsets = first_buffer.tensor().slice(0, b + 1);
    db.attended_pairs = pr.attended_pairs;
    be.upload(first_buffer.tensor().slice(b, b + 1), &pr.sequence_rows);
  }
  return rows;
}

int64_t evaluation_buffer_bytes(int64_t batch, int64_t seq, bool skip_padding) {
  return 4 * (3 * batch * seq + batch) + (skip_padding ? 4 * (batch * seq + batch + 1) : 0);
}

MemoryPlan plan_evaluation(const BertConfig& cfg, const ModelShape& shape, Device device, bool skip_padding) {
  ModelShape s = shape;
  s.training = false;
  MemoryPlan p = plan_memory({cfg, s, OptimizerKind::AdamW, device});
  p.bytes[Category::Other] = evaluation_buffer_bytes(s.max_batch, s.max_seq, skip_padding);
  // plan_memory counts the attention scratch for training only; the CUDA forward takes it too.
  if (device == Device::CUDA)
    p.bytes[Category::Temporary] += static_cast<int64_t>(attention_scratch_bytes(
        s.max_batch, s.max_seq, static_cast<int>(cfg.num_attention_heads), static_cast<int>(cfg.head_dim()), s.compute));
  return p;
}

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

Tensor front(const Buffer& buf, int64_t rows, int64_t cols) {
  return buf.tensor().view({static_cast<int64_t>(buf.tensor().numel())}).slice(0, rows * cols).view({rows, cols});
}

EvalResult evaluate(EncoderModel& model, const Dataset& ds, const EvalOptions& opt) {
  if (is_masked_lm(model.config())) return evaluate_masked_lm(model, ds, opt);
  if (is_token_classification(model.config())) return evaluate_token_classification(model, ds, opt);
  const auto t0 = Clock::now();
  Backend& be = model.backend();
  const size_t n = ds.size();
  ANATOMY_CHECK(n > 0, "evaluate: the evaluation data has no samples");
  ANATOMY_CHECK(opt.batch_size >= 1, "--per-device-eval-batch-size must be at least 1 (got ", opt.batch_size, ")");
  const auto* text = dynamic_cast<const TextDataset*>(&ds);
  const auto* float_labelled = dynamic_cast<const FloatLabelDataset*>(&ds);
  if (float_labelled) text = dynamic_cast<const TextDataset*>(&float_labelled->base());
  std::vector<int64_t> lengths = opt.lengths;
  if (lengths.empty()) lengths = ds.lengths();
  ANATOMY_CHECK(lengths.empty() || lengths.size() == n, "evaluate: ", lengths.size(), " lengths for ", n, " samples");
  const int64_t max_seq = model.shape().max_seq, C = model.config().num_labels;
  const int64_t longest = lengths.empty() ? ds.seq_len() : *std::max_element(lengths.begin(), lengths.end());
  ANATOMY_CHECK(longest <= max_seq, "evaluate: samples of ", longest, " tokens exceed the model's planned sequence length ",
                max_seq);

  EvalResult r;
  r.samples = static_cast<int64_t>(n);
  r.num_labels = C;
  r.problem = problem_type_of(model.config());
  const bool floats = has_float_labels(r.problem);
  // A float-labelled set's text part is read without labels; its labels are the float ones (a
  // set that has none after all is refused at its first batch).
  const bool unlabelled_text = text && text->labels().kind == LabelSet::Kind::None;
  r.labelled = opt.labelled && !(unlabelled_text && !(floats && float_labelled));
  r.skip_padding = opt.skip_padding;
  r.batch_size = std::min(opt.batch_size, model.shape().max_batch);
  const int64_t B = r.batch_size;

  // Note [evaluation batches]: longest first when lengths are known (stable: ties keep dataset order).
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  if (!lengths.empty() && opt.sort_by_length)
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });

  Allocator& al = be.allocator();
  Buffer d_ids(al, DType::I32, {B * max_seq}, Category::Other), d_types(al, DType::I32, {B * max_seq}, Category::Other),
      d_mask(al, DType::I32, {B * max_seq}, Category::Other), d_labels(al, DType::I32, {B}, Category::Other), d_rows,
      d_first;
  if (opt.skip_padding) {
    d_rows = Buffer(al, DType::I32, {B * max_seq}, Category::Other);
    d_first = Buffer(al, DType::I32, {B + 1}, Category::Other);  // first rows, or the offsets
  }

  r.predictions.assign(n, 0);
  r.labels.assign(n, 0);
  if (r.labelled) r.losses.assign(n, 0.0);
  if (opt.keep_probabilities) r.probabilities.assign(n * C, 0.0f);
  if (floats) r.outputs.assign(n * C, 0.0f);
  if (floats && r.labelled) r.targets.assign(n * C, 0.0f);
  HostBatch hb;
  std::vector<float> logits;
  for (size_t begin = 0; begin < n; begin += static_cast<size_t>(B)) {
    const size_t end = std::min(n, begin + static_cast<size_t>(B));
    const int64_t b = static_cast<int64_t>(end - begin);
    int64_t T = ds.seq_len();
    if (!lengths.empty()) {
      T = 1;
      for (size_t k = begin; k < end; ++k) T = std::max(T, lengths[order[k]]);
      const int64_t m = std::max<int64_t>(1, opt.pad_to_multiple_of);
      T = std::min(max_seq, (T + m - 1) / m * m);
    }
    hb.resize(b, T);
    for (size_t k = begin; k < end; ++k) ds.get(order[k], hb, static_cast<int64_t>(k - begin));
    if (floats && r.labelled)
      ANATOMY_CHECK(hb.target_width == C, "evaluate: the data has ", hb.target_width == 0 ? "class labels" : "float labels",
                    hb.target_width ? str_cat(" of width ", hb.target_width) : std::string(), " but the model's problem_type ",
                    problem_type_name(r.problem), " needs ", C, " float labels per sample");
    if (r.labelled && !floats)
      for (int64_t i = 0; i < b; ++i)
        ANATOMY_CHECK(hb.labels[i] >= 0 && hb.labels[i] < C, "evaluate: sample ", order[begin + i], " has label ",
                      hb.labels[i], " but the model has ", C, " classes");

    be.set_phase(Phase::Data);
    DeviceBatch db{front(d_ids, b, T), front(d_types, b, T), front(d_mask, b, T), d_labels.tensor().slice(0, b)};
    be.upload(db.input_ids, hb.input_ids.data());
    be.upload(db.token_type_ids, hb.token_type_ids.data());
    be.upload(db.attention_mask, hb.attention_mask.data());
    be.upload(db.labels, hb.labels.data());
    const int64_t packing = opt.skip_padding ? pack_evaluation_batch(be, hb, db, d_rows, d_first, opt) : b * T;
    model.forward_eval(db);
    // The model may compute padded all the same (Note [modernbert packed tokens]).
    const int64_t computed = packing < b * T && model.last_forward_packed() ? packing : b * T;
    r.packed_batches += computed < b * T;
    be.set_phase(Phase::Data);
    download_logits(be, model.logits().slice(0, b), logits);
    // An argmax over NaN is meaningless and the loss would be NaN: no accuracy is reported
    // from logits that are not all finite (a model that overflowed or holds NaN).
    for (size_t i = 0; i < static_cast<size_t>(b * C); ++i)
      ANATOMY_CHECK(std::isfinite(logits[i]), "evaluate: sample ", order[begin + i / static_cast<size_t>(C)],
                    " has a non-finite logit (", logits[i], "); refusing to report loss or accuracy from it (the model's "
                    "weights or activations hold NaN or Inf)");

    r.padded_tokens += b * T;
    r.computed_tokens += computed;
    for (int32_t m : hb.attention_mask) r.tokens += m != 0;
    for (int64_t i = 0; i < b; ++i) {
      const size_t s = order[begin + i];
      const std::span<const float> row(logits.data() + i * C, static_cast<size_t>(C));
      r.predictions[s] = argmax(row);
      r.labels[s] = hb.labels[i];
      if (floats) {
        std::copy(row.begin(), row.end(), r.outputs.begin() + static_cast<std::ptrdiff_t>(s * C));
        if (r.labelled) {
          const std::span<const float> y(hb.targets.data() + i * C, static_cast<size_t>(C));
          std::copy(y.begin(), y.end(), r.targets.begin() + static_cast<std::ptrdiff_t>(s * C));
          r.losses[s] = float_label_loss(r.problem, row, y);
        }
      } else if (r.labelled) {
        r.losses[s] = cross_entropy(row, hb.labels[i]);
      }
      if (opt.keep_probabilities && r.problem == ProblemType::MultiLabel) {
        for (int64_t c = 0; c < C; ++c) r.probabilities[s * C + c] = static_cast<float>(1.0 / (1.0 + std::exp(-row[c])));
      } else if (opt.keep_probabilities && r.problem == ProblemType::Regression) {
        std::copy(row.begin(), row.end(), r.probabilities.begin() + static_cast<std::ptrdiff_t>(s * C));
      } else if (opt.keep_probabilities) {
        const std::vector<float> p = softmax(row);
        std::copy(p.begin(), p.end(), r.probabilities.begin() + static_cast<std::ptrdiff_t>(s * C));
      }
    }
    ++r.batches;
  }
  be.synchronize();
  if (r.labelled && floats) {
    finish_float_metrics(r);
  } else if (r.labelled) {
    r.loss = std::accumulate(r.losses.begin(), r.losses.end(), 0.0) / static_cast<double>(n);
    r.accuracy = accuracy(r.predictions, r.labels);
    r.macro_f1 = macro_f1(r.predictions, r.labels);
  }
  r.runtime = std::chrono::duration<double>(Clock::now() - t0).count();
  r.samples_per_second = static_cast<double>(n) / std::max(r.runtime, 1e-9);
  return r;
}

MetricKind metric_kind(const EvalResult& r) {
  if (r.masked_lm) return MetricKind::MaskedLm;
  if (r.token_classification) return MetricKind::Tokens;
  if (r.problem == ProblemType::Regression) return MetricKind::Regression;
  if (r.problem == ProblemType::MultiLabel) return MetricKind::MultiLabel;
  return MetricKind::SingleLabel;
}

MetricKind metric_kind(const BertConfig& cfg) {
  if (is_masked_lm(cfg)) return MetricKind::MaskedLm;
  if (is_token_classification(cfg)) return MetricKind::Tokens;
  const ProblemType p = problem_type_of(cfg);
  return p == ProblemType::Regression ? MetricKind::Regression
         : p == ProblemType::MultiLabel ? MetricKind::MultiLabel
                                        : MetricKind::SingleLabel;
}

std::vector<std::string> metric_names(MetricKind kind) {
  switch (kind) {
    case MetricKind::SingleLabel: return {"loss", "accuracy", "macro_f1"};
    case MetricKind::Regression: return {"loss", "mse", "pearson"};
    case MetricKind::MultiLabel: return {"loss", "f1", "micro_f1"};  // run_classification.py's f1 is micro
    case MetricKind::Tokens: return {"loss", "precision", "recall", "f1", "accuracy"};
    case MetricKind::MaskedLm: return {"loss", "accuracy", "perplexity"};
  }
  return {"loss"};
}

double metric_value(const EvalResult& r, const std::string& name) {
  const std::map<std::string, double> all = {{"loss", r.loss},         {"accuracy", r.accuracy}, {"macro_f1", r.macro_f1},
                                             {"mse", r.mse},           {"pearson", r.pearson},   {"micro_f1", r.micro_f1},
                                             {"precision", r.precision}, {"recall", r.recall},   {"f1", r.f1},
                                             {"perplexity", r.perplexity}};
  const auto it = all.find(name);
  ANATOMY_CHECK(it != all.end(), "internal error: no metric ", name);
  return it->second;
}

std::string metric_key(const std::string& name, const std::string& prefix) {
  return name == "perplexity" ? name : prefix + name;
}

double speed_metric(double value, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(value * scale) / scale;
}

nlohmann::json eval_metrics_json(const EvalResult& r, const std::string& prefix) {
  nlohmann::json j;
  if (r.labelled)
    for (const std::string& m : metric_names(metric_kind(r))) j[metric_key(m, prefix)] = metric_value(r, m);
  if (r.labelled && r.masked_lm) j[prefix + "scored_tokens"] = r.scored_tokens;
  j[prefix + "samples"] = r.samples;
  j[prefix + "runtime"] = speed_metric(r.runtime, 4);
  j[prefix + "samples_per_second"] = speed_metric(r.samples_per_second, 3);
  j[prefix + "steps_per_second"] = speed_metric(static_cast<double>(r.batches) / std::max(r.runtime, 1e-9), 3);
  j[prefix + "tokens"] = r.tokens;
  j[prefix + "padded_tokens"] = r.padded_tokens;
  j[prefix + "computed_tokens"] = r.computed_tokens;
  j[prefix + "skip_padding"] = r.skip_padding;
  j[prefix + "packed_batches"] = r.packed_batches;
  j[prefix + "batches"] = r.batches;
  return j;
}

void write_predictions(const std::string& path, const EvalResult& r, const std::map<int, std::string>& id2label) {
  auto name = [&](int32_t id) {
    auto it = id2label.find(id);
    return it != id2label.end() ? it->second : std::to_string(id);
  };
  const bool probs = r.probabilities.size() == static_cast<size_t>(r.samples * r.num_labels);
  std::string out;
  if (r.token_classification) {  // per sentence: the tags of its words
    for (int64_t i = 0; i < r.samples; ++i) {
      nlohmann::ordered_json j{{"index", i}, {"prediction", r.word_predictions[static_cast<size_t>(i)]}};
      if (r.labelled) j["label"] = r.word_labels[static_cast<size_t>(i)];
      out += j.dump() + "\n";
    }
    write_file_atomic(path, out);
    return;
  }
  if (r.masked_lm) {  // per text: its masked tokens' summed loss
    for (int64_t i = 0; i < r.samples; ++i)
      out += nlohmann::ordered_json{{"index", i}, {"masked_loss_sum", r.losses[static_cast<size_t>(i)]}}.dump() + "\n";
    write_file_atomic(path, out);
    return;
  }
  if (has_float_labels(r.problem)) {
    for (int64_t i = 0; i < r.samples; ++i) out += float_prediction_line(r, i, id2label) + "\n";
    write_file_atomic(path, out);
    return;
  }
  for (int64_t i = 0; i < r.samples; ++i) {
    nlohmann::ordered_json j = {{"index", i}, {"prediction", name(r.predictions[i])}, {"prediction_id", r.predictions[i]}};
    if (r.labelled) {
      j["label"] = name(r.labels[i]);
      j["label_id"] = r.labels[i];
    }
    if (probs) {
      const auto first = r.probabilities.begin() + i * r.num_labels;
      j["probabilities"] = std::vector<float>(first, first + r.num_labels);
    }
    out += j.dump();
    out += '\n';
  }
  write_file_atomic(path, out);
}

int64_t predict_into(const TrainOptions& opt, EncoderModel& model, const Dataset& ds, int64_t batch,
                     const BertConfig& cfg) {
  if (is_token_classification(cfg)) return predict_tags_into(opt, model, ds, batch);
  EvalOptions eo;
  eo.batch_size = batch;
  eo.labelled = false;
  eo.keep_probabilities = false;
  const EvalResult r = evaluate(model, ds, eo);
  std::string out = "index\tprediction\n";
  for (int64_t i = 0; i < r.samples && has_float_labels(r.problem); ++i)
    out += str_cat(i, "\t", float_prediction_text(r, i, cfg.id2label), "\n");
  // Classes the data named are written by name; integer labels (the default names LABEL_<i>)
  // as the integer, as run_glue.py writes them.
  const bool named = LabelSet::from_id2label(cfg.id2label).kind == LabelSet::Kind::Names;
  for (int64_t i = 0; i < r.samples && !has_float_labels(r.problem); ++i) {
    const int64_t p = r.predictions[static_cast<size_t>(i)];
    auto it = cfg.id2label.find(static_cast<int>(p));
    out += str_cat(i, "\t", named && it != cfg.id2label.end() ? it->second : std::to_string(p), "\n");
  }
  const std::string path = (std::filesystem::path(opt.output_dir) / "predict_results.txt").string();
  write_file_atomic(path, out);
  std::fprintf(stderr, "anatomy: predicted %lld samples of %s into %s\n", static_cast<long long>(r.samples),
               opt.test_file.c_str(), path.c_str());
  return r.samples;
}

}  // namespace anatomy
