#include "train/signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

namespace anatomy {

namespace {

std::atomic<int> g_stop_signal{0};
std::mutex g_mu;
int g_users = 0;
struct sigaction g_old_int {}, g_old_term {};

std::atomic<int> g_seen_int{0}, g_seen_term{0};

// The first of each signal sets the flag; a second of the same one ends the process at once, as
// the default action would, but says so first (write, signal and raise are async-signal-safe).
// One SIGINT and one SIGTERM together stay a stop: torchrun answers a terminal's Ctrl-C, which
// its workers receive too, with a SIGTERM.
extern "C" void on_stop_signal(int sig) {
  std::atomic<int>& seen = sig == SIGINT ? g_seen_int : g_seen_term;
  if (seen.fetch_add(1) == 0) {
    g_stop_signal.store(sig);
    return;
  }
  static const char msg[] = "\nanatomy: a second signal: stopping now, without saving a checkpoint\n";
  [[maybe_unused]] const ssize_t n = ::write(2, msg, sizeof msg - 1);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

StopSignals::StopSignals() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_users++ > 0) return;
  g_stop_signal.store(0);
  g_seen_int.store(0);
  g_seen_term.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = 0;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

StopSignals::~StopSignals() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (--g_users > 0) return;
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

int StopSignals::pending() const { return g_stop_signal.load(); }

}  // namespace anatomy
