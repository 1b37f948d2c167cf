#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstring>
#include <mutex>

#include "core/error.h"
#include "dist/communicator.h"

namespace anatomy {

std::vector<ShardRange> shard_ranges(size_t total, int world, size_t align) {
  ANATOMY_CHECK(world >= 1 && align >= 1, "internal error: shard_ranges(", total, ", ", world, ")");
  const size_t w = static_cast<size_t>(world);
  const size_t per = std::max(align, (total / w + align - 1) / align * align);  // the last shard is the short one
  std::vector<ShardRange> out(w);
  for (size_t r = 0; r < w; ++r) {
    out[r].begin = std::min(total, r * per);
    out[r].end = r + 1 == w ? total : std::min(total, (r + 1) * per);
  }
  return out;
}

void combine_in_rank_order(std::span<double> out, std::span<const double> gathered, int world, Communicator::Op op) {
  const size_t n = out.size();
  ANATOMY_CHECK(world >= 1 && gathered.size() == n * static_cast<size_t>(world), "internal error: ", gathered.size(),
                " gathered host values for ", world, " ranks of ", n);
  for (size_t i = 0; i < n; ++i) {
    double acc = gathered[i];
    for (size_t r = 1; r < static_cast<size_t>(world); ++r) {
      const double x = gathered[r * n + i];
      acc = op == Communicator::Op::Sum ? acc + x : op == Communicator::Op::Max ? std::max(acc, x) : std::min(acc, x);
    }
    out[i] = acc;
  }
}

namespace {

// What the ranks of a local group share: each rank's buffer for the collective in flight, and a
// barrier that separates "every rank has posted" from "every rank has read".
struct LocalShared {
  explicit LocalShared(int world)
      : bufs(static_cast<size_t>(world), nullptr), hbufs(static_cast<size_t>(world), nullptr), sync(world),
        dropped(static_cast<size_t>(world)) {}
  std::vector<float*> bufs;
  std::vector<double*> hbufs;  // host collectives
  std::barrier<> sync;
  std::atomic<bool> aborted{false};
  std::vector<std::atomic<bool>> dropped;  // a rank leaves the barrier once
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalShared> s, int rank, int world) : m_s(std::move(s)), m_rank(rank), m_world(world) {}
  int rank() const override { return m_rank; }
  int size() const override { return m_world; }
  const char* kind() const override { return "local"; }

  // A group of one has nothing to exchange (and may hold device buffers: the one-device run).
  void all_reduce_sum(const Tensor& buf) override {
    if (m_world == 1) return;
    const std::vector<ShardRange> all(static_cast<size_t>(m_world), ShardRange{0, buf.numel()});
    // Every rank sums the whole buffer in rank order into a private copy, then writes it back.
    float* mine = post(buf);
    std::vector<float> sum(buf.numel(), 0.0f);
    for (int r = 0; r < m_world; ++r)
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += m_s->bufs[static_cast<size_t>(r)][i];
    wait();  // all ranks have read every buffer
    std::memcpy(mine, sum.data(), sum.size() * sizeof(float));
    wait();
  }

  void reduce_scatter_sum(const Tensor& buf, const std::vector<ShardRange>& shards) override {
    if (m_world == 1) return;
    check(buf, shards);
    float* mine = post(buf);
    const ShardRange own = shards[static_cast<size_t>(m_rank)];
    std::vector<float> sum(own.size(), 0.0f);
    for (int r = 0; r < m_world; ++r)
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += m_s->bufs[static_cast<size_t>(r)][own.begin + i];
    wait();
    std::memcpy(mine + own.begin, sum.data(), sum.size() * sizeof(float));
    wait();
  }

  void all_gather(const Tensor& buf, const std::vector<ShardRange>& shards) override {
    if (m_world == 1) return;
    check(buf, shards);
    const size_t es = dtype_size(buf.dtype);
    ANATOMY_CHECK(buf.dtype == DType::F32 || es == 2, "internal error: local all_gather takes F32 or 16-bit host buffers");
    post_bytes(buf);  // copies only: the bytes, whatever the dtype
    auto bytes = [&](int r) { return reinterpret_cast<char*>(m_s->bufs[static_cast<size_t>(r)]); };
    // Shards are disjoint and each is read from its owner: copies cannot race with each other.
    for (int r = 0; r < m_world; ++r)
      if (r != m_rank) {
        const ShardRange s = shards[static_cast<size_t>(r)];
        std::memcpy(bytes(m_rank) + s.begin * es, bytes(r) + s.begin * es, s.size() * es);
      }
    wait();
  }

  void all_reduce_host(std::span<double> v, Op op) override {
    post_host(v);
    std::vector<double> gathered(v.size() * static_cast<size_t>(m_world));
    for (int r = 0; r < m_world; ++r)
      std::copy_n(m_s->hbufs[static_cast<size_t>(r)], v.size(), gathered.begin() + static_cast<ptrdiff_t>(r * v.size()));
    wait();
    combine_in_rank_order(v, gathered, m_world, op);
  }
  void broadcast_host(std::span<double> v, int root) override {
    ANATOMY_CHECK(root >= 0 && root < m_world, "internal error: broadcast from rank ", root, " of ", m_world);
    post_host(v);
    if (m_rank != root) std::copy_n(m_s->hbufs[static_cast<size_t>(root)], v.size(), v.data());
    wait();
  }
  void barrier() override { wait(); }

  void abort() noexcept override {
    m_s->aborted = true;
    // Leave the barrier (counting as this phase's arrival): ranks waiting in it are released.
    if (!m_s->dropped[static_cast<size_t>(m_rank)].exchange(true)) m_s->sync.arrive_and_drop();
  }

 private:
  // The group's barrier, and the check that no rank failed while this one waited.
  void wait() {
    if (m_s->aborted) throw GroupAborted();
    m_s->sync.arrive_and_wait();
    if (m_s->aborted) throw GroupAborted();
  }
  float* post(const Tensor& buf) {
    ANATOMY_CHECK(buf.dtype == DType::F32, "internal error: local collectives take F32 host buffers");
    return post_bytes(buf);
  }
  float* post_bytes(const Tensor& buf) {  // this rank's buffer, seen by every rank once all have posted
    ANATOMY_CHECK(buf.device == Device::CPU, "internal error: local collectives take host buffers");
    float* p = static_cast<float*>(buf.data);
    m_s->bufs[static_cast<size_t>(m_rank)] = p;
    wait();  // every rank has posted
    return p;
  }
  void post_host(std::span<double> v) {
    m_s->hbufs[static_cast<size_t>(m_rank)] = v.data();
    wait();
  }
  void check(const Tensor& buf, const std::vector<ShardRange>& shards) const {
    ANATOMY_CHECK(shards.size() == static_cast<size_t>(m_world) && shards.back().end <= buf.numel(),
                  "internal error: ", shards.size(), " shards for ", m_world, " ranks over ", buf.numel(), " elements");
  }

  std::shared_ptr<LocalShared> m_s;
  int m_rank, m_world;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_local_group(int world) {
  ANATOMY_CHECK(world >= 1, "internal error: a group of ", world, " ranks");
  auto shared = std::make_shared<LocalShared>(world);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < world; ++r) out.push_back(std::make_unique<LocalCommunicator>(shared, r, world));
  return out;
}

}  // namespace anatomy
