#include "data/dataset.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "data/text_dataset.h"
#include "core/host_memory.h"

namespace anatomy {

void HostBatch::resize(int64_t B, int64_t T) {
  batch = B;
  seq = T;
  input_ids.assign(B * T, 0);
  token_type_ids.assign(B * T, 0);
  attention_mask.assign(B * T, 0);
  labels.assign(B, 0);
  targets.assign(B * target_width, 0.0f);
}

double unknown_token_share(const Dataset& data, int32_t unk_id, size_t max_samples) {
  const size_t n = std::min(data.size(), max_samples);
  if (unk_id < 0 || n == 0) return 0.0;
  HostBatch b;
  b.resize(1, data.seq_len());
  int64_t real = 0, unknown = 0;
  for (size_t k = 0; k < n; ++k) {
    data.get(k * data.size() / n, b, 0);
    for (int64_t t = 0; t < b.seq; ++t) {
      if (b.attention_mask[static_cast<size_t>(t)] == 0) continue;
      ++real;
      unknown += b.input_ids[static_cast<size_t>(t)] == unk_id ? 1 : 0;
    }
  }
  return real > 0 ? static_cast<double>(unknown) / static_cast<double>(real) : 0.0;
}

SyntheticKind parse_synthetic_kind(const std::string& s) {
  if (s == "seed" || s == "synthetic") return SyntheticKind::Seed;
  if (s == "learnable") return SyntheticKind::Learnable;
  fail("--dataset: unknown synthetic set '", s, "' (expected seed or learnable)");
}

SyntheticDataset::SyntheticDataset(SyntheticKind kind, size_t n, int64_t seq_len, int64_t vocab, uint64_t seed)
    : m_kind(kind), m_n(n), m_seq(seq_len), m_vocab(vocab), m_seed(seed) {
  ANATOMY_CHECK(n > 0, "--num-samples must be at least 1");
  // An epoch's shuffled order holds two 8-byte indices per sample (BatchPlan::indices); beyond
  // half the machine's memory for that alone, the run cannot go on (it would die in bad_alloc).
  const int64_t host = host_memory_bytes();
  ANATOMY_CHECK(n <= static_cast<size_t>(host / 32), "--num-samples ", n, ": the shuffled order of one epoch alone needs ",
                static_cast<int64_t>(std::min<size_t>(n, SIZE_MAX / 16) * 16 >> 20), " MiB, more than half of this machine's ",
                host >> 20, " MiB of memory; lower --num-samples");
  ANATOMY_CHECK(seq_len >= 2, "--max-seq-length must be at least 2");
  // The seed set draws ids from 100 up; the learnable one marks its classes with ids 1000-1099
  // and 2000-2099 and fills with ids from 300 up.
  const int64_t least = kind == SyntheticKind::Seed ? 101 : 2101;
  ANATOMY_CHECK(vocab >= least, "--dataset ", kind == SyntheticKind::Seed ? "seed" : "learnable",
                " needs a vocabulary of at least ", least, " ids (config has ", vocab, "); use a text file (--train-file)");
}

void SyntheticDataset::get(size_t i, HostBatch& out, int64_t row) const {
  Rng rng(mix64(m_seed * 0x2545f4914f6cdd1dULL + i));
  int32_t* ids = out.input_ids.data() + row * m_seq;
  int32_t* types = out.token_type_ids.data() + row * m_seq;
  int32_t* mask = out.attention_mask.data() + row * m_seq;
  const int64_t hi = std::min<int64_t>(30000, m_vocab);
  if (m_kind == SyntheticKind::Seed) {
    for (int64_t t = 0; t < m_seq; ++t) {
      ids[t] = static_cast<int32_t>(rng.randint(100, hi));
      types[t] = 0;
      mask[t] = 1;
    }
    out.labels[row] = 0;
    return;
  }
  const int32_t label = static_cast<int32_t>(rng.randint(0, 2));
  const int64_t len = m_seq / 2 + rng.randint(0, m_seq - m_seq / 2 + 1);  // in [T/2, T]
  const int64_t marked = std::min<int64_t>(4, len - 1);
  for (int64_t t = 0; t < m_seq; ++t) {
    int32_t id = 0;
    if (t == 0) {
      id = 101;  // [CLS]
    } else if (t <= marked) {
      id = static_cast<int32_t>(label ? rng.randint(1000, 1100) : rng.randint(2000, 2100));
    } else if (t < len) {
      id = static_cast<int32_t>(rng.randint(300, hi));
    }
    ids[t] = id;
    types[t] = 0;
    mask[t] = t < len ? 1 : 0;
  }
  out.labels[row] = label;
}

BatchPlan::BatchPlan(std::vector<int64_t> lengths, int64_t batch, uint64_t seed, bool group_by_length)
    : m_n(lengths.size()), m_batch(batch), m_seed(seed), m_lengths(std::move(lengths)), m_group(group_by_length) {}

std::vector<size_t> BatchPlan::indices(int64_t epoch, int64_t b) const {
  if (epoch != m_cached_epoch) {
    const uint64_t epoch_seed = mix64(m_seed + 0x51ed270b27a1c3d5ULL * static_cast<uint64_t>(epoch + 1));
    m_epoch.clear();
    if (m_group) {
      m_epoch = bucketed_batches(m_lengths, m_batch, epoch_seed);
    } else {
      std::vector<size_t> perm(m_n);
      std::iota(perm.begin(), perm.end(), size_t{0});
      Rng rng(epoch_seed);
      for (size_t i = m_n; i > 1; --i) std::swap(perm[i - 1], perm[rng.next() % i]);  // Fisher-Yates
      for (size_t begin = 0; begin < m_n; begin += static_cast<size_t>(m_batch))
        m_epoch.emplace_back(perm.begin() + begin, perm.begin() + std::min(m_n, begin + m_batch));
    }
    m_cached_epoch = epoch;
  }
  return m_epoch.at(static_cast<size_t>(b));
}

int64_t BatchPlan::padded_length(const std::vector<size_t>& idx, int64_t full) const {
  if (m_lengths.empty()) return full;
  int64_t longest = 1;
  for (size_t i : idx) longest = std::max(longest, m_lengths[i]);
  return std::min(longest, full);
}

Prefetcher::Prefetcher(const Dataset& ds, BatchPlan plan, int64_t first, int64_t last, int prefetch, int rank,
                       int64_t per_rank)
    : m_ds(ds), m_plan(plan), m_next(first), m_last(last), m_depth(std::max(1, prefetch)), m_rank(rank),
      m_per_rank(per_rank) {
  m_thread = std::thread([this] { run(); });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(m_mu);
    m_stop = true;
  }
  m_cv.notify_all();
  if (m_thread.joinable()) m_thread.join();
}

void Prefetcher::run() {
  const int64_t per_epoch = m_plan.batches_per_epoch();
  try {
    for (int64_t g = m_next; g < m_last; ++g) {
      std::vector<size_t> idx = m_plan.indices(g / per_epoch, g % per_epoch);
      if (m_per_rank > 0) {
        const size_t b = std::min(idx.size(), static_cast<size_t>(m_rank * m_per_rank));
        const size_t e = std::min(idx.size(), b + static_cast<size_t>(m_per_rank));
        idx = b < e ? std::vector<size_t>(idx.begin() + static_cast<std::ptrdiff_t>(b), idx.begin() + static_cast<std::ptrdiff_t>(e))
                    : std::vector<size_t>{idx[0]};
      }
      HostBatch hb;
      hb.epoch = g / per_epoch;
      hb.resize(static_cast<int64_t>(idx.size()), m_plan.padded_length(idx, m_ds.seq_len()));
      for (size_t r = 0; r < idx.size(); ++r) m_ds.get(idx[r], hb, static_cast<int64_t>(r));
      std::unique_lock<std::mutex> lock(m_mu);
      m_cv.wait(lock, [this] { return m_stop || m_queue.size() < m_depth; });
      if (m_stop) return;
      m_queue.push_back(std::move(hb));
      m_cv.notify_all();
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(m_mu);
    m_error = e.what();
  }
  std::lock_guard<std::mutex> lock(m_mu);
  m_done = true;
  m_cv.notify_all();
}

bool Prefetcher::next(HostBatch& out, double& wait_seconds) {
  auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(m_mu);
  m_cv.wait(lock, [this] { return !m_queue.empty() || m_done; });
  wait_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (m_queue.empty()) {
    if (!m_error.empty()) throw Error(m_error);
    return false;
  }
  out = std::move(m_queue.front());
  m_queue.pop_front();
  m_cv.notify_all();
  return true;
}

}  // namespace anatomy
