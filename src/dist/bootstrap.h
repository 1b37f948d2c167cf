// The start-up rendezvous of a multi-process group: a tiny key-value store over TCP, served by
// rank 0 on MASTER_ADDR:port, through which the ranks swap what their engine needs to connect
// (NCCL's unique id; Gloo's transport addresses). It also watches the group: Note [failure watch].
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace anatomy {

class StoreServer;

// "host pid N": this process, as the store's messages name a rank's process.
std::string this_process();

class TcpStore {
 public:
  // Rank 0 (serve = true) listens on every interface at `port`, then every rank connects to
  // host:port, retrying until `timeout` (the server may start after its clients).
  TcpStore(const std::string& host, int port, bool serve, std::chrono::milliseconds timeout);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  // This process is `rank` of the group of `world`: the first to say so holds it (a second
  // process with the same rank fails at once, naming both, instead of waiting out the
  // rendezvous); returns once every rank has joined. A member's waits end at once with the error
  // of a rank that failed before the group formed (fail_group).
  void join(int rank, int world);
  // Note [failure before the group] (dist/launch.cpp): rank `rank` of the job will not join;
  // every member waiting in the rendezvous ends with `message`. await_failure_seen waits (up to
  // the timeout) until every other rank of `world` has seen it, or failed itself.
  void fail_group(int rank, const std::string& message);
  void await_failure_seen(int world);
  // How long rank 0's store stays up to tell the others of a failure before the group.
  static constexpr std::chrono::seconds kTellFailureFor{30};
  void set(const std::string& key, const std::vector<char>& value);
  // The value of key, once some rank has set it; throws naming the address after the timeout.
  std::vector<char> get(const std::string& key);
  void wait(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  // Note [failure watch]: a thread (started by join) calls on_failure once when any rank of the
  // group leaves without finish() (it died, or it called leave()), or rank 0's server goes away.
  // Throws, naming the lost rank, when that happened before this call.
  void watch(std::function<void()> on_failure);
  // What the group's first failure said (a rank lost, or one that failed before joining: the
  // store's record); empty: none.
  std::string failure();
  // This rank ends normally: later departures of others are not failures for this rank.
  void finish() noexcept;
  // This rank fails: the others' watches fire.
  void leave() noexcept;

  std::string address() const { return m_host + ":" + std::to_string(m_port); }

 private:
  void request(char op, const std::string& key, const std::vector<char>& value, char& reply, std::vector<char>& out);
  // wait(), heeding a failure before the group when `heed_failure` (a member's waits do).
  void wait_for(const std::vector<std::string>& keys, std::chrono::milliseconds timeout, bool heed_failure);
  [[noreturn]] void refuse_second_rank_zero(const std::string& listen_error);
  void open_watch();  // the watch connection and its thread (join's)

  std::string m_host;
  int m_port;
  std::chrono::milliseconds m_timeout;
  std::unique_ptr<StoreServer> m_server;  // rank 0 only
  int m_rank = -1, m_world = 0;           // join()'s; rank -1: not a member (it only reports a failure)
  int m_fd = -1;                          // requests
  int m_watch_fd = -1;                    // Note [failure watch]
  struct Watcher;
  std::unique_ptr<Watcher> m_watcher;
};

}  // namespace anatomy
