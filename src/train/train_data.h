// The data of a training run, from the options: the synthetic sets of the seed experiment, or a
// labelled text file (JSONL, CSV, TSV) tokenized with the model's tokenizer, with an optional
// validation file or held-out fraction. Text batches are padded to their longest sample.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/text_dataset.h"
#include "data/tokenizer.h"
#include "model/config.h"
#include "train/options.h"

namespace anatomy {

struct TrainData {
  std::shared_ptr<const Dataset> train;       // what the loop batches over
  std::shared_ptr<const Dataset> validation;  // null without --validation-file / --validation-split
  std::shared_ptr<const Dataset> test;        // --test-file (--do-predict), read without labels
  std::vector<int64_t> train_lengths;         // per training sample; empty: all full length
  std::vector<int64_t> validation_lengths;    // per validation sample; empty: all full length
  std::optional<LabelSet> labels;             // text data: the classes, as the model's config will name them
  TokenizerFiles tokenizer_files;             // saved next to the model (save_tokenizer_into)
  std::string description;                    // one line for the log
  std::vector<std::string> warnings;          // a line each for the log (Note [unknown-token share], [untyped tags])

  BatchPlan batch_plan(int64_t batch, uint64_t seed, bool group_by_length) const;
  // --validation-split: a seeded `fraction` of `all` becomes `validation`, the rest `train`;
  // `lengths` (per sample of `all`, or empty) go along: the validation part into
  // validation_lengths, the training part returned.
  std::vector<int64_t> split_validation(const std::shared_ptr<const Dataset>& all, const std::vector<int64_t>& lengths,
                                        double fraction, uint64_t seed);
  // The same for a split already drawn (its indices are samples of `all`).
  std::vector<int64_t> split_validation(const std::shared_ptr<const Dataset>& all, const std::vector<int64_t>& lengths,
                                        TrainValSplit s);
};

// Reads (or maps the cache of) the text files, or builds the synthetic set. With text data the
// labels decide the classification head: a config whose id2label names real classes maps the
// file's labels through it; otherwise the file's labels become cfg's num_labels and id2label.
// Errors name the flag or the file.
TrainData load_train_data(const TrainOptions& opt, BertConfig& cfg);
// The warning line of Note [unknown-token share] for `data` tokenized by `tok` (from `tok_dir`), or
// empty below the threshold; `training` names the tokens (training or evaluation).
std::string unknown_token_warning(const Dataset& data, const Tokenizer& tok, const std::string& tok_dir,
                                  int64_t model_vocab, bool training);

// A labelled file for a trained model (`anatomy eval`): class labels mapped through the model's
// id2label, or for regression and multi-label (Note [problem types] in model/heads.h) the float
// labels its head was trained on. `to.labels` is set here. Columns the user did not name
// (`named`) are chosen as the model's task script would: Note [run_glue.py's text columns],
// use_run_mlm_column, Note [run_ner.py's columns]; a .txt file of a masked LM is read by lines
// and masked as a training run of `masks` masks its --validation-file (Note [fixed evaluation
// masks]), so that the same seed and probability give the same texts masked the same way.
struct ColumnsNamed {
  bool text = false, label = false;
};
struct EvalMasks {
  uint64_t seed = 42;
  double probability = 0.15;
  bool line_by_line = false;  // Note [grouped texts] in data/masked_lm.h
};
std::shared_ptr<const Dataset> load_eval_file(const std::string& path, const Tokenizer& tok, TextDataOptions to,
                                              const BertConfig& cfg, ColumnsNamed named = {}, EvalMasks masks = {});

}  // namespace anatomy
