// Evaluation of a sequence classifier on a dataset: mean cross-entropy, accuracy and macro-F1,
// with per-sample predictions and probabilities. `anatomy eval` runs it on a saved model; the
// trainer runs it on its training model every --eval-steps.
//
// Note [evaluation batches]: samples are batched in dataset order, or, when their lengths are
// known (a TextDataset, or EvalOptions::lengths), longest first, so each batch is padded only to
// its longest sample and batches of similar length go together (the first batch is the longest,
// so the device's scratch reaches its size once); sort_by_length off keeps the dataset order and
// still pads each batch only to its longest. Every result is reported in dataset order.
// With skip_padding the model's encoder computes on real tokens only (Note [packed inference] in
// model/bert.cpp); on CUDA the packed row count is rounded up to a multiple of 128 (padding rows
// fill it, see pack_token_rows), since cuBLASLt plans each new GEMM shape once and a fresh row
// count every batch made the packed path slower than the padded one in bf16. Packing also costs
// gathers, scatters and a zero fill per layer's attention, so a batch runs packed only when that
// skips at least skip_padding_min_fraction of its rows: length-sorted batches hold little padding
// and mostly run padded; batches in file order (half padding, say) run packed. The only device
// memory evaluate() takes is the batch and its packing index (Category::Other,
// evaluation_buffer_bytes), freed when it returns.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "memory/planner.h"
#include "model/encoder.h"
#include "model/heads.h"
#include "train/options.h"

namespace anatomy {

// ---- metrics (pure functions) ---------------------------------------------------------------
// Fraction of predictions equal to the labels. Throws when the sizes differ or are zero.
double accuracy(std::span<const int32_t> predictions, std::span<const int32_t> labels);
// Macro-averaged F1: F1 = 2 TP / (2 TP + FP + FN) per class, averaged over the classes present
// in labels or predictions (their union), as sklearn's f1_score(average='macro') does when it is
// not given a label list: a class that neither occurs nor is predicted does not count.
double macro_f1(std::span<const int32_t> predictions, std::span<const int32_t> labels);
// log softmax(logits)[label] negated, in double; logits holds one row of classes.
double cross_entropy(std::span<const float> logits, int32_t label);
// Mean of cross_entropy over rows: logits [n, classes] row-major, labels [n].
double mean_cross_entropy(std::span<const float> logits, int64_t classes, std::span<const int32_t> labels);
// Float labels (Note [problem types] in model/heads.h), over every element of [n, width]:
// the mean squared error; Pearson's correlation of outputs and targets (NaN when either is
// constant); micro-F1 of the multi-hot predictions sigmoid(logit) > 0.5 (logit > 0) against
// the multi-hot targets (0 when there are no positives on either side, as sklearn reports).
double mean_squared_error(std::span<const float> outputs, std::span<const float> targets);
double pearson(std::span<const float> outputs, std::span<const float> targets);
double micro_f1_at_half(std::span<const float> logits, std::span<const float> targets);
// Softmax in double (returned as float) and the first index of the largest logit.
std::vector<float> softmax(std::span<const float> logits);
int32_t argmax(std::span<const float> logits);

// ---- evaluation -----------------------------------------------------------------------------
struct EvalOptions {
  int64_t batch_size = 32;   // capped at the model's planned micro-batch (ModelShape::max_batch)
  bool skip_padding = true;  // the packed forward (Note [packed inference] in model/bert.cpp)
  // ... for the batches where it skips at least this fraction of the rows (Note [evaluation batches]).
  double skip_padding_min_fraction = 0.125;
  // Per-sample lengths for dynamic padding (Note [evaluation batches]); empty: a TextDataset's own,
  // else every sample is ds.seq_len() long and batches keep the dataset order.
  std::vector<int64_t> lengths;
  bool sort_by_length = true;  // false: dataset order even with lengths (each batch still padded to its longest)
  // With lengths: a batch's length rounded up to a multiple of this (at most the model's planned
  // length), as DataCollatorWithPadding's pad_to_multiple_of: fewer distinct shapes to plan.
  int64_t pad_to_multiple_of = 8;
  // Whether the dataset's labels are true labels (loss, accuracy, F1). A TextDataset read without
  // a label column is unlabelled whatever this says.
  bool labelled = true;
  bool keep_probabilities = true;  // fill EvalResult::probabilities
};

struct EvalResult {
  static constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  int64_t samples = 0, num_labels = 0, batches = 0, batch_size = 0;
  bool labelled = false;
  double loss = kNaN, accuracy = kNaN, macro_f1 = kNaN;  // labelled only
  double runtime = 0;             // seconds, batching and transfers included
  double samples_per_second = 0;
  // Tokens: real ones (mask 1), what padded batches hold (sum of B x T), and the rows the
  // encoder computed (the real ones plus any first token that is padding, when packed).
  int64_t tokens = 0, padded_tokens = 0, computed_tokens = 0;
  bool skip_padding = false;
  int64_t packed_batches = 0;  // batches that ran the packed forward
  // Per sample, in dataset order.
  std::vector<int32_t> predictions;
  std::vector<int32_t> labels;       // as the dataset gives them (meaningless when unlabelled)
  std::vector<double> losses;        // labelled only
  std::vector<float> probabilities;  // [samples, num_labels], when kept
  // Regression and multi-label (Note [problem types]): the logits and the float labels
  // [samples, num_labels]; mse and pearson (regression) or micro_f1 (multi-label, threshold 0.5
  // on the sigmoid), labelled only. accuracy and macro_f1 stay NaN.
  ProblemType problem = ProblemType::SingleLabel;
  std::vector<float> outputs, targets;
  double mse = kNaN, pearson = kNaN, micro_f1 = kNaN;
  // Masked-LM (Note [masked LM head] in model/heads.h): loss is the mean over every scored
  // (masked) token of the set, perplexity its exp, as run_mlm.py reports; losses[s] holds sample
  // s's sum over its scored tokens.
  // accuracy is the fraction of scored tokens predicted right (correct_tokens of scored_tokens),
  // as run_mlm.py's compute_metrics; token classification counts the same way.
  bool masked_lm = false;
  int64_t scored_tokens = 0, correct_tokens = 0;
  double perplexity = kNaN;
  // Token classification (Note [token classification head]): per sample the predicted and
  // gold tag names of its words; entity-level precision, recall, F1 (CoNLL, data/token_tags.h)
  // and the accuracy over the labelled tokens, as run_ner.py reports them.
  bool token_classification = false;
  std::vector<std::vector<std::string>> word_predictions, word_labels;
  double precision = kNaN, recall = kNaN, f1 = kNaN;
};

// Token-classification evaluation (evaluate() calls it for a *ForTokenClassification model).
EvalResult evaluate_token_classification(EncoderModel& model, const Dataset& ds,
                                         const EvalOptions& options);

// Masked-LM evaluation (evaluate() calls it for a *ForMaskedLM model): padded batches in the
// dataset order of the masked samples, the loss computed on the host from the logits.
EvalResult evaluate_masked_lm(EncoderModel& model, const Dataset& ds, const EvalOptions& options);

// What the two per-token evaluations share (train/evaluate_tokens.cpp): `ds` in padded batches
// (to each batch's longest of opt.lengths, else of ds.lengths(), rounded up to pad_to_multiple_of;
// the dataset's length without either) through the inference forward; `visit(r, batch, logits, first, T)` scores each
// batch's [b * T, classes] logits (samples first .. first + b - 1). The result carries the counts,
// batches and timing; the visitor and the caller fill in the metrics.
using TokenBatchVisitor = std::function<void(EvalResult& r, const HostBatch& batch, const std::vector<float>& logits,
                                             size_t first, int64_t T)>;
EvalResult evaluate_per_token(EncoderModel& model, const Dataset& ds, const EvalOptions& opt,
                              const TokenBatchVisitor& visit);
// Device logits (compute dtype) to host floats.
void download_logits(Backend& be, const Tensor& logits, std::vector<float>& out);
// The first `rows` x `cols` elements of a flat device buffer as a [rows, cols] tensor.
Tensor front(const Buffer& buf, int64_t rows, int64_t cols);

// The loss and metrics of a float-label result from its losses, outputs and targets.
void finish_float_metrics(EvalResult& r);

// Runs model.forward_eval over the whole dataset (Note [evaluation batches]). Works with any
// model shape, training or inference; on the CPU and CUDA backends.
EvalResult evaluate(EncoderModel& model, const Dataset& ds, const EvalOptions& options = {});

// Note [task metrics]: what an evaluation reports, by kind of task, named as the HF scripts name
// them, loss first: single-label accuracy, macro_f1; regression mse, pearson; multi-label
// f1 (run_classification.py's name: micro-averaged) and micro_f1 (the same value, anatomy's
// earlier name); token classification precision, recall, f1, accuracy (run_ner.py); masked LM
// accuracy (of the masked tokens) and perplexity (run_mlm.py; its key is never prefixed). One list
// for the result files, the log lines, `anatomy eval` and the check that --metric-for-best-model
// names one of its task's (the Trainer fails with a KeyError at the first evaluation otherwise);
// the flag's spellings are the option table's (cli/options_table.cpp).
enum class MetricKind { SingleLabel, Regression, MultiLabel, Tokens, MaskedLm };
MetricKind metric_kind(const EvalResult& r);
MetricKind metric_kind(const BertConfig& cfg);
std::vector<std::string> metric_names(MetricKind kind);  // "loss" first
double metric_value(const EvalResult& r, const std::string& name);
// The key of a metric in a result file: prefix + name, except perplexity.
std::string metric_key(const std::string& name, const std::string& prefix = "eval_");

// The labelled metrics of Note [task metrics] (prefixed), eval_samples, eval_runtime,
// eval_samples_per_second, and the token counts, in the Trainer's style (`prefix` + name).
nlohmann::json eval_metrics_json(const EvalResult& r, const std::string& prefix = "eval_");

// The Trainer's speed_metrics: a runtime to 4 decimals and a rate to 3, as its logs and result
// files give them (Python's round); anatomy's own figures (steady_samples_per_second, the log's
// samples_per_second) keep every digit.
double speed_metric(double value, int decimals);

// One JSON line per sample, atomically: {"index", "prediction" (the id2label name),
// "prediction_id", "label" and "label_id" (labelled only), "probabilities" (when kept)};
// regression and multi-label as evaluate_float.h says; masked-LM {"index", "masked_loss_sum"}.
void write_predictions(const std::string& path, const EvalResult& r, const std::map<int, std::string>& id2label);

// --do-predict: the model's predictions for `ds` (read without labels), batches of `batch`, into
// OUTPUT_DIR/predict_results.txt as run_glue.py writes it: a header "index\tprediction", then one
// line per sample with its id2label name. Returns the number of samples.
int64_t predict_into(const TrainOptions& opt, EncoderModel& model, const Dataset& ds, int64_t batch,
                     const BertConfig& cfg);
// --do-predict for token classification, as run_ner.py writes it: OUTPUT_DIR/predictions.txt,
// one line per sentence with its words' predicted tags separated by spaces (words cut off by
// --max-seq-length have none), and, when the test file is tagged, OUTPUT_DIR/predict_results.json
// with the predict_ metrics (loss, precision, recall, f1, accuracy). Returns the sentences.
int64_t predict_tags_into(const TrainOptions& opt, EncoderModel& model, const Dataset& ds,
                          int64_t batch);

// With --skip-padding: packs the uploaded batch db (hb's mask) into the index buffers I32
// [B*T] and [B + 1] when that skips at least opt.skip_padding_min_fraction of its rows (Note
// [evaluation batches]); returns the rows the forward computes (B*T when it stays padded).
int64_t pack_evaluation_batch(Backend& be, const HostBatch& hb, DeviceBatch& db, const Buffer& rows_buffer,
                              const Buffer& first_buffer, const EvalOptions& opt);

// Device bytes evaluate() holds (Category::Other) for batches of `batch` x `seq`: ids, token
// types and mask I32 [B, T], labels I32 [B], and with skip_padding the packing index I32 [B*T + B + 1].
int64_t evaluation_buffer_bytes(int64_t batch, int64_t seq, bool skip_padding);

// The memory of an inference run as plan_memory gives it (shape.training false), with Other as
// evaluate() takes it and, on CUDA, the attention scratch that the forward allocates.
MemoryPlan plan_evaluation(const BertConfig& cfg, const ModelShape& shape, Device device, bool skip_padding);

}  // namespace anatomy
