#include "train/task_data.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "data/csv.h"
#include "data/float_labels.h"
#include "data/masked_lm.h"
#include "data/token_tags.h"
#include "data/tokenizer.h"
#include "data/unicode.h"
#include "io/read_file.h"

namespace anatomy {

// Runs a reader of `path` whose errors begin with the path, so that they name the flag too
// ("--train-file x.jsonl: ..."), as the token cache's errors do.
template <class F>
static auto named(const char* flag, F&& read) {
  try {
    return read();
  } catch (const Error& e) {
    fail(flag, " ", e.what());
  }
}

// Note [problem types] (model/heads.h): config.json's problem_type when it names one; else what
// the training file's labels imply, as run_classification.py does (numbers -> regression, lists
// -> multi-label); else transformers' rule (num_labels 1 -> regression).
ProblemType resolve_problem_type(const TrainOptions& opt, const BertConfig& cfg) {
  const LabelColumnKind col =
      named("--train-file", [&] { return sniff_label_column(opt.train_file, TextFormat::Auto, 0, opt.label_column); });
  const ProblemType of_data = col == LabelColumnKind::Numbers ? ProblemType::Regression
                             : col == LabelColumnKind::Lists ? ProblemType::MultiLabel
                                                              : ProblemType::SingleLabel;
  if (cfg.problem_type) {
    const ProblemType p = problem_type_of(cfg);
    const bool agree = p == ProblemType::SingleLabel  ? col == LabelColumnKind::Classes
                       : p == ProblemType::MultiLabel ? col == LabelColumnKind::Lists
                                                      : col != LabelColumnKind::Classes;  // numbers, or lists of them
    if (agree) return p;
    // A model fine-tuned for another problem: run_classification.py sets problem_type from the
    // data, and a head of other sizes is made anew with --ignore-mismatched-sizes.
    ANATOMY_CHECK(opt.ignore_mismatched_sizes, "--train-file ", opt.train_file, ": its labels are ",
                  col == LabelColumnKind::Lists ? "lists" : col == LabelColumnKind::Numbers ? "numbers" : "classes",
                  " but the model's config.json has problem_type ", problem_type_name(p),
                  "; --ignore-mismatched-sizes trains a new head for the file's labels (", problem_type_name(of_data), ")");
    return of_data;
  }
  if (col != LabelColumnKind::Classes) return of_data;
  if (!opt.model_name_or_path.empty() && cfg.num_labels == 1) return ProblemType::Regression;
  return ProblemType::SingleLabel;
}

// Regression and multi-label: the files tokenized without labels, their label columns read as
// float targets; the head sized and named for them, problem_type set in the config.
TrainData load_float_label_data(const TrainOptions& opt, BertConfig& cfg, const Tokenizer& tok, TextDataOptions to,
                                ProblemType p, TrainData d) {
  FloatLabelOptions fo;
  fo.lists = p == ProblemType::MultiLabel;
  if (p == ProblemType::Regression) {
    const bool lists = sniff_label_column(opt.train_file, TextFormat::Auto, 0, opt.label_column) == LabelColumnKind::Lists;
    fo.width = lists ? cfg.num_labels : 1;
  } else {
    const LabelSet from_config = LabelSet::from_id2label(cfg.id2label);
    if (!opt.model_name_or_path.empty() && !opt.ignore_mismatched_sizes) {
      if (from_config.kind == LabelSet::Kind::Names) fo.classes = from_config.names;
      else fo.num_ids = cfg.num_labels;
    }
  }
  const std::string column = to.label_column;
  to.label_column = "";
  auto load = [&](const std::string& path, const char* flag, const FloatLabelOptions& o) {
    TextDataOptions x = to;
    x.source_flag = flag;
    auto text = std::make_shared<TextDataset>(TextDataset::load(path, tok, x));
    FloatLabels labels = named(flag, [&] { return read_float_labels(path, TextFormat::Auto, 0, column, o); });
    ANATOMY_CHECK(labels.size() == text->size(), flag, " ", path, ": ", labels.size(), " labels for ", text->size(),
                  " texts");
    return std::make_pair(text, std::make_shared<FloatLabelDataset>(text, std::move(labels)));
  };
  auto [train_text, train] = load(opt.train_file, "--train-file", fo);
  const FloatLabels& fl = train->labels();
  ANATOMY_CHECK(!opt.num_labels_given || opt.num_labels == fl.width, "--num-labels ", opt.num_labels,
                " disagrees with --train-file ", opt.train_file, ", whose labels make ", fl.width, " outputs");
  LabelSet names = fl.classes.empty() ? LabelSet::ids(fl.width) : LabelSet::from_names(fl.classes);
  if (cfg.num_labels != fl.width || !fl.classes.empty()) {
    cfg.set_num_labels(fl.width);
    cfg.id2label = names.id2label();
    cfg.label2id = names.label2id();
  }
  cfg.problem_type = problem_type_name(p);
  d.labels = names;
  std::vector<int64_t> lengths = train_text->lengths();
  d.train = train;
  if (!opt.validation_file.empty()) {
    FloatLabelOptions vo = fo;
    if (fo.lists) {
      vo.classes.reset();
      vo.num_ids.reset();
      if (fl.classes.empty()) vo.num_ids = fl.width;
      else vo.classes = fl.classes;
    }
    auto [val_text, val] = load(opt.validation_file, "--validation-file", vo);
    d.validation_lengths = val_text->lengths();
    d.validation = val;
  } else if (opt.validation_split > 0) {
    lengths = d.split_validation(train, lengths, opt.validation_split, opt.seed);
  }
  if (!opt.test_file.empty()) {
    TextDataOptions po = to;
    po.source_flag = "--test-file";
    d.test = std::make_shared<TextDataset>(TextDataset::load(opt.test_file, tok, po));
  }
  d.train_lengths = std::move(lengths);
  d.description = str_cat(opt.train_file, ": ", d.train->size(), " training samples, ", problem_type_name(p), " with ",
                          fl.width, p == ProblemType::Regression ? " outputs" : " classes",
                          d.validation ? str_cat(", ", d.validation->size(), " for validation") : std::string());
  return d;
}

// A masked LM's texts, each tokenized (cut to `block` with --line-by-line, else whole): a .txt
// file's lines or the text column `to` names; `ids(i)` reads text i's tokens.
struct MaskedLmTexts {
  std::shared_ptr<const Dataset> texts;
  std::function<std::span<const int32_t>(size_t)> ids;
};
static MaskedLmTexts read_masked_lm_texts(const std::string& path, const char* flag, const Tokenizer& tok,
                                          TextDataOptions to, int64_t block, bool line_by_line) {
  const int64_t cut = line_by_line ? block : kMaxTextTokens;  // grouped: each text whole
  if (is_lines_file(path)) {
    auto lines = named(flag, [&] { return std::make_shared<LinesDataset>(path, tok, cut, !line_by_line); });
    return {lines, [lines](size_t i) { return lines->ids(i); }};
  }
  to.label_column = "";
  to.text_pair_column = "";
  to.max_length = cut;
  to.source_flag = flag;
  to.skip_blank_texts = line_by_line;  // run_mlm.py's --line_by_line drops empty and blank lines
  auto t = std::make_shared<TextDataset>(TextDataset::load(path, tok, to));
  return {t, [t](size_t i) { return t->ids(i); }};
}

// Note [grouped texts]: the blocks of the texts `idx` (in that order) of `t`.
static std::shared_ptr<const Dataset> grouped(const MaskedLmTexts& t, const std::vector<size_t>& idx, int64_t block,
                                              const std::string& path, const char* flag, bool may_be_empty = false) {
  return named(flag, [&] {
    return std::make_shared<GroupedTextsDataset>(idx.size(), [&](size_t i) { return t.ids(idx[i]); }, block, path,
                                                 may_be_empty);
  });
}

// Note [run_mlm.py's validation head]
// run_mlm.py without a validation file splits the training file's rows before anything else:
// load_dataset(..., split="train[:N%]") validates and "train[N%:]" trains, N its
// validation_split_percentage (5 unless given), whether or not it evaluates. The datasets
// library's N% of R rows is round(N * R / 100) (Python's round: halves to even). The rows are a
// .txt file's lines (blank ones too: for_each_line) or a JSON/CSV file's records; --line-by-line
// drops each side's blank texts after the split, and grouping groups each side alone, so a block
// never holds texts of both. The split is the file's order, not seeded: the same rows validate at
// every --seed. A head too small for one sample leaves the run without validation (said in the
// log line), and its rows are still not trained on, as in run_mlm.py.
static TrainValSplit validation_head(const TrainOptions& opt, const TextDataOptions& to, size_t texts,
                                     bool blanks_dropped) {
  std::vector<bool> blank;  // per row of the file; only needed when blank rows were dropped
  if (blanks_dropped) {
    const std::string data = read_regular_file(opt.train_file, "--train-file");
    const auto row = [&](std::string_view text) { blank.push_back(unicode::is_blank_text(text)); };
    if (is_lines_file(opt.train_file)) {
      for_each_line(data, row);
    } else {
      const TextFormat f = to.format == TextFormat::Auto ? format_from_path(opt.train_file) : to.format;
      read_text_records(data, opt.train_file, f, to.delimiter, RecordColumns{to.text_column, "", ""},
                        to.max_record_bytes, [&](const TextRecord& r) { row(r.text); });
    }
  }
  const size_t rows = blanks_dropped ? blank.size() : texts;
  const auto head_rows = static_cast<size_t>(
      std::nearbyint(static_cast<double>(static_cast<size_t>(opt.validation_split_percentage) * rows) / 100.0));
  const auto head = static_cast<size_t>(blanks_dropped ? std::count(blank.begin(), blank.begin() + head_rows, false)
                                                      : head_rows);
  ANATOMY_CHECK(!blanks_dropped || rows - static_cast<size_t>(std::count(blank.begin(), blank.end(), true)) == texts,
                "--train-file ", opt.train_file, " changed while it was read");
  ANATOMY_CHECK(head < texts, "--validation-split-percentage ", opt.validation_split_percentage, ": the first ",
                head_rows, " of --train-file ", opt.train_file, "'s ", rows, " rows validate, and no text is left to train "
                "on; lower it, or pass --validation-file");
  TrainValSplit s;
  s.val.resize(head);
  std::iota(s.val.begin(), s.val.end(), size_t{0});
  s.train.resize(texts - head);
  std::iota(s.train.begin(), s.train.end(), head);
  return s;
}

// A masked LM's samples from a file: a text each (--line-by-line), or run_mlm.py's blocks of the
// joined texts. `lengths` receives the samples' lengths.
static std::shared_ptr<const Dataset> masked_lm_texts(const std::string& path, const char* flag, const Tokenizer& tok,
                                                      TextDataOptions to, int64_t block, bool line_by_line,
                                                      std::vector<int64_t>& lengths) {
  const MaskedLmTexts t = read_masked_lm_texts(path, flag, tok, std::move(to), block, line_by_line);
  std::shared_ptr<const Dataset> out = t.texts;
  if (!line_by_line) {
    std::vector<size_t> all(t.texts->size());
    std::iota(all.begin(), all.end(), size_t{0});
    out = grouped(t, all, block, path, flag);
  }
  lengths = out->lengths();
  return out;
}

// --task mlm: the texts (JSONL/CSV text column, or a .txt file's lines) tokenized, masked as
// Note [masking] in data/masked_lm.h says; validation texts with masks of their own seed.
TrainData load_masked_lm_data(const TrainOptions& opt, const Tokenizer& tok, const std::string& tok_dir, TrainData d) {
  const MaskingOptions mo = masking_for(tok, tok_dir, opt.mlm_probability, opt.seed);
  TextDataOptions columns;  // the training file's text column serves every file, as in run_mlm.py
  columns.text_column = opt.text_column;
  columns.source_flag = "--train-file";
  columns.cache_dir = opt.dataset_cache_dir;
  if (!opt.text_columns_given && !is_lines_file(opt.train_file)) use_run_mlm_column(columns, opt.train_file);
  auto texts = [&](const std::string& path, const char* flag, std::vector<int64_t>& lengths) {
    return masked_lm_texts(path, flag, tok, columns, opt.seq_len, opt.line_by_line, lengths);
  };
  std::vector<int64_t> lengths;
  const bool head = opt.validation_file.empty() && opt.validation_split_percentage > 0;
  if (opt.validation_file.empty() && (opt.validation_split > 0 || head) && !opt.line_by_line) {
    // Split the texts, then group each side, as run_mlm.py splits its texts before group_texts:
    // a block never holds texts of both sides.
    const MaskedLmTexts t = read_masked_lm_texts(opt.train_file, "--train-file", tok, columns, opt.seq_len, false);
    const TrainValSplit sp = head ? validation_head(opt, columns, t.texts->size(), false)
                                  : split(t.texts->size(), opt.validation_split, opt.seed);
    auto train = grouped(t, sp.train, opt.seq_len, opt.train_file, "--train-file");
    auto val = grouped(t, sp.val, opt.seq_len, opt.train_file,
                       head ? "--validation-split-percentage" : "--validation-split", head);
    lengths = train->lengths();
    d.train = std::make_shared<MaskedLMDataset>(train, mo);
    if (val->size() > 0) {
      d.validation_lengths = val->lengths();
      d.validation = std::make_shared<MaskedLMDataset>(val, mo);
    }
  } else {
    auto train = std::make_shared<MaskedLMDataset>(texts(opt.train_file, "--train-file", lengths), mo);
    d.train = train;
    if (!opt.validation_file.empty())
      d.validation = std::make_shared<MaskedLMDataset>(texts(opt.validation_file, "--validation-file", d.validation_lengths),
                                                       validation_masking(mo));
    else if (opt.validation_split > 0)
      lengths = d.split_validation(train, lengths, opt.validation_split, opt.seed);
    else if (head)
      lengths = d.split_validation(train, lengths, validation_head(opt, columns, train->size(), true));
    if (d.validation && d.validation->size() == 0) {
      d.validation.reset();
      d.validation_lengths.clear();
    }
  }
  ANATOMY_CHECK(opt.test_file.empty(), "--test-file: predictions are not written for --task mlm");
  d.train_lengths = std::move(lengths);
  int64_t tokens = 0;
  for (int64_t l : d.train_lengths) tokens += l;
  d.description = str_cat(opt.train_file, ": ", d.train->size(),
                          opt.line_by_line ? " texts" : str_cat(" blocks of ", opt.seq_len, " tokens (its texts joined)"),
                          " for masked-language modelling (",
                          opt.mlm_probability, " of the tokens masked), mean length ",
                          d.train->size() ? tokens / static_cast<int64_t>(d.train->size()) : 0, " tokens",
                          d.validation ? str_cat(", ", d.validation->size(), " for validation") : std::string(),
                          !head ? std::string()
                          : d.validation
                              ? str_cat(" (the first ", opt.validation_split_percentage, "% of its rows, as run_mlm.py "
                                        "holds out validation_split_percentage; --validation-split-percentage 0 trains "
                                        "on all)")
                              : str_cat(", no validation (the first ", opt.validation_split_percentage,
                                        "% of its rows, held out as run_mlm.py holds them out, make no sample)"));
  return d;
}

// The words and tags columns: run_ner.py's names unless the flags name others.
static TokenTagOptions token_tag_options(const std::string& text_column, const std::string& label_column, int64_t max_length) {
  TokenTagOptions o;
  o.words_column = text_column == "text" ? "tokens" : text_column;
  o.tags_column = label_column == "label" ? "ner_tags" : label_column;
  o.max_length = max_length;
  return o;
}

// --task token-classification (Note [token classification head]): the tagged words, the head
// sized and named for the file's tags (or mapped through a trained head's names).
// Note [prefix space for words]: run_ner.py loads the tokenizer of these model types with
// add_prefix_space=True, so that each pre-split word is tokenized as a word inside a text ("Ġwas",
// not "was"), as a pipeline sees it in running text. Of anatomy's families only RoBERTa's.
static Tokenizer run_ner_tokenizer(const Tokenizer& tok, const BertConfig& cfg) {
  const std::string type = cfg.model_type();
  return type == "roberta" || type == "deberta" || type == "gpt2" || type == "bloom" ? tok.with_prefix_space() : tok;
}

// Note [untyped tags]
// Entity precision, recall and F1 chunk IOB tags (B-PER, I-PER, O; data/token_tags.cpp). Integer
// tags with no names (the file's ids, a config.json whose id2label says LABEL_0 ...) are no IOB
// tags (tags named otherwise, POS tags say, are taken as the user means them): every run of one
// tag, the outside tag's too, would count as an entity of that tag's type, and the F1 would mean
// nothing (run_ner.py fails on them at its first evaluation). Training goes on; a warning says so
// and how to name them.
static std::string untyped_tags_warning(const std::string& file, const std::map<int, std::string>& id2label) {
  // Names of no tag: the file's integers, or transformers' LABEL_<i>.
  const auto unnamed = [](const std::string& n) {
    const std::string digits = n.rfind("LABEL_", 0) == 0 ? n.substr(6) : n;
    return !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  for (const auto& [id, name] : id2label)
    if (!unnamed(name)) return "";
  return str_cat("warning: --train-file ", file, ": its ", id2label.size(), " tags (",
                 id2label.empty() ? std::string() : id2label.begin()->second, ", ...) are not IOB tags (B-PER, I-PER, "
                 "O), so the entity precision, recall and F1 count every run of one tag as an entity and mean nothing; "
                 "write the tag names in the file, or in config.json's id2label (eval_accuracy is the tokens')");
}

TrainData load_token_data(const TrainOptions& opt, BertConfig& cfg, const Tokenizer& run_tok, TrainData d) {
  const Tokenizer tok = run_ner_tokenizer(run_tok, cfg);
  TokenTagOptions to = token_tag_options(opt.text_column, opt.label_column, opt.seq_len);
  // The training file's choice serves every file, as in run_ner.py.
  use_run_ner_columns(to, opt.train_file, "--train-file", opt.text_columns_given, opt.label_column_given);
  const LabelSet from_config = LabelSet::from_id2label(cfg.id2label);
  if (from_config.kind == LabelSet::Kind::Names && !opt.ignore_mismatched_sizes) to.tags = from_config.names;
  std::shared_ptr<TokenTagDataset> train;
  try {
    train = named("--train-file", [&] { return std::make_shared<TokenTagDataset>(opt.train_file, tok, to); });
  } catch (const Error& e) {  // as the sequence tasks say it (train_data.cpp)
    if (!to.tags || std::string(e.what()).find("unknown tag") == std::string::npos) throw;
    fail(e.what(), "; the tags are those of --model-name-or-path ", opt.model_name_or_path,
         "'s head (--ignore-mismatched-sizes trains a new head for the file's tags)");
  }
  const std::vector<std::string>& tags = train->tag_names();
  ANATOMY_CHECK(!tags.empty(), "--train-file ", opt.train_file, ": no tags in it");
  ANATOMY_CHECK(to.tags || tags.size() >= 2, "--train-file ", opt.train_file, ": every tag is '", tags[0],
                "', one class; token classification needs two or more");
  ANATOMY_CHECK(!opt.num_labels_given || opt.num_labels == static_cast<int64_t>(tags.size()), "--num-labels ",
                opt.num_labels, " disagrees with --train-file ", opt.train_file, ", whose tags make ", tags.size());
  const LabelSet names = train->tags_are_ids() ? LabelSet::ids(static_cast<int64_t>(tags.size())) : LabelSet::from_names(tags);
  cfg.set_num_labels(static_cast<int64_t>(tags.size()));
  cfg.id2label = names.id2label();
  cfg.label2id = names.label2id();
  d.labels = names;
  std::vector<int64_t> lengths = train->lengths();
  d.train = train;
  if (!opt.validation_file.empty()) {
    TokenTagOptions vo = to;
    vo.tags = tags;
    auto val = named("--validation-file", [&] { return std::make_shared<TokenTagDataset>(opt.validation_file, tok, vo); });
    d.validation_lengths = val->lengths();
    d.validation = val;
  } else if (opt.validation_split > 0) {
    lengths = d.split_validation(train, lengths, opt.validation_split, opt.seed);
  }
  if (!opt.test_file.empty()) {  // --do-predict: tagged or not (predict_tags_into in train/evaluate_ner.cpp)
    TokenTagOptions po = to;
    po.tags = tags;
    po.tags_optional = true;
    d.test = named("--test-file", [&] { return std::make_shared<TokenTagDataset>(opt.test_file, tok, po); });
  }
  if (std::string w = untyped_tags_warning(opt.train_file, cfg.id2label); !w.empty()) d.warnings.push_back(std::move(w));
  d.train_lengths = std::move(lengths);
  d.description = str_cat(opt.train_file, ": ", d.train->size(), " tagged sentences, ", tags.size(), " tags",
                          d.validation ? str_cat(", ", d.validation->size(), " for validation") : std::string());
  return d;
}

std::shared_ptr<const Dataset> load_eval_file(const std::string& path, const Tokenizer& tok, TextDataOptions to,
                                              const BertConfig& cfg, ColumnsNamed named, EvalMasks masks) {
  if (is_token_classification(cfg)) {  // the tagged words, mapped through the model's tags
    TokenTagOptions o = token_tag_options(to.text_column, to.label_column, to.max_length);
    use_run_ner_columns(o, path, to.source_flag, named.text, named.label);
    const LabelSet names = LabelSet::from_id2label(cfg.id2label);
    if (names.kind == LabelSet::Kind::Names) o.tags = names.names;
    else o.num_ids = cfg.num_labels;
    o.tags_optional = named.label && to.label_column.empty();  // --label-column "": predictions only
    return std::make_shared<TokenTagDataset>(path, run_ner_tokenizer(tok, cfg), o);
  }
  if (is_masked_lm(cfg)) {  // the texts, read and masked as a training run reads its --validation-file
    if (!named.text && !is_lines_file(path)) use_run_mlm_column(to, path);
    std::vector<int64_t> lengths;
    return std::make_shared<MaskedLMDataset>(
        masked_lm_texts(path, "--eval-file", tok, to, to.max_length, masks.line_by_line, lengths),
        validation_masking(masking_for(tok, "the model directory", masks.probability, masks.seed)));
  }
  if (!named.text) use_run_glue_columns(to, path);
  const ProblemType p = problem_type_of(cfg);
  if (!has_float_labels(p) || to.label_column.empty()) {
    to.labels = LabelSet::from_id2label(cfg.id2label);  // the file's labels mean the model's classes
    return std::make_shared<TextDataset>(TextDataset::load(path, tok, to));
  }
  FloatLabelOptions fo;
  fo.lists = p == ProblemType::MultiLabel;
  fo.width = cfg.num_labels;
  const LabelSet classes = LabelSet::from_id2label(cfg.id2label);
  if (classes.kind == LabelSet::Kind::Names) fo.classes = classes.names;
  else fo.num_ids = cfg.num_labels;
  if (fo.lists) fo.width = 1;
  const std::string column = to.label_column;
  to.label_column = "";
  auto text = std::make_shared<TextDataset>(TextDataset::load(path, tok, to));
  FloatLabels labels = read_float_labels(path, to.format, to.delimiter, column, fo);
  ANATOMY_CHECK(labels.size() == text->size(), path, ": ", labels.size(), " labels for ", text->size(), " texts");
  return std::make_shared<FloatLabelDataset>(text, std::move(labels));
}

}  // namespace anatomy
