#include "dist/spawn.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace anatomy {

namespace {

volatile sig_atomic_t g_signal = 0, g_count = 0;  // the last SIGINT/SIGTERM this agent received, and how many
void on_signal(int sig) {
  g_signal = sig;
  g_count = g_count + 1;
}

int exit_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe(int status) {
  if (WIFSIGNALED(status)) return str_cat("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  return str_cat("exited with status ", exit_status(status));
}

}  // namespace

int run_ranks(int nproc_per_node, char** argv, const std::function<int(const LaunchEnv&)>& rank_main, bool spawn) {
  const LaunchEnv env = detect_launch();
  if (env.launched()) {
    ANATOMY_CHECK(nproc_per_node <= 1 || nproc_per_node == env.local_world_size, "--nproc-per-node ", nproc_per_node,
                  " disagrees with ", env.launcher, "'s ", env.local_world_size,
                  " processes on this node (leave the flag out under a launcher)");
    return rank_main(env);
  }
  if (nproc_per_node <= 1 || !spawn) return rank_main(env);
  SpawnOptions opt;
  opt.nproc = nproc_per_node;
  char self[4096] = {};
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
  opt.argv.push_back(len > 0 ? std::string(self, static_cast<size_t>(len)) : std::string("/proc/self/exe"));
  for (char** a = argv + 1; *a; ++a) opt.argv.emplace_back(*a);
  return spawn_local(opt);
}

int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ANATOMY_CHECK(fd >= 0, "--nproc-per-node: socket(): ", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  ANATOMY_CHECK(ok, "--nproc-per-node: no free port on 127.0.0.1: ", std::strerror(errno));
  return ntohs(a.sin_port);
}

int spawn_local(const SpawnOptions& opt) {
  ANATOMY_CHECK(opt.nproc >= 1, "--nproc-per-node must be at least 1 (got ", opt.nproc, ")");
  ANATOMY_CHECK(!opt.argv.empty(), "internal error: spawn_local without a command");
  const std::string port = std::to_string(free_local_port()), n = std::to_string(opt.nproc);
  std::vector<char*> args;
  for (const std::string& a : opt.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  // Signals arriving while the children start are kept for the loop below.
  struct sigaction sa {}, old_int{}, old_term{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  g_signal = 0;
  g_count = 0;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  std::fflush(nullptr);  // children must not print this process's buffered output again

  const pid_t agent = ::getpid();
  std::vector<pid_t> pids;
  for (int r = 0; r < opt.nproc; ++r) {
    const pid_t pid = ::fork();
    ANATOMY_CHECK(pid >= 0, "--nproc-per-node: fork(): ", std::strerror(errno));
    if (pid == 0) {
      // Its own process group: a terminal's Ctrl-C reaches the agent only, which forwards it
      // once; and it dies with the agent (a SIGKILLed agent leaves no orphans behind).
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != agent) ::_exit(128 + SIGTERM);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      const std::string rank = std::to_string(r);
      ::setenv("RANK", rank.c_str(), 1);
      ::setenv("LOCAL_RANK", rank.c_str(), 1);
      ::setenv("GROUP_RANK", "0", 1);
      ::setenv("WORLD_SIZE", n.c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", n.c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      ::unsetenv("TORCHELASTIC_USE_AGENT_STORE");  // no agent store here: rank 0 serves MASTER_PORT
      ::setenv("ANATOMY_NPROC_AGENT", "1", 1);      // LaunchEnv::by_anatomy
      ::execv(args[0], args.data());
      std::fprintf(stderr, "anatomy: --nproc-per-node: cannot run %s: %s\n", args[0], std::strerror(errno));
      ::_exit(127);
    }
    pids.push_back(pid);
  }

  int result = 0, running = opt.nproc, forwarded = 0;
  int ending = 0;  // after a failure: 1 waiting for the others to end by themselves, 2 after SIGTERM
  std::chrono::steady_clock::time_point next_at{};
  auto signal_all = [&](int sig) {
    for (pid_t p : pids)
      if (p > 0) ::kill(p, sig);
  };
  while (running > 0) {
    if (g_count != forwarded) {
      forwarded = g_count;
      signal_all(g_signal);  // the ranks save and stop together; their statuses decide ours
    }
    if (ending && std::chrono::steady_clock::now() >= next_at) {
      signal_all(ending == 1 ? SIGTERM : SIGKILL);
      next_at = std::chrono::steady_clock::now() + opt.grace;
      ending = ending == 1 ? 2 : 0;
    }
    bool reaped = false;
    for (size_t r = 0; r < pids.size(); ++r) {
      int status = 0;
      const pid_t pid = pids[r];
      if (pid <= 0 || ::waitpid(pid, &status, WNOHANG) != pid) continue;  // only our own children
      reaped = true;
      pids[r] = -1;
      --running;
      if (exit_status(status) != 0 && result == 0) {
        result = exit_status(status);
        if (running > 0) {
          std::fprintf(stderr, "anatomy: rank %zu (pid %d) %s; ending the other %d rank%s\n", r, pid,
                       describe(status).c_str(), running, running == 1 ? "" : "s");
          // The group's failure watch ends the others within moments, each printing its error
          // (the one that failed first among them); SIGTERM only those that do not.
          ending = 1;
          next_at = std::chrono::steady_clock::now() + opt.settle;
        }
      }
    }
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  return result;
}

}  // namespace anatomy
