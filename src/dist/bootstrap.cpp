// Note [bootstrap protocol]: one request per frame, [op: 1 byte][key length: u32][key]
// [value length: u32][value], little-endian lengths as the host writes them (every rank of a job
// runs the same build). Requests: 'S' set (reply 'K'), 'G' get (reply 'F' with the value, or 'N'
// when no rank has set the key yet: the client polls, so the server never blocks on a key),
// 'C' claim (set the key unless some rank did: reply 'K', else 'X' with the value there; the key
// goes when the claiming connection closes), 'W' watch, 'B' bye. A client waits for a reply only
// after its own request.
//
// Note [failure watch]: from its join on (before it counts as joined) every rank keeps a second
// connection to rank 0's server on which it sends only 'W' (its rank and process) and, when it
// ends normally, 'B'. The server sees a connection close without 'B' when a rank dies (the kernel
// closes its sockets) or gives up (leave()); it then closes every watch connection, so every
// rank's watcher thread sees its own close within milliseconds and aborts its communicator (the
// engine's callback, given by watch() once the engine exists). Rank 0 dying closes them all too.
// The server also records the loss in the store (anatomy/failed: "rank 1 (host pid N) left the
// group without a goodbye"), so that ranks still forming the group (waiting for the others to join, or in
// Gloo's rendezvous) end with it at their next poll: a rank lost while waiting for a late one was
// seen by nobody, and the others waited out the timeout.
//
// A rank that fails before it joins tells the store itself (fail_group: the key anatomy/failed
// holds its error; Note [failure before the group] in dist/launch.cpp). Every member's wait()
// looks for that key at each poll, says it saw it (anatomy/failure-seen/<rank>; the server says
// so for a lost rank) and throws the error.
#include "dist/bootstrap.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace anatomy {

namespace {

using Clock = std::chrono::steady_clock;

const char* const kFailedKey = "anatomy/failed";
const char* const kSeenPrefix = "anatomy/failure-seen/";
std::string seen_key(int rank) { return str_cat(kSeenPrefix, rank); }
std::string joined_key(int rank) { return str_cat("anatomy/joined/", rank); }

// key(r) for every rank r of `world`.
std::vector<std::string> per_rank(std::string (*key)(int), int world) {
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(key(r));
  return keys;
}

bool send_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool recv_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t k = ::recv(fd, c, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool send_frame(int fd, char op, const std::string& key, const std::vector<char>& value) {
  const uint32_t kl = static_cast<uint32_t>(key.size()), vl = static_cast<uint32_t>(value.size());
  std::vector<char> f(1 + 4 + kl + 4 + vl);
  f[0] = op;
  std::memcpy(&f[1], &kl, 4);
  std::memcpy(&f[5], key.data(), kl);
  std::memcpy(&f[5 + kl], &vl, 4);
  if (vl) std::memcpy(&f[9 + kl], value.data(), vl);
  return send_all(fd, f.data(), f.size());
}

bool recv_frame(int fd, char& op, std::string& key, std::vector<char>& value) {
  uint32_t kl = 0, vl = 0;
  if (!recv_all(fd, &op, 1) || !recv_all(fd, &kl, 4) || kl > (1u << 20)) return false;
  key.resize(kl);
  if (!recv_all(fd, key.data(), kl) || !recv_all(fd, &vl, 4) || vl > (1u << 26)) return false;
  value.resize(vl);
  return recv_all(fd, value.data(), vl);
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

// Rank 0's side: a thread accepting connections and one thread per connection.
class StoreServer {
 public:
  StoreServer(int port) {
    m_listen = ::socket(AF_INET, SOCK_STREAM, 0);
    ANATOMY_CHECK(m_listen >= 0, "bootstrap: socket(): ", std::strerror(errno));
    const int one = 1;
    ::setsockopt(m_listen, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(m_listen, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(m_listen, 1024) != 0) {
      const std::string why = std::strerror(errno);
      close_fd(m_listen);
      fail("bootstrap: rank 0 cannot listen on port ", port, " (", why,
           "); set MASTER_PORT (or ANATOMY_BOOTSTRAP_PORT) to a free port");
    }
    m_accept = std::thread([this] { accept_loop(); });
  }

  // Waits (up to `grace`) for the watch connections of ranks still finishing, then stops.
  void stop(std::chrono::milliseconds grace) {
    {
      std::unique_lock lk(m_mu);
      m_cv.wait_for(lk, grace, [&] { return m_open_watches == 0; });
      m_stop = true;
      for (int fd : m_conns) ::shutdown(fd, SHUT_RDWR);
    }
    ::shutdown(m_listen, SHUT_RDWR);
    if (m_accept.joinable()) m_accept.join();
    for (auto& t : m_threads)
      if (t.joinable()) t.join();
    m_threads.clear();
    close_fd(m_listen);
  }
  ~StoreServer() { stop(std::chrono::milliseconds(0)); }

 private:
  void accept_loop() {
    while (true) {
      pollfd p{m_listen, POLLIN, 0};
      const int r = ::poll(&p, 1, 100);
      std::lock_guard lk(m_mu);
      if (m_stop) return;
      if (r <= 0 || !(p.revents & POLLIN)) continue;
      const int fd = ::accept(m_listen, nullptr, nullptr);
      if (fd < 0) continue;
      m_conns.push_back(fd);
      m_threads.emplace_back([this, fd] { serve(fd); });
    }
  }

  void serve(int fd) {
    char op = 0;
    std::string key;
    std::vector<char> value;
    bool watching = false, said_bye = false;
    std::string watched_rank, watched_process;  // the 'W' frame's
    std::vector<std::string> claimed;  // released when this connection closes: a restarted rank may claim again
    while (recv_frame(fd, op, key, value)) {
      std::unique_lock lk(m_mu);
      if (op == 'S') {
        m_kv[key] = value;
        lk.unlock();
        if (!send_frame(fd, 'K', {}, {})) break;
      } else if (op == 'C') {
        const auto [it, added] = m_kv.try_emplace(key, value);
        if (added) claimed.push_back(key);
        std::vector<char> held = added ? std::vector<char>{} : it->second;
        lk.unlock();
        if (!send_frame(fd, added ? 'K' : 'X', {}, held)) break;
      } else if (op == 'G') {
        auto it = m_kv.find(key);
        const bool found = it != m_kv.end();
        std::vector<char> v = found ? it->second : std::vector<char>{};
        lk.unlock();
        if (!send_frame(fd, found ? 'F' : 'N', {}, v)) break;
      } else if (op == 'W') {
        watching = true;
        watched_rank = key;
        watched_process.assign(value.begin(), value.end());
        ++m_open_watches;
        m_watch_fds.push_back(fd);
        if (m_failed) ::shutdown(fd, SHUT_RDWR);
      } else if (op == 'B') {
        said_bye = true;
      }
    }
    std::lock_guard lk(m_mu);
    for (const std::string& k : claimed) m_kv.erase(k);
    m_conns.erase(std::find(m_conns.begin(), m_conns.end(), fd));
    ::close(fd);
    if (watching) {
      --m_open_watches;
      m_watch_fds.erase(std::find(m_watch_fds.begin(), m_watch_fds.end(), fd));
      m_cv.notify_all();
      if (!said_bye && !m_stop && !m_failed) {
        // A rank left without saying goodbye: Note [failure watch]. Ranks still forming the
        // group read why from the store (the first failure told stays: a rank's own report
        // before the group, fail_group), and do not wait for the lost one to see it.
        m_failed = true;
        const std::string why = str_cat("rank ", watched_rank, " (", watched_process,
                                        ") left the group without a goodbye (it failed or was killed: its own log has the cause)");
        m_kv.try_emplace(kFailedKey, why.begin(), why.end());
        m_kv[kSeenPrefix + watched_rank] = {};
        for (int c : m_watch_fds) ::shutdown(c, SHUT_RDWR);
      }
    }
  }

  int m_listen = -1;
  std::mutex m_mu;
  std::condition_variable m_cv;
  bool m_stop = false, m_failed = false;
  int m_open_watches = 0;
  std::map<std::string, std::vector<char>> m_kv;
  std::vector<int> m_conns;  // open connections, each closed by its own thread
  std::vector<int> m_watch_fds;  // those of them that watch (Note [failure watch])
  std::vector<std::thread> m_threads;
  std::thread m_accept;
};

struct TcpStore::Watcher {
  std::thread thread;
  std::atomic<bool> quiet{false};
  std::mutex mu;
  std::function<void()> on_failure;  // watch()'s; a failure before it is kept in `fired`
  bool fired = false;
};

namespace {

int connect_until(const std::string& host, int port, Clock::time_point deadline, const std::string& where,
                  std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string last = "no answer";
  while (true) {
    addrinfo* res = nullptr;
    const int g = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    ANATOMY_CHECK(g == 0, "bootstrap: cannot resolve ", where, " (", ::gai_strerror(g), "); check MASTER_ADDR");
    for (addrinfo* a = res; a; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        ::freeaddrinfo(res);
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return fd;
      }
      last = std::strerror(errno);
      ::close(fd);
    }
    ::freeaddrinfo(res);
    ANATOMY_CHECK(Clock::now() < deadline, "bootstrap: no store at ", where, " after ", timeout.count() / 1000,
                  " s (", last, "); is rank 0 running, and are MASTER_ADDR/MASTER_PORT the same on every rank?");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

TcpStore::TcpStore(const std::string& host, int port, bool serve, std::chrono::milliseconds timeout)
    : m_host(host), m_port(port), m_timeout(timeout) {
  if (serve) {
    try {
      m_server = std::make_unique<StoreServer>(port);
    } catch (const Error& e) {
      refuse_second_rank_zero(e.what());
    }
  }
  const auto deadline = Clock::now() + timeout;
  m_fd = connect_until(host, port, deadline, address(), timeout);
  // Replies come at once (Note [bootstrap protocol]); a silent server is a dead one.
  timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  ::setsockopt(m_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

// Rank 0 could not listen on its port: when a store of this protocol answers there and a rank 0
// holds its place, say that (a second process started as rank 0, or another job on the port),
// not "set a free port"; else `listen_error`.
void TcpStore::refuse_second_rank_zero(const std::string& listen_error) {
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  std::string held;
  try {
    m_fd = connect_until(m_host, m_port, deadline, address(), std::chrono::seconds(2));
    timeval tv{2, 0};
    ::setsockopt(m_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char reply = 0;
    std::vector<char> out;
    request('G', "anatomy/rank/0", {}, reply, out);
    if (reply == 'F') held.assign(out.begin(), out.end());
  } catch (const Error&) {  // nothing of ours answers there
  }
  close_fd(m_fd);
  if (held.empty()) throw Error(listen_error);
  fail("rank 0 is already a process of a group at ", address(), " (", held, "; this one is ", this_process(),
       "): two processes were started as rank 0, or another job uses this MASTER_PORT; check the launcher's ranks "
       "(RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID) and give each job its own port");
}

TcpStore::~TcpStore() {
  if (m_watcher) (std::uncaught_exceptions() > 0 ? leave() : finish());
  close_fd(m_fd);
  if (m_server) m_server->stop(m_timeout);
}

void TcpStore::request(char op, const std::string& key, const std::vector<char>& value, char& reply,
                       std::vector<char>& out) {
  std::string k;
  ANATOMY_CHECK(send_frame(m_fd, op, key, value) && recv_frame(m_fd, reply, k, out),
                "bootstrap: lost rank 0's store at ", address(), " (rank 0 failed or timed out)");
}

void TcpStore::set(const std::string& key, const std::vector<char>& value) {
  char reply = 0;
  std::vector<char> out;
  request('S', key, value, reply, out);
  ANATOMY_CHECK(reply == 'K', "bootstrap: the store at ", address(), " answered '", reply, "' to a set");
}

std::string this_process() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return str_cat(host, " pid ", ::getpid());
}

void TcpStore::join(int rank, int world) {
  const std::string me = this_process();
  char reply = 0;
  std::vector<char> held;
  request('C', str_cat("anatomy/rank/", rank), std::vector<char>(me.begin(), me.end()), reply, held);
  ANATOMY_CHECK(reply == 'K', "rank ", rank, " is already a process of this group (", std::string(held.begin(), held.end()),
                "; this one is ", me, "): two processes were started with the same rank; check the launcher's ranks "
                "(RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID) and that one job is started once");
  m_rank = rank;
  m_world = world;
  open_watch();  // before it counts as joined: a rank lost from here on is seen (Note [failure watch])
  // Every rank here, or one failed before it could join (Note [failure before the group]): an
  // engine's own rendezvous (NCCL's init) would never look at the store again.
  set(joined_key(rank), {});
  wait(per_rank(joined_key, world));
}

void TcpStore::fail_group(int rank, const std::string& message) {
  set(kFailedKey, std::vector<char>(message.begin(), message.end()));
  set(seen_key(rank), {});  // it knows its own failure
}

void TcpStore::await_failure_seen(int world) { wait_for(per_rank(seen_key, world), m_timeout, false); }

std::vector<char> TcpStore::get(const std::string& key) {
  wait({key});
  char reply = 0;
  std::vector<char> out;
  request('G', key, {}, reply, out);
  return out;
}

void TcpStore::wait(const std::vector<std::string>& keys) { wait(keys, m_timeout); }

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  wait_for(keys, timeout, m_rank >= 0);
}

void TcpStore::wait_for(const std::vector<std::string>& keys, std::chrono::milliseconds timeout, bool heed_failure) {
  const auto deadline = Clock::now() + timeout;
  for (const std::string& key : keys) {
    auto pause = std::chrono::milliseconds(1);
    while (true) {
      char reply = 0;
      std::vector<char> out;
      request('G', key, {}, reply, out);
      if (reply == 'F') break;
      if (heed_failure) {  // a member: has a rank failed before the group formed?
        request('G', kFailedKey, {}, reply, out);
        if (reply == 'F') {
          set(seen_key(m_rank), {});
          // Rank 0's store goes with it: it stays until the others have seen the failure too
          // (else they would end with "lost rank 0's store", or a late one wait out its timeout).
          if (m_server) {
            try {
              wait_for(per_rank(seen_key, m_world), std::min<std::chrono::milliseconds>(m_timeout, kTellFailureFor), false);
            } catch (const Error&) {  // one never came: the failure is still this rank's to report
            }
          }
          fail("the group did not form: ", std::string(out.begin(), out.end()));
        }
      }
      ANATOMY_CHECK(Clock::now() < deadline, "bootstrap: '", key, "' never appeared in the store at ", address(),
                    " within ", timeout.count() / 1000, " s (a rank did not start, or WORLD_SIZE differs between ranks)");
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  }
}

void TcpStore::open_watch() {
  ANATOMY_ASSERT(!m_watcher);
  m_watch_fd = connect_until(m_host, m_port, Clock::now() + m_timeout, address(), m_timeout);
  const std::string me = this_process();
  ANATOMY_CHECK(send_frame(m_watch_fd, 'W', std::to_string(m_rank), std::vector<char>(me.begin(), me.end())),
                "bootstrap: lost rank 0's store at ", address());
  m_watcher = std::make_unique<Watcher>();
  Watcher* w = m_watcher.get();
  const int fd = m_watch_fd;
  w->thread = std::thread([w, fd] {
    char c;
    while (true) {
      const ssize_t k = ::recv(fd, &c, 1, 0);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;
    }
    if (w->quiet) return;
    std::function<void()> f;
    {
      std::lock_guard lk(w->mu);
      w->fired = true;
      f = w->on_failure;
    }
    if (f) f();
  });
}

std::string TcpStore::failure() {
  char reply = 0;
  std::vector<char> out;
  request('G', kFailedKey, {}, reply, out);
  return reply == 'F' ? std::string(out.begin(), out.end()) : std::string();
}

void TcpStore::watch(std::function<void()> on_failure) {
  if (!m_watcher) open_watch();
  bool fired = false;
  {
    std::lock_guard lk(m_watcher->mu);
    fired = m_watcher->fired;
    if (!fired) m_watcher->on_failure = std::move(on_failure);
  }
  if (fired) {
    const std::string why = failure();
    if (m_rank >= 0) set(seen_key(m_rank), {});  // rank 0 waits for every rank to have seen it
    fail("the group did not form: ", why.empty() ? std::string("a rank left the group") : why);
  }
}

void TcpStore::finish() noexcept {
  if (!m_watcher || m_watcher->quiet.exchange(true)) return;
  (void)send_frame(m_watch_fd, 'B', {}, {});
  ::shutdown(m_watch_fd, SHUT_RDWR);
  m_watcher->thread.join();
  close_fd(m_watch_fd);
}

void TcpStore::leave() noexcept {
  if (!m_watcher || m_watcher->quiet.exchange(true)) return;
  ::shutdown(m_watch_fd, SHUT_RDWR);
  m_watcher->thread.join();
  close_fd(m_watch_fd);
}

}  // namespace anatomy
