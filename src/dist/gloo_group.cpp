// Note [process group sums]: Gloo's ring all-reduce adds in an order that depends on each
// element's position in the ring, so a sum would differ from the in-process group's (and, for a
// different world size, from itself). Instead every sum is a reduce-scatter by its owner: Gloo's
// all-to-all moves shard s of every rank to rank s, which adds them in rank order starting from
// 0.0f (0 + x0 + x1 + ...: float arithmetic, the order make_local_group uses), then Gloo's
// all-gather hands the summed shards back. The bytes each rank sends, 2 (N-1)/N of the buffer,
// are those of a ring all-reduce; the result is bitwise the local group's on every rank.
#include "dist/gloo_group.h"

#include <arpa/inet.h>
#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "dist/bootstrap.h"
#include "dist/launch.h"

namespace anatomy {

namespace {

// Gloo's rendezvous through our store.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  explicit StoreAdapter(TcpStore& s) : m_s(s) {}
  void set(const std::string& key, const std::vector<char>& data) override { m_s.set(key, data); }
  std::vector<char> get(const std::string& key) override { return m_s.get(key); }
  void wait(const std::vector<std::string>& keys) override { m_s.wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    m_s.wait(keys, timeout);
  }

 private:
  TcpStore& m_s;
};

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// The address of this host that faces rank 0 (the interface a packet to MASTER_ADDR would
// leave by), so peers on other machines can reach this rank's Gloo sockets.
std::string local_address_towards(const std::string& host, int port) {
  if (is_loopback(host)) return "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  ANATOMY_CHECK(::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) == 0,
                "MASTER_ADDR=", host, ": cannot resolve it");
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in me{};
  socklen_t len = sizeof me;
  const bool ok = fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0;
  ::freeaddrinfo(res);
  if (fd >= 0) ::close(fd);
  ANATOMY_CHECK(ok, "MASTER_ADDR=", host, ": no route to it from this host (set GLOO_SOCKET_IFNAME to the interface)");
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &me.sin_addr, buf, sizeof buf);
  return buf;
}

// The first line of an engine's message (Gloo's carry file:line prefixes and newlines).
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(const LaunchEnv& env) : m_rank(env.rank), m_world(env.world_size), m_timeout(env.timeout) {
    if (m_world == 1) return;
    m_store = std::make_unique<TcpStore>(env.master_addr, env.bootstrap_port, env.rank == 0, env.timeout);
    m_store->join(m_rank, m_world);
    // Watched from the join on: a rank lost before Gloo's mesh is connected ends this one within
    // seconds (on_peer_failure, as in a collective), not at the rendezvous timeout.
    m_store->watch([this] { on_peer_failure(); });
    gloo::transport::tcp::attr attr;
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
      attr.iface = ifname;
    else
      attr.hostname = local_address_towards(env.master_addr, env.bootstrap_port);
    try {
      auto dev = gloo::transport::tcp::CreateDevice(attr);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(m_rank, m_world);
      ctx->setTimeout(env.timeout);
      StoreAdapter store(*m_store);
      m_in_collective = "rendezvous";
      ctx->connectFullMesh(store, dev);
      m_in_collective = nullptr;
      m_ctx = std::move(ctx);
    } catch (const gloo::Exception& e) {
      m_in_collective = nullptr;
      m_closing = true;  // this thread reports: a watcher that fired returns at once
      if (const std::string why = lost_rank(); !why.empty()) fail("gloo rendezvous: the group did not form: ", why);
      fail("gloo: rank ", m_rank, " could not connect to the other ", m_world - 1, " ranks (rendezvous at ",
           m_store->address(), "): ", first_line(e.what()));
    } catch (...) {  // the store's own error (a rank lost: the group did not form; the timeout)
      m_in_collective = nullptr;
      m_closing = true;
      throw;
    }
  }
  ~GlooCommunicator() override {
    m_closing = true;  // the watcher's on_peer_failure returns; m_store's destructor joins it
    if (m_store) (m_failed || std::uncaught_exceptions() > 0 ? m_store->leave() : m_store->finish());
  }

  int rank() const override { return m_rank; }
  int size() const override { return m_world; }
  const char* kind() const override { return "gloo"; }

  void all_reduce_sum(const Tensor& buf) override {
    const auto shards = shard_ranges(buf.numel(), m_world, 1);
    reduce_scatter_sum(buf, shards);
    all_gather(buf, shards);
  }

  void reduce_scatter_sum(const Tensor& buf, const std::vector<ShardRange>& shards) override {
    float* p = f32(buf, shards);
    const ShardRange own = shards[static_cast<size_t>(m_rank)];
    std::vector<float> rows(own.size() * static_cast<size_t>(m_world));  // row r: rank r's copy of my shard
    if (m_world == 1) {
      std::copy_n(p + own.begin, own.size(), rows.data());
    } else {
      std::vector<int64_t> send(static_cast<size_t>(m_world)), recv(send.size(), static_cast<int64_t>(own.size()));
      for (size_t r = 0; r < send.size(); ++r) send[r] = static_cast<int64_t>(shards[r].size());
      engine("reduce_scatter_sum", [&] {
        gloo::AlltoallvOptions o(m_ctx);
        o.setInput(p, send);
        o.setOutput(rows.data(), recv);
        o.setTimeout(m_timeout);
        gloo::alltoallv(o);
      });
    }
    for (size_t i = 0; i < own.size(); ++i) {
      float acc = 0.0f;
      for (size_t r = 0; r < static_cast<size_t>(m_world); ++r) acc += rows[r * own.size() + i];
      p[own.begin + i] = acc;
    }
  }

  void all_gather(const Tensor& buf, const std::vector<ShardRange>& shards) override {
    if (buf.dtype != DType::F32) return gather_as<uint16_t>(buf, shards);
    gather_as<float>(buf, shards);
  }
  // F32 as floats, 16-bit types as their bits (a copy: no arithmetic).
  template <class E>
  void gather_as(const Tensor& buf, const std::vector<ShardRange>& shards) {
    check_shards(buf, shards);
    ANATOMY_CHECK(buf.device == Device::CPU && dtype_size(buf.dtype) == sizeof(E),
                  "internal error: gloo all_gather takes F32 or 16-bit host buffers");
    E* p = static_cast<E*>(buf.data);
    if (m_world == 1) return;
    const ShardRange own = shards[static_cast<size_t>(m_rank)];
    std::vector<E> mine(p + own.begin, p + own.end);  // Gloo's input may not alias its output
    std::vector<size_t> counts(static_cast<size_t>(m_world));
    for (size_t r = 0; r < counts.size(); ++r) counts[r] = shards[r].size();
    engine("all_gather", [&] {
      gloo::AllgathervOptions o(m_ctx);
      o.setInput(mine.data(), mine.size());
      o.setOutput(p, counts);
      o.setTimeout(m_timeout);
      gloo::allgatherv(o);
    });
  }

  void all_reduce_host(std::span<double> v, Op op) override {
    std::vector<double> rows(v.begin(), v.end());
    if (m_world > 1 && !v.empty()) {
      rows.resize(v.size() * static_cast<size_t>(m_world));
      engine("all_reduce_host", [&] {
        gloo::AllgatherOptions o(m_ctx);
        o.setInput(v.data(), v.size());
        o.setOutput(rows.data(), rows.size());
        o.setTimeout(m_timeout);
        gloo::allgather(o);
      });
    }
    combine_in_rank_order(v, rows, v.empty() ? 1 : m_world, op);
  }

  void broadcast_host(std::span<double> v, int root) override {
    ANATOMY_CHECK(root >= 0 && root < m_world, "internal error: broadcast from rank ", root, " of ", m_world);
    if (m_world == 1 || v.empty()) return;
    engine("broadcast_host", [&] {
      gloo::BroadcastOptions o(m_ctx);
      o.setOutput(v.data(), v.size());
      o.setRoot(root);
      o.setTimeout(m_timeout);
      gloo::broadcast(o);
    });
  }

  void barrier() override {
    if (m_world == 1) return;
    engine("barrier", [&] {
      gloo::BarrierOptions o(m_ctx);
      o.setTimeout(m_timeout);
      gloo::barrier(o);
    });
  }

  void wait_for_all() override {
    if (m_world == 1) return;
    engine("wait for every rank", [&] {
      gloo::BarrierOptions o(m_ctx);
      o.setTimeout(std::chrono::hours(24 * 30));  // a month: the failure watch ends it sooner
      gloo::barrier(o);
    }, /*timed=*/false);
  }

  void abort() noexcept override {
    if (m_aborted.exchange(true) || !m_store) return;
    m_failed = true;
    m_closing = true;  // leave() joins the watcher: on_peer_failure returns at once
    m_store->leave();  // the others' watches fire (Note [failure watch])
    // Peers blocked on this rank see its sockets close at once.
    try {
      if (m_ctx) m_ctx->closeConnections();
    } catch (...) {
    }
  }

 private:
  // Runs one Gloo collective; its failures (a peer's sockets closing, the timeout when `timed`)
  // become one line naming the collective.
  template <class F>
  void engine(const char* what, F&& run, bool timed = true) {
    ANATOMY_CHECK(!m_failed, "gloo ", what, ": another rank of the group failed (rank ", m_rank, " of ", m_world, ")");
    m_in_collective = what;
    struct Done {
      std::atomic<const char*>& in;
      ~Done() { in = nullptr; }
    } done{m_in_collective};
    try {
      run();
    } catch (const gloo::Exception& e) {
      m_failed = true;
      if (const std::string who = lost_rank(); !who.empty()) fail("gloo ", what, ": ", who);
      fail("gloo ", what, ": rank ", m_rank, " of ", m_world, " lost its peers (another rank failed",
           timed ? str_cat(", or ", m_timeout.count() / 1000, " s passed") : std::string(), "): ", first_line(e.what()));
    }
  }

  // The rank whose loss rank 0's store recorded (Note [failure watch]), given the watch a moment
  // to see it (a peer's sockets may reset first); empty: none recorded, or the store is gone.
  std::string lost_rank() {
    if (!m_store) return {};
    for (int i = 0; i < 20 && !m_watch_fired; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    try {
      return m_watch_fired ? m_store->failure() : std::string();
    } catch (const Error&) {
      return {};
    }
  }

  // Note [failure watch], on the watcher's thread. A collective blocked on the failed rank mostly
  // ends at once (its sockets reset), but Gloo can miss the reset and wait out its whole timeout
  // (a receive posted as the peer died), and its buffers cannot be aborted from outside. So a
  // collective entered before the failure and still running 2 s later ends the process with the
  // error; one entered after it is refused by engine's check.
  void on_peer_failure() {
    m_watch_fired = true;
    m_failed = true;
    for (int i = 0; i < 40 && !m_closing; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (const char* what = m_in_collective.load(); what && !m_closing) {
      std::fprintf(stderr, "anatomy: error: gloo %s: rank %d of %d lost its peers (another rank failed)\n", what, m_rank,
                   m_world);
      std::fflush(nullptr);
      std::_Exit(2);
    }
  }

  float* f32(const Tensor& buf, const std::vector<ShardRange>& shards) const {
    ANATOMY_CHECK(buf.dtype == DType::F32 && buf.device == Device::CPU, "internal error: gloo collectives take F32 host buffers");
    check_shards(buf, shards);
    return buf.ptr<float>();
  }
  void check_shards(const Tensor& buf, const std::vector<ShardRange>& shards) const {
    ANATOMY_CHECK(shards.size() == static_cast<size_t>(m_world) && shards.back().end <= buf.numel() &&
                      shards.front().begin == 0,
                  "internal error: ", shards.size(), " shards for ", m_world, " ranks over ", buf.numel(), " elements");
    for (size_t r = 1; r < shards.size(); ++r)
      ANATOMY_CHECK(shards[r].begin == shards[r - 1].end, "internal error: gloo collectives take contiguous shards");
  }

  int m_rank, m_world;
  std::chrono::milliseconds m_timeout;
  std::shared_ptr<gloo::Context> m_ctx;
  std::atomic<bool> m_failed{false}, m_aborted{false}, m_closing{false}, m_watch_fired{false};
  std::atomic<const char*> m_in_collective{nullptr};  // the collective running, for on_peer_failure
  // Last, so destroyed first: its destructor joins the watcher, which reads the members above
  // (also when the constructor throws after the watch started).
  std::unique_ptr<TcpStore> m_store;
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_group(const LaunchEnv& env) { return std::make_unique<GlooCommunicator>(env); }

}  // namespace anatomy
