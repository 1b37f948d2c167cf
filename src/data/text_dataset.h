// Labelled text files (JSONL, CSV, TSV) as a Dataset: tokenized once into a memory-mapped binary
// cache, with dynamic padding, length bucketing and a train/validation split.
//
// Note [Text cache]: the first load of a file tokenizes every record and writes
//   <data>.<key>.anatomy-cache           (beside the data, or <cache_dir>/<file name>.<key>...)
// atomically (AtomicFile); later loads with the same key memory-map it and never re-read the
// text. The key is hash64 (below) of a format version, the data file's bytes, the tokenizer's
// vocabulary and settings, and every option that changes the result, so editing the data, the
// vocabulary, max_length, the columns or the given labels makes a new cache. Caches for other
// keys are left alone (another run may be using them); delete *.anatomy-cache to reclaim space.
// Layout, little-endian, every section 8-byte aligned:
//   CacheHeader (64 bytes) | offsets u64[n+1] | labels i32[n] | ids i32[tokens] |
//   types u8[tokens] | label names (u32 length + bytes each, id order)
// Sample i holds ids[offsets[i], offsets[i+1]): [CLS] a [SEP] (b [SEP]), truncated longest-first
// to max_length, unpadded; its token types alongside.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/csv.h"
#include "data/dataset.h"

namespace anatomy {

class Tokenizer;

// The classes of a labelled file, and how its labels become ids.
//   Ids: the file's labels are the integers 0..n-1 (each present), used as the ids.
//   Names: labels are strings; the distinct strings sorted by byte value get ids 0, 1, ... in
//     that order, so the same set of labels always gets the same ids. Integer labels other than
//     0..n-1 (1..5, -1 and 1) are named by their decimal text and numbered in numeric order, as
//     run_glue.py maps the sorted distinct labels to 0..n-1 (labels 1..5 make five classes).
//   None: the file was read without a label column; every label is 0.
struct LabelSet {
  enum class Kind : uint8_t { None, Ids, Names };
  Kind kind = Kind::None;
  int64_t num_labels = 0;
  std::vector<std::string> names;  // Names: id -> label

  static LabelSet ids(int64_t num_labels);
  static LabelSet from_names(std::vector<std::string> names);  // id = position, names unique
  // run_glue.py's classes of integer labels (any order, repeats allowed): Ids when they are
  // 0..n-1, else Names, the distinct values' decimal text in numeric order.
  static LabelSet from_integers(std::vector<int64_t> values);
  // The id of the integer label v: Ids: v when in range; Names: the name that is v's decimal
  // text. -1 when it names no class.
  int64_t id_of_integer(int64_t v) const;
  // From a config.json's id2label: the default names "LABEL_<i>" give Ids, anything else Names.
  static LabelSet from_id2label(const std::map<int, std::string>& id2label);

  // For BertConfig: names, or "LABEL_<i>" for Ids (transformers' defaults).
  std::map<int, std::string> id2label() const;
  std::map<std::string, int> label2id() const;
  bool operator==(const LabelSet&) const = default;
};

enum class CacheMode : uint8_t {
  ReadWrite,  // reuse a cache with the right key, else tokenize and write one
  Off,        // tokenize in memory every time; write nothing
};

// The most tokens a text is cut to (a record holds at most kMaxRecordBytes bytes anyway).
constexpr int64_t kMaxTextTokens = int64_t{1} << 24;

struct TextDataOptions {
  std::string text_column = "text";
  std::string text_pair_column;          // empty: single texts; else [CLS] a [SEP] b [SEP]
  std::string label_column = "label";    // empty: an unlabelled file (every label 0)
  int64_t max_length = 128;              // tokens including [CLS]/[SEP]; longer samples are truncated
  bool skip_blank_texts = false;         // records whose text is empty or Python's isspace() are left out
  TextFormat format = TextFormat::Auto;  // Auto: by extension (format_from_path)
  char delimiter = 0;                    // CSV/TSV; 0: ',' for CSV, '\t' for TSV
  size_t max_record_bytes = kMaxRecordBytes;
  std::string cache_dir;  // empty: beside the data file
  CacheMode cache = CacheMode::ReadWrite;
  // Given (a validation or evaluation file): labels are mapped through it, and one it does not
  // know is an error naming the file and line. Unset: derived from this file (see LabelSet).
  std::optional<LabelSet> labels;
  // The flag that named the file ("--train-file"), for errors about the file itself.
  std::string source_flag;
};

// Note [run_glue.py's text columns] (data/csv.h): when the user named no text column, `o`'s text
// columns become run_glue.py's choice for `path` if it lacks o.text_column; the choice is said on
// stderr, naming the file with o.source_flag.
void use_run_glue_columns(TextDataOptions& o, const std::string& path);
// run_mlm.py's column: when the user named no text column and `path` (CSV or JSON Lines) lacks
// o.text_column, its first column is the text; said on stderr, as above.
void use_run_mlm_column(TextDataOptions& o, const std::string& path);

enum class CacheStatus : uint8_t { Created, Reused, InMemory };

// A 64-bit non-cryptographic hash in the style of xxHash64 (four lanes of multiply-rotate
// rounds over 8-byte words, then an avalanche); not bit-compatible with xxHash. Strong enough
// to tell files apart for a cache key; not meant to resist someone crafting collisions.
class Hash64 {
 public:
  explicit Hash64(uint64_t seed = 0);
  Hash64& update(const void* data, size_t n);
  Hash64& update(std::string_view s) { return update(s.data(), s.size()); }
  // A length-prefixed field, so ("ab", "c") and ("a", "bc") differ.
  Hash64& field(std::string_view s);
  Hash64& field(uint64_t v) { return update(&v, sizeof v); }
  uint64_t digest() const;

 private:
  uint64_t m_lane[4];
  unsigned char m_buf[32];
  size_t m_buffered = 0;
  uint64_t m_total = 0;
};
uint64_t hash64(std::string_view bytes, uint64_t seed = 0);

class TextDataset final : public Dataset {
 public:
  // Reads, tokenizes (or maps the cache of) the file. Errors name the file and, for a bad record,
  // its line.
  static TextDataset load(const std::string& path, const Tokenizer& tok, const TextDataOptions& options = {});

  ~TextDataset() override;
  TextDataset(TextDataset&&) noexcept;
  TextDataset& operator=(TextDataset&&) noexcept;
  TextDataset(const TextDataset&) = delete;
  TextDataset& operator=(const TextDataset&) = delete;

  size_t size() const override { return m_n; }
  // The longest a sample can be: options.max_length.
  int64_t seq_len() const override { return m_max_length; }
  // Fills row `row` of `out` with sample i padded to out.seq (which may be shorter than
  // seq_len() for a dynamically padded batch, but not shorter than the sample): ids then the
  // tokenizer's [PAD], types 0 and mask 0 over the padding.
  void get(size_t i, HostBatch& out, int64_t row) const override;

  int64_t length(size_t i) const { return static_cast<int64_t>(m_offsets[i + 1] - m_offsets[i]); }
  std::vector<int64_t> lengths() const override;
  // The batch length for dynamic padding: the longest sample among `indices`.
  int64_t longest_in(const std::vector<size_t>& indices) const;
  std::span<const int32_t> ids(size_t i) const { return {m_ids + m_offsets[i], static_cast<size_t>(length(i))}; }
  std::span<const uint8_t> types(size_t i) const { return {m_types + m_offsets[i], static_cast<size_t>(length(i))}; }
  int32_t label(size_t i) const { return m_labels[i]; }

  const LabelSet& labels() const { return m_label_set; }
  const std::string& path() const { return m_path; }
  const std::string& cache_path() const { return m_cache_path; }  // empty when InMemory
  CacheStatus cache_status() const { return m_status; }
  // Why an existing cache file was not used and was rebuilt (damaged, another version); empty
  // when it was reused or there was none. The load also reports it on stderr, one line.
  const std::string& cache_problem() const { return m_cache_problem; }

 private:
  struct Storage;
  TextDataset() = default;
  void bind();  // points the views at m_storage

  std::string m_path, m_cache_path, m_cache_problem;
  CacheStatus m_status = CacheStatus::InMemory;
  int64_t m_max_length = 0;
  int32_t m_pad_id = 0;
  LabelSet m_label_set;
  std::unique_ptr<Storage> m_storage;
  size_t m_n = 0;
  const uint64_t* m_offsets = nullptr;  // (n + 1)
  const int32_t* m_labels = nullptr;    // (n)
  const int32_t* m_ids = nullptr;       // (tokens)
  const uint8_t* m_types = nullptr;     // (tokens)
};

// Epoch batches with similar lengths together, so dynamic padding wastes little: a seeded
// shuffle, then within each chunk of 50 batches the samples are sorted by length and cut into
// batches, and the batches of all chunks are shuffled. Every index appears exactly once; one
// batch (the remainder, anywhere in the order) may be smaller than `batch`. Pass a seed that
// mixes in the epoch.
std::vector<std::vector<size_t>> bucketed_batches(const std::vector<int64_t>& lengths, int64_t batch, uint64_t seed,
                                                  size_t batches_per_chunk = 50);

// A seeded split of n samples: round(n * fraction) of them (at least 1, at most n - 1) for
// validation, the rest for training, each list ascending.
struct TrainValSplit {
  std::vector<size_t> train, val;
};
TrainValSplit split(size_t n, double fraction, uint64_t seed);
inline TrainValSplit split(const Dataset& ds, double fraction, uint64_t seed) {
  return split(ds.size(), fraction, seed);
}

// The samples `indices` of another dataset (which must outlive it), e.g. one side of a split.
class SubsetDataset final : public Dataset {
 public:
  SubsetDataset(const Dataset& base, std::vector<size_t> indices);
  size_t size() const override { return m_indices.size(); }
  int64_t seq_len() const override { return m_base.seq_len(); }
  void get(size_t i, HostBatch& out, int64_t row) const override { m_base.get(m_indices[i], out, row); }
  const std::vector<size_t>& indices() const { return m_indices; }

 private:
  const Dataset& m_base;
  std::vector<size_t> m_indices;
};

}  // namespace anatomy
