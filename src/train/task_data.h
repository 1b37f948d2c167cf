// The data of the tasks beside single-label classification (issue 15): regression and
// multi-label labels (Note [problem types] in model/heads.h), masked-LM texts (Note [masking] in
// data/masked_lm.h) and tagged words (data/token_tags.h), for load_train_data and `anatomy eval`.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/text_dataset.h"
#include "model/heads.h"
#include "train/train_data.h"

namespace anatomy {

// The dataset that keeps its base alive (SubsetDataset only borrows it).
class OwningSubset final : public Dataset {
 public:
  OwningSubset(std::shared_ptr<const Dataset> base, std::vector<size_t> idx)
      : m_base(std::move(base)), m_view(*m_base, std::move(idx)) {}
  size_t size() const override { return m_view.size(); }
  int64_t seq_len() const override { return m_view.seq_len(); }
  void get(size_t i, HostBatch& out, int64_t row) const override { m_view.get(i, out, row); }

 private:
  std::shared_ptr<const Dataset> m_base;
  SubsetDataset m_view;
};

// The problem type of a training run on a labelled file.
ProblemType resolve_problem_type(const TrainOptions& opt, const BertConfig& cfg);
// Each loader fills `d` (which holds the tokenizer files) from the options' files, sets cfg's
// head (num_labels, id2label, problem_type) where the data decides it, and returns it.
TrainData load_float_label_data(const TrainOptions& opt, BertConfig& cfg, const Tokenizer& tok, TextDataOptions to,
                                ProblemType p, TrainData d);
TrainData load_masked_lm_data(const TrainOptions& opt, const Tokenizer& tok, const std::string& tok_dir, TrainData d);
TrainData load_token_data(const TrainOptions& opt, BertConfig& cfg, const Tokenizer& tok, TrainData d);

}  // namespace anatomy
