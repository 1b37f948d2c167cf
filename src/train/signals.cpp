#include "train/signals.h"

#include <signal.h>

#include <atomic>
#include <mutex>

namespace anatomy {

namespace {

std::atomic<int> g_stop_signal{0};
std::mutex g_mu;
int g_users = 0;
struct sigaction g_old_int {}, g_old_term {};

extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

}  // namespace

StopSignals::StopSignals() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_users++ > 0) return;
  g_stop_signal.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESETHAND;
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
