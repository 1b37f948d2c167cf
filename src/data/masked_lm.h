// Masked-language-model data (Note [masked LM head] in model/heads.h): texts, tokenized as for
// classification, with tokens masked as transformers' DataCollatorForLanguageModeling does.
//
// Note [masking]: each token that is not special ([CLS], [SEP], padding, the mask token itself:
// the tokenizer's template tokens) is chosen with probability p (--mlm-probability, 0.15); a
// chosen token is scored (its label is its id; every other label is -100) and replaced by the
// mask token with probability 0.8, by a token drawn uniformly from the vocabulary with
// probability 0.1, and kept with probability 0.1. The draws are a pure function of (seed, epoch,
// sample index): like the collator, which masks afresh every time a sample is drawn, a training
// sample gets new masks each epoch (dynamic masking, as RoBERTa trains), and a run resumed from a
// checkpoint draws exactly the masks of the uninterrupted run (the Prefetcher stamps each batch
// with its epoch, HostBatch::epoch).
//
// Note [fixed evaluation masks]: evaluation batches are not the Prefetcher's, so their epoch is
// always 0 and a validation (or --validation-split, or `anatomy eval`) sample keeps the same masks
// at every evaluation. run_mlm.py re-masks its evaluation set each time it evaluates, so its eval
// perplexity moves with the draw; here two evaluations of one model give the same perplexity, and
// the change between evaluations is the model's alone. `anatomy eval` masks with its --seed and
// --mlm-probability as a run with those masks its --validation-file (validation_masking), so the
// run's own evaluation is repeated exactly.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset.h"
#include "data/text_dataset.h"

namespace anatomy {

class Tokenizer;

struct MaskingOptions {
  double probability = 0.15;
  uint64_t seed = 0;
  int32_t mask_id = -1;
  int64_t vocab_size = 0;
  std::vector<int32_t> special;  // never masked
};

// The mask token of a tokenizer ("[MASK]" or "<mask>") and its special ids; throws naming the
// tokenizer directory when it has no mask token.
MaskingOptions masking_for(const Tokenizer& tok, const std::string& tokenizer_dir, double probability, uint64_t seed);
// The masks of a --validation-file (or `anatomy eval`'s file) from the run's: another stream of
// the same seed, so that they are not the training texts' masks where the texts coincide.
MaskingOptions validation_masking(MaskingOptions training);

// Masks one row of a batch in place: ids [T], mask [T]; labels [T] receive the targets.
// Returns the number of scored tokens. Epoch 0 draws what the masking drew before it depended on
// the epoch.
int64_t mask_tokens(int32_t* ids, const int32_t* attention, int32_t* labels, int64_t T, uint64_t sample,
                    const MaskingOptions& o, int64_t epoch = 0);

// A dataset's samples with their tokens masked: get() fills HostBatch::token_labels [B, T] and
// the masked ids, drawn for the batch's epoch (Note [masking]).
class MaskedLMDataset final : public Dataset {
 public:
  MaskedLMDataset(std::shared_ptr<const Dataset> base, MaskingOptions o);
  size_t size() const override { return m_base->size(); }
  int64_t seq_len() const override { return m_base->seq_len(); }
  void get(size_t i, HostBatch& out, int64_t row) const override;
  std::vector<int64_t> lengths() const override { return m_base->lengths(); }  // masking keeps them
  const Dataset& base() const { return *m_base; }

 private:
  std::shared_ptr<const Dataset> m_base;
  MaskingOptions m_opt;
};

// A `.txt` path (any case): masked-LM texts read as LinesDataset, one per line.
bool is_lines_file(const std::string& path);

// The lines of `text` as the datasets library's text loader (5.x) reads a file's rows: a line
// ends at \n, \r\n or \r (Python's universal newlines; \f, U+2028 and the other breaks of
// str.splitlines stay inside a line); a last line without an end is a line, an empty file none.
void for_each_line(std::string_view text, const std::function<void(std::string_view)>& fn);

// A plain text file, one sample per non-empty line (every line with keep_blank_lines, as the
// datasets library's text loader reads one: for_each_line), tokenized in memory with [CLS] ... [SEP] (the
// tokenizer's template) and cut to max_length.
class LinesDataset final : public Dataset {
 public:
  LinesDataset(const std::string& path, const Tokenizer& tok, int64_t max_length, bool keep_blank_lines = false);
  size_t size() const override { return m_offsets.size() - 1; }
  int64_t seq_len() const override { return m_max_length; }
  void get(size_t i, HostBatch& out, int64_t row) const override;
  std::vector<int64_t> lengths() const override;
  std::span<const int32_t> ids(size_t i) const { return {m_ids.data() + m_offsets[i], m_offsets[i + 1] - m_offsets[i]}; }

 private:
  int64_t m_max_length;
  int32_t m_pad;
  std::vector<int32_t> m_ids;
  std::vector<size_t> m_offsets{0};
};

// Note [grouped texts]: run_mlm.py without --line_by_line tokenizes each text whole, with its
// special tokens, joins the texts and cuts the join into blocks of max_seq_length tokens; the
// datasets library maps 1000 texts at a time, so each 1000 texts' last partial block is dropped.
// Here the same, in file order: block b is the b-th full block; every token is real (mask 1) and
// of type 0, the joined texts' [CLS] and [SEP] stay where they fell (never masked: Note [masking]).
// `text(i)` gives text i's ids (TextDataset::ids, LinesDataset::ids), tokenized untruncated.
class GroupedTextsDataset final : public Dataset {
 public:
  static constexpr size_t kTextsPerGroup = 1000;  // datasets.map's batch_size
  // No block at all is an error naming `source`, unless `may_be_empty`.
  GroupedTextsDataset(size_t texts, const std::function<std::span<const int32_t>(size_t)>& text, int64_t block,
                      const std::string& source, bool may_be_empty = false);
  size_t size() const override { return m_ids.size() / static_cast<size_t>(m_block); }
  int64_t seq_len() const override { return m_block; }
  void get(size_t i, HostBatch& out, int64_t row) const override;
  std::vector<int64_t> lengths() const override { return std::vector<int64_t>(size(), m_block); }

 private:
  int64_t m_block;
  std::vector<int32_t> m_ids;  // the kept blocks, one after another
};

}  // namespace anatomy
