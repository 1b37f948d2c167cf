// Token classification data (Note [token classification head] in model/heads.h): JSON Lines with
// a list of words and a list of per-word tags, as run_ner.py reads them ({"tokens": [...],
// "ner_tags": [...]}). Each word is tokenized on its own (Tokenizer::encode_split_words); its tag
// labels the word's first sub-token, every other token is labelled -100 (not scored), and words
// cut off by max_length are dropped.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace anatomy {

class Tokenizer;

struct TokenTagOptions {
  std::string words_column = "tokens", tags_column = "ner_tags";
  int64_t max_length = 128;
  // The tag set: given (a trained head's names, or the training file's), every tag must be one of
  // them; else string tags make their sorted distinct set (as run_ner.py sorts its label list)
  // and integer tags theirs too (LabelSet::from_integers: ids 0..n-1 stay ids).
  std::optional<std::vector<std::string>> tags;
  std::optional<int64_t> num_ids;  // integer tags of a given count
  // A file without the tags column is read untagged (text to predict: --do-predict's --test-file);
  // it needs `tags`. Either every line has the column or none has.
  bool tags_optional = false;
};

// Note [run_ner.py's columns]: run_ner.py reads the words from "tokens", else from the file's
// first column, and the tags from "ner_tags", else from its second column. A column the user did
// not name (`words_named`, `tags_named`) that the first record lacks becomes that record's first
// (words) or second (tags) key, in the file's order, and the choice is said on stderr (naming
// `flag`). A file whose first record is not a JSON object is left to the loader's error.
void use_run_ner_columns(TokenTagOptions& o, const std::string& path, const std::string& flag, bool words_named,
                         bool tags_named);

class TokenTagDataset final : public Dataset {
 public:
  // Errors name the file and line: not a JSON object, a missing column, word and tag lists of
  // different lengths, an unknown tag.
  TokenTagDataset(const std::string& path, const Tokenizer& tok, const TokenTagOptions& options);
  size_t size() const override { return m_offsets.size() - 1; }
  int64_t seq_len() const override { return m_max_length; }
  // Ids, mask (types 0) and HostBatch::token_labels.
  void get(size_t i, HostBatch& out, int64_t row) const override;
  std::vector<int64_t> lengths() const override;
  // id -> tag name (integer tags: their decimal text).
  const std::vector<std::string>& tag_names() const { return m_tags; }
  // The tags are the ids 0..n-1 themselves (transformers' default names LABEL_i). Integer tags
  // other than 0..n-1 are numbered in sorted order as run_ner.py numbers them, named by their text.
  bool tags_are_ids() const { return m_integer && !m_integers_named; }
  // False for a file read without tags (TokenTagOptions::tags_optional): each word's first
  // sub-token is labelled 0, a place holder that marks where the word's prediction is.
  bool tagged() const { return m_tagged; }

 private:
  int64_t m_max_length;
  int32_t m_pad;
  std::vector<std::string> m_tags;
  bool m_integer = false, m_integers_named = false, m_tagged = true;
  std::vector<int32_t> m_ids, m_labels;
  std::vector<size_t> m_offsets{0};
};

// CoNLL-style entity scores (conlleval's chunking of IOB tags: an entity starts at B-X, or at
// I-X after O or after another type, and runs over the following I-X): precision, recall and F1
// of the entities predicted with exactly the right type and span, over all sequences; 0 where a
// denominator is 0. Sequences are tag names per word.
struct EntityScores {
  double precision = 0, recall = 0, f1 = 0;
  int64_t predicted = 0, gold = 0, correct = 0;
};
EntityScores entity_scores(const std::vector<std::vector<std::string>>& predicted,
                           const std::vector<std::vector<std::string>>& gold);
// The scores of entity counts (summed over parts of a set: evaluation over several ranks).
EntityScores entity_scores_of_counts(int64_t predicted, int64_t gold, int64_t correct);

}  // namespace anatomy
