// Datasets of token sequences with labels, batching with a seeded shuffle, and a background
// prefetch thread that fills the next batches while the device trains on the current one.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace anatomy {

// One batch on the host: I32 ids, token types and mask [B, T] row-major; labels [B]. Float
// labels (regression, multi-label: data/float_labels.h) in targets [B, target_width] instead.
struct HostBatch {
  int64_t batch = 0, seq = 0;
  std::vector<int32_t> input_ids, token_type_ids, attention_mask, labels;
  int64_t target_width = 0;  // 0: class labels
  std::vector<float> targets;
  // Masked-LM (data/masked_lm.h): per-token labels [B, T], -100 where a token is not scored.
  std::vector<int32_t> token_labels;
  // The training epoch the batch is drawn for (the Prefetcher sets it; 0 elsewhere): masked-LM
  // masks are drawn afresh per epoch (Note [masking] in data/masked_lm.h).
  int64_t epoch = 0;
  void resize(int64_t B, int64_t T);
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual size_t size() const = 0;
  virtual int64_t seq_len() const = 0;
  // Writes sample i into row `row` of the batch (length seq_len()).
  virtual void get(size_t i, HostBatch& out, int64_t row) const = 0;
  // Each sample's tokens, padding excluded (evaluation pads a batch to its longest); empty when
  // not known: every sample is seq_len() long.
  virtual std::vector<int64_t> lengths() const { return {}; }
};

enum class SyntheticKind : uint8_t {
  // The seed experiment: ids uniform in [100, 30000), no padding, every label 0 (the page's
  // randint(0, 1)).
  Seed,
  // A learnable task: label c in {0, 1} decides which of two id ranges the first tokens after
  // [CLS] come from; the rest is random, and sequences are padded to random lengths.
  Learnable,
};

SyntheticKind parse_synthetic_kind(const std::string& s);

// Samples are pure functions of (seed, index), so any sample can be regenerated on resume.
class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(SyntheticKind kind, size_t n, int64_t seq_len, int64_t vocab_size, uint64_t seed);
  size_t size() const override { return m_n; }
  int64_t seq_len() const override { return m_seq; }
  void get(size_t i, HostBatch& out, int64_t row) const override;

 private:
  SyntheticKind m_kind;
  size_t m_n;
  int64_t m_seq, m_vocab;
  uint64_t m_seed;
};

// The share of `unk_id` among the real (attention-mask 1) tokens of up to `max_samples` samples
// of `data`, evenly spaced over it; 0 when unk_id < 0 or there are none (Note [unknown-token
// share] in train/train_data.cpp).
double unknown_token_share(const Dataset& data, int32_t unk_id, size_t max_samples = 512);

// Epoch order: a seeded permutation per epoch (the Trainer's RandomSampler), batches of
// `batch` samples with a smaller last batch (drop_last false). Given per-sample lengths, batches
// are padded only to their longest sample (dynamic padding) and, with group_by_length, samples
// of similar length are batched together (bucketed_batches in data/text_dataset.h). The order of
// epoch e is a pure function of (seed, e), so a resumed run regenerates it from the position.
class BatchPlan {
 public:
  BatchPlan(size_t n, int64_t batch, uint64_t seed) : m_n(n), m_batch(batch), m_seed(seed) {}
  BatchPlan(std::vector<int64_t> lengths, int64_t batch, uint64_t seed, bool group_by_length);
  int64_t batches_per_epoch() const { return static_cast<int64_t>((m_n + m_batch - 1) / m_batch); }
  // Sample indices of batch b of epoch e (the epoch's order is computed once and kept).
  std::vector<size_t> indices(int64_t epoch, int64_t b) const;
  // The padded length of a batch: its longest sample with lengths, else `full`.
  int64_t padded_length(const std::vector<size_t>& idx, int64_t full) const;

 private:
  size_t m_n;
  int64_t m_batch;
  uint64_t m_seed;
  std::vector<int64_t> m_lengths;  // empty: every sample is full length
  bool m_group = false;
  mutable int64_t m_cached_epoch = -1;
  mutable std::vector<std::vector<size_t>> m_epoch;  // batches of m_cached_epoch
};

// Fills batches on a background thread into a bounded queue (depth `prefetch`), in the order
// given by a BatchPlan from a starting global batch index. next() blocks only when the
// producer is behind; the time it blocked is the trainer's data-wait time.
class Prefetcher {
 public:
  // per_rank > 0: only rows [rank * per_rank, (rank + 1) * per_rank) of each planned batch (a
  // data-parallel rank's slice of the global batch); a slice past the batch's end holds its row 0
  // (the trainer gives it no weight), so every rank always has a batch to run.
  Prefetcher(const Dataset& ds, BatchPlan plan, int64_t first_batch, int64_t last_batch, int prefetch, int rank = 0,
             int64_t per_rank = 0);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;
  // Returns false after last_batch. wait_seconds receives how long the caller waited.
  bool next(HostBatch& out, double& wait_seconds);

 private:
  void run();
  const Dataset& m_ds;
  BatchPlan m_plan;
  int64_t m_next, m_last;
  size_t m_depth;
  int m_rank;
  int64_t m_per_rank;
  std::deque<HostBatch> m_queue;
  std::mutex m_mu;
  std::condition_variable m_cv;
  bool m_stop = false, m_done = false;
  std::string m_error;
  std::thread m_thread;
};

}  // namespace anatomy
