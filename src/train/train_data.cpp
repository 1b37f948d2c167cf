#include "train/train_data.h"

#include <cstdio>

#include "core/error.h"
#include "data/masked_lm.h"
#include "data/tokenizer.h"
#include "train/task_data.h"

namespace anatomy {

std::vector<int64_t> TrainData::split_validation(const std::shared_ptr<const Dataset>& all,
                                                 const std::vector<int64_t>& lengths, double fraction, uint64_t seed) {
  return split_validation(all, lengths, split(*all, fraction, seed));
}

std::vector<int64_t> TrainData::split_validation(const std::shared_ptr<const Dataset>& all,
                                                 const std::vector<int64_t>& lengths, TrainValSplit s) {
  std::vector<int64_t> kept;
  if (!lengths.empty()) {
    for (size_t i : s.train) kept.push_back(lengths[i]);
    for (size_t i : s.val) validation_lengths.push_back(lengths[i]);
  }
  train = std::make_shared<OwningSubset>(all, std::move(s.train));
  validation = std::make_shared<OwningSubset>(all, std::move(s.val));
  return kept;
}

BatchPlan TrainData::batch_plan(int64_t batch, uint64_t seed, bool group_by_length) const {
  if (train_lengths.empty()) return BatchPlan(train->size(), batch, seed);
  return BatchPlan(train_lengths, batch, seed, group_by_length);
}

// Note [unknown-token share]
// A tokenizer that does not cover the text maps most of it to its unknown token, and training then
// sees little more than the samples' lengths, with no error anywhere: transformers 5's
// BertTokenizerFast(vocab_file=...) ignores the argument and saves a tokenizer.json of five tokens,
// with which bench/real_text.py's runs (the Trainer's and ours) once trained on "[CLS] [UNK]
// [UNK] ... [SEP]". So the share of the unknown token among the real tokens of up to 512
// training samples is measured after loading (`anatomy eval`: of the evaluation file), and from
// kUnknownWarnShare up it is a warning that names the tokenizer and its size. Well-matched text
// has well under 1%.
constexpr double kUnknownWarnShare = 0.05;

std::string unknown_token_warning(const Dataset& data, const Tokenizer& tok, const std::string& tok_dir,
                                  int64_t model_vocab, bool training) {
  const double share = unknown_token_share(data, tok.unk_id());
  if (share < kUnknownWarnShare) return {};
  char pct[16];
  std::snprintf(pct, sizeof pct, "%.1f%%", 100.0 * share);
  return str_cat("warning: ", pct, " of the ", training ? "training" : "evaluation", " tokens are the unknown token ",
                 tok.id_to_token(tok.unk_id()), ": the tokenizer of ", tok_dir, " (", tok.vocab_size(),
                 " tokens; the model's vocab_size is ", model_vocab, ") does not cover this text, so the model ",
                 training ? "would learn" : "sees", " little but its lengths");
}

static TrainData load_text_data(const TrainOptions& opt, BertConfig& cfg, const Tokenizer& tok, const std::string& tok_dir,
                                TrainData d);

TrainData load_train_data(const TrainOptions& opt, BertConfig& cfg) {
  TrainData d;
  if (opt.train_file.empty()) {
    ANATOMY_CHECK(!opt.masked_lm(), "--task mlm needs --train-file (a text file: JSONL, CSV or .txt lines)");
    ANATOMY_CHECK(opt.validation_file.empty(), "--validation-file needs --train-file (synthetic data has no file)");
    auto all = std::make_shared<SyntheticDataset>(parse_synthetic_kind(opt.dataset), static_cast<size_t>(opt.num_samples),
                                                  opt.seq_len, cfg.vocab_size, opt.seed);
    d.train = all;
    if (opt.validation_split > 0) {
      d.split_validation(all, {}, opt.validation_split, opt.seed);
    }
    d.description = str_cat("synthetic '", opt.dataset, "' data, ", d.train->size(), " training samples of ", opt.seq_len,
                             " tokens");
    ANATOMY_CHECK(opt.test_file.empty(), "--test-file needs --train-file (synthetic data has no labels to predict)");
    const std::string tok_dir = !opt.tokenizer.empty() ? opt.tokenizer : opt.model_name_or_path;
    if (!tok_dir.empty()) d.tokenizer_files = Tokenizer::files_to_save(tok_dir, cfg.model_type());
    return d;
  }

  const std::string tok_dir = !opt.tokenizer.empty() ? opt.tokenizer : opt.model_name_or_path;
  ANATOMY_CHECK(!tok_dir.empty(), "--train-file needs a tokenizer: pass --tokenizer DIR (with vocab.txt or "
                "tokenizer.json) or --model-name-or-path");
  const Tokenizer tok = Tokenizer::from_directory(tok_dir, cfg.model_type());  // Note [the class of a bare tokenizer]
  ANATOMY_CHECK(static_cast<int64_t>(tok.vocab_size()) <= cfg.vocab_size, "--tokenizer ", tok_dir, ": its ",
                tok.vocab_size(), " tokens do not fit the model's vocab_size ", cfg.vocab_size);
  d.tokenizer_files = Tokenizer::files_to_save(tok_dir, cfg.model_type());
  TrainData t = load_text_data(opt, cfg, tok, tok_dir, std::move(d));
  if (std::string w = unknown_token_warning(*t.train, tok, tok_dir, cfg.vocab_size, true); !w.empty())
    t.warnings.push_back(std::move(w));
  return t;
}

// The text files of load_train_data, through `tok`.
static TrainData load_text_data(const TrainOptions& opt, BertConfig& cfg, const Tokenizer& tok, const std::string& tok_dir,
                                TrainData d) {
  TextDataOptions to;
  to.text_column = opt.text_column;
  to.text_pair_column = opt.text_pair_column;
  to.label_column = opt.label_column;
  to.max_length = opt.seq_len;
  to.cache_dir = opt.dataset_cache_dir;
  to.source_flag = "--train-file";
  if (opt.masked_lm()) return load_masked_lm_data(opt, tok, tok_dir, std::move(d));
  if (opt.token_classification()) return load_token_data(opt, cfg, tok, std::move(d));
  ANATOMY_CHECK(!is_lines_file(opt.train_file), "--train-file ", opt.train_file, ": a .txt file is lines of text, "
                "read for --task mlm (run_mlm.py); a classifier trains on JSON Lines or CSV with a label column");
  // The training file's columns serve its validation and test files, as in run_glue.py.
  if (!opt.text_columns_given) use_run_glue_columns(to, opt.train_file);
  if (!opt.label_column.empty()) {
    const ProblemType p = resolve_problem_type(opt, cfg);
    if (has_float_labels(p)) return load_float_label_data(opt, cfg, tok, to, p, std::move(d));
  }
  // A trained head names its classes: the data's labels are mapped through them, unless
  // --ignore-mismatched-sizes asks for a new head for the data's own labels.
  const LabelSet from_config = LabelSet::from_id2label(cfg.id2label);
  if (from_config.kind == LabelSet::Kind::Names && !opt.ignore_mismatched_sizes) to.labels = from_config;
  std::shared_ptr<TextDataset> train;
  try {
    train = std::make_shared<TextDataset>(TextDataset::load(opt.train_file, tok, to));
  } catch (const Error& e) {
    if (!to.labels || std::string(e.what()).find("unknown label") == std::string::npos) throw;
    fail(e.what(), "; the labels are those of --model-name-or-path ", opt.model_name_or_path,
         "'s head (--ignore-mismatched-sizes trains a new head for the file's labels)");
  }
  const LabelSet labels = train->labels();
  ANATOMY_CHECK(labels.num_labels >= 1, "--train-file ", opt.train_file, ": no labels (is --label-column right?)");
  // One class would make a head of one output, which transformers reads as regression.
  ANATOMY_CHECK(to.labels || labels.num_labels >= 2, "--train-file ", opt.train_file, ": every label is '",
                labels.kind == LabelSet::Kind::Names ? labels.names[0] : std::string("0"),
                "', one class; a classifier needs two or more (numbers as labels train a regression)");
  ANATOMY_CHECK(!opt.num_labels_given || opt.num_labels == labels.num_labels, "--num-labels ", opt.num_labels,
                " disagrees with --train-file ", opt.train_file, ", whose labels make ", labels.num_labels,
                " classes (drop --num-labels: the file's labels size the head)");
  if (!to.labels) {
    cfg.set_num_labels(labels.num_labels);
    cfg.id2label = labels.id2label();
    cfg.label2id = labels.label2id();
  }
  // As transformers' sequence-classification forward records it (integer labels, more than one class).
  if (!cfg.problem_type && labels.num_labels > 1) cfg.problem_type = "single_label_classification";
  d.labels = labels;

  std::vector<int64_t> lengths = train->lengths();
  d.train = train;
  if (!opt.validation_file.empty()) {
    TextDataOptions vo = to;
    vo.labels = labels;
    vo.source_flag = "--validation-file";
    auto val = std::make_shared<TextDataset>(TextDataset::load(opt.validation_file, tok, vo));
    d.validation_lengths = val->lengths();
    d.validation = val;
  } else if (opt.validation_split > 0) {
    lengths = d.split_validation(train, lengths, opt.validation_split, opt.seed);
  }
  if (!opt.test_file.empty()) {
    TextDataOptions po = to;
    po.label_column = "";  // predictions only: a label column, if any, is not read
    po.labels.reset();
    po.source_flag = "--test-file";
    d.test = std::make_shared<TextDataset>(TextDataset::load(opt.test_file, tok, po));
  }
  d.train_lengths = std::move(lengths);
  int64_t tokens = 0;
  for (int64_t l : d.train_lengths) tokens += l;
  d.description = str_cat(opt.train_file, ": ", d.train->size(), " training samples, ", labels.num_labels,
                          " classes, mean length ", d.train->size() ? tokens / static_cast<int64_t>(d.train->size()) : 0,
                          " tokens (at most ", opt.seq_len, ")",
                          d.validation ? str_cat(", ", d.validation->size(), " for validation") : std::string());
  return d;
}

}  // namespace anatomy
