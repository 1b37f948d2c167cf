// Labels that are not one class per sample: a number (regression) or a list of classes
// (multi-label), read from the label column of a JSONL, CSV or TSV file beside the TextDataset
// that tokenizes the same file without labels (Note [problem types] in model/heads.h).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/csv.h"
#include "data/dataset.h"

namespace anatomy {

// What a file's label column holds, as run_classification.py tells (its first labelled record
// decides; every record must agree):
//   Classes:   an integer or a string per record (single-label; TextDataset reads those).
//   Numbers:   a number with a fraction or exponent per record (regression).
//   Lists:     a JSON array per record (multi-label; JSONL only).
enum class LabelColumnKind : uint8_t { Classes, Numbers, Lists };

LabelColumnKind sniff_label_column(const std::string& path, TextFormat format, char delimiter,
                                   const std::string& label_column);

// The float labels of every record, in file order: [n, width] row-major.
//   Regression (lists false): a number per record (width 1), or with width > 1 a JSON array of
//     `width` numbers; integers count as numbers.
//   Multi-label (lists true): a JSON array of class ids (integers) or class names per record,
//     made multi-hot. `classes` given (a trained head's names, or the training file's): every
//     label must be one of them. Not given: the sorted distinct ids or names are the classes, as
//     LabelSet numbers single labels (ids 0..n-1 stay ids; ids 1..5 become five classes named "1".."5").
struct FloatLabels {
  int64_t width = 0;
  std::vector<float> values;
  std::vector<std::string> classes;  // multi-label: id -> name ("LABEL_i"-free ids: empty)
  bool integer_ids = false;          // multi-label with integer class ids
  size_t size() const { return width ? values.size() / static_cast<size_t>(width) : 0; }
};

struct FloatLabelOptions {
  bool lists = false;       // multi-label
  int64_t width = 1;        // regression: values per record
  std::optional<std::vector<std::string>> classes;  // multi-label: the given classes
  std::optional<int64_t> num_ids;                   // multi-label with integer ids: the given count
};

// Errors name the file and line: a record without the column, a value of the wrong kind, an
// unknown class.
FloatLabels read_float_labels(const std::string& path, TextFormat format, char delimiter,
                              const std::string& label_column, const FloatLabelOptions& options);

// A tokenized dataset (read without labels) with float labels per sample: get() fills the
// batch's targets [B, width] besides the base's tokens.
class FloatLabelDataset final : public Dataset {
 public:
  FloatLabelDataset(std::shared_ptr<const Dataset> base, FloatLabels labels);
  size_t size() const override { return m_base->size(); }
  int64_t seq_len() const override { return m_base->seq_len(); }
  void get(size_t i, HostBatch& out, int64_t row) const override;
  std::vector<int64_t> lengths() const override { return m_base->lengths(); }
  const FloatLabels& labels() const { return m_labels; }
  const Dataset& base() const { return *m_base; }

 private:
  std::shared_ptr<const Dataset> m_base;
  FloatLabels m_labels;
};

}  // namespace anatomy
