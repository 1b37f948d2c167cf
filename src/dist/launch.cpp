#include "dist/launch.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "dist/bootstrap.h"
#include "dist/gloo_group.h"
#include "ops/backend.h"

extern char** environ;

namespace anatomy {

namespace {

using Env = std::map<std::string, std::string>;

const std::string* find(const Env& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

int int_var(const Env& env, const std::string& name, int lo, const std::string& why = "") {
  const std::string* v = find(env, name);
  ANATOMY_CHECK(v, name, " is not set", why.empty() ? "" : " (", why, why.empty() ? "" : ")");
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v->c_str(), &end, 10);
  ANATOMY_CHECK(!v->empty() && *end == '\0' && errno == 0 && x >= lo && x <= 1 << 30, name, "=", *v,
                ": expected a whole number from ", lo, " to ", 1 << 30);
  return static_cast<int>(x);
}

int int_var_or(const Env& env, const std::string& name, int lo, int fallback) {
  return find(env, name) ? int_var(env, name, lo) : fallback;
}

// The first host of a Slurm node list: "gpu[07-09,12],cpu1" -> "gpu07".
std::string first_slurm_host(const std::string& list) {
  std::string out;
  for (size_t i = 0; i < list.size(); ++i) {
    const char c = list[i];
    if (c == ',') break;
    if (c != '[') {
      out += c;
      continue;
    }
    const size_t close = list.find(']', i);
    ANATOMY_CHECK(close != std::string::npos, "SLURM_JOB_NODELIST=", list, ": unbalanced '['");
    out += list.substr(i + 1, list.find_first_of("-,]", i + 1) - i - 1);
    i = close;
  }
  return out;
}

void check_rank(const LaunchEnv& e, const char* rank_var, const char* size_var, const char* local_var) {
  ANATOMY_CHECK(e.rank < e.world_size, rank_var, "=", e.rank, " is not below ", size_var, "=", e.world_size);
  ANATOMY_CHECK(e.local_rank < e.local_world_size, local_var, "=", e.local_rank, " is not below the ",
                e.local_world_size, " processes of this node");
  ANATOMY_CHECK(e.local_world_size <= e.world_size, "this node's ", e.local_world_size, " processes exceed ", size_var,
                "=", e.world_size);
}

// Variables of another launch left in the environment (a shell started by torchrun, a pod that
// sets RANK and WORLD_SIZE) would make each of N processes a world of one, training alone, and
// all writing the same files: refused when the chosen launcher's world is one while another
// launcher's variables say more (mpirun within a one-task srun step has a larger world: kept).
void refuse_stale_launch(const Env& env, const LaunchEnv& e) {
  if (e.world_size != 1) return;
  const std::pair<const char*, const char*> sizes[] = {
      {"torchrun", "WORLD_SIZE"}, {"mpirun", "OMPI_COMM_WORLD_SIZE"}, {"srun", "SLURM_STEP_NUM_TASKS"}};
  for (const auto& [launcher, var] : sizes) {
    const std::string* v = find(env, var);
    if (launcher == e.launcher || !v || std::atoi(v->c_str()) <= 1) continue;
    fail(e.launcher, "'s variables say a world of 1 but ", var, "=", *v, " (", launcher,
         "'s) says more: variables of an earlier launch are left in the environment; unset the ", e.launcher,
         " ones (", e.launcher == "torchrun" ? "RANK, WORLD_SIZE" : e.launcher == "mpirun" ? "OMPI_COMM_WORLD_*" : "SLURM_*",
         ") or launch with ", launcher, " alone (ANATOMY_LAUNCHER=", e.launcher, " takes ", e.launcher,
         "'s variables alone)");
  }
}

}  // namespace

LaunchEnv detect_launch(const Env& env) {
  LaunchEnv e;
  const std::string addr_hint = "set it to rank 0's host name or address on every rank";
  // ANATOMY_LAUNCHER names the launcher whose variables to read, the others' ignored (torchrun
  // --standalone per task of a multi-task srun step, say); unset, the first present wins.
  const std::string* forced = find(env, "ANATOMY_LAUNCHER");
  ANATOMY_CHECK(!forced || *forced == "torchrun" || *forced == "mpirun" || *forced == "srun" || *forced == "none",
                "ANATOMY_LAUNCHER=", forced ? *forced : "", ": expected torchrun, mpirun, srun or none");
  auto take = [&](const char* launcher, bool present) { return forced ? *forced == launcher : present; };
  if (forced && *forced == "none") return e;
  e.by_anatomy = find(env, "ANATOMY_NPROC_AGENT") != nullptr;
  e.torchrun_agent = find(env, "TORCHELASTIC_RUN_ID") != nullptr;
  if (take("torchrun", find(env, "RANK") || find(env, "WORLD_SIZE"))) {
    e.launcher = "torchrun";
    e.rank = int_var(env, "RANK", 0, "torchrun sets it with WORLD_SIZE");
    e.world_size = int_var(env, "WORLD_SIZE", 1, "torchrun sets it with RANK");
    e.local_rank = int_var(env, "LOCAL_RANK", 0, "torchrun sets it with RANK");
    e.local_world_size = int_var_or(env, "LOCAL_WORLD_SIZE", 1, e.world_size);
    check_rank(e, "RANK", "WORLD_SIZE", "LOCAL_RANK");
  } else if (take("mpirun", find(env, "OMPI_COMM_WORLD_RANK"))) {
    e.launcher = "mpirun";
    e.rank = int_var(env, "OMPI_COMM_WORLD_RANK", 0);
    e.world_size = int_var(env, "OMPI_COMM_WORLD_SIZE", 1, "mpirun sets it with OMPI_COMM_WORLD_RANK");
    e.local_rank = int_var_or(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0, 0);
    e.local_world_size = int_var_or(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, e.world_size);
    check_rank(e, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK");
  } else if (take("srun", find(env, "SLURM_PROCID") && find(env, "SLURM_STEP_NUM_TASKS"))) {
    // srun sets SLURM_STEP_NUM_TASKS for the tasks of its step; a batch script run without srun
    // has SLURM_PROCID=0 and the allocation's SLURM_NTASKS but no step: a group of one.
    e.launcher = "srun";
    e.rank = int_var(env, "SLURM_PROCID", 0);
    const char* size_var = "SLURM_STEP_NUM_TASKS";
    e.world_size = int_var(env, size_var, 1);
    e.local_rank = int_var_or(env, "SLURM_LOCALID", 0, 0);
    e.local_world_size = e.world_size;
    if (const std::string* t = find(env, "SLURM_STEP_TASKS_PER_NODE"); t && !t->empty())
      e.local_world_size = std::max(1, std::atoi(t->c_str()));  // "4(x2)": 4 per node, the first node's count
    check_rank(e, "SLURM_PROCID", size_var, "SLURM_LOCALID");
  } else {
    return e;  // not launched: a group of one, no rendezvous
  }
  if (!forced) refuse_stale_launch(env, e);
  if (e.world_size == 1) return LaunchEnv{};  // a group of one needs no rendezvous (nor MASTER_ADDR)

  if (const std::string* a = find(env, "MASTER_ADDR"); a && !a->empty()) {
    e.master_addr = *a;
  } else if (e.launcher == "srun") {
    const std::string* list = find(env, "SLURM_JOB_NODELIST") ? find(env, "SLURM_JOB_NODELIST") : find(env, "SLURM_NODELIST");
    ANATOMY_CHECK(list && !list->empty(), "MASTER_ADDR is not set and neither is SLURM_JOB_NODELIST (", addr_hint, ")");
    e.master_addr = first_slurm_host(*list);
  } else {
    fail("MASTER_ADDR is not set (", e.launcher, " rank ", e.rank, " needs rank 0's address: ", addr_hint,
         e.launcher == "mpirun" ? ", e.g. mpirun -x MASTER_ADDR=host -x MASTER_PORT=29500)" : ")");
  }
  // srun without MASTER_PORT: a port every task of the step derives alike (Note [bootstrap port]);
  // the step id too, so that steps of one job run side by side (a sweep) do not meet.
  if (e.launcher == "srun" && !find(env, "MASTER_PORT"))
    e.master_port = 20000 + static_cast<int>((int_var_or(env, "SLURM_JOB_ID", 0, 0) % 10000 +
                                              int64_t{7919} * int_var_or(env, "SLURM_STEP_ID", 0, 0)) % 10000);
  else
    e.master_port = int_var(env, "MASTER_PORT", 1, "rank 0's port, the same on every rank");
  ANATOMY_CHECK(e.master_port <= 65535, "MASTER_PORT=", e.master_port, " is not a TCP port");

  // Note [bootstrap port]: rank 0's store listens on MASTER_PORT, except under torchrun's own
  // store (TORCHELASTIC_USE_AGENT_STORE=True: its agent already listens there), where it takes
  // the next port; ANATOMY_BOOTSTRAP_PORT overrides both.
  const std::string* agent = find(env, "TORCHELASTIC_USE_AGENT_STORE");
  e.bootstrap_port = e.master_port + (agent && (*agent == "True" || *agent == "1") ? 1 : 0);
  e.bootstrap_port = int_var_or(env, "ANATOMY_BOOTSTRAP_PORT", 1, e.bootstrap_port);
  ANATOMY_CHECK(e.bootstrap_port <= 65535, "ANATOMY_BOOTSTRAP_PORT=", e.bootstrap_port, " is not a TCP port");
  e.timeout = std::chrono::seconds(int_var_or(env, "ANATOMY_DIST_TIMEOUT", 1, 300));
  return e;
}

LaunchEnv detect_launch() {
  Env env;
  for (char** p = environ; *p; ++p) {
    const std::string kv = *p;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return detect_launch(env);
}

// Note [failure before the group]
// mpirun, anatomy's spawner and torchrun's agent on one node end every process of a job when one
// exits with an error; srun does not (unless told --kill-on-bad-exit), nor do the agents of a
// torchrun job over several nodes for the other nodes. A rank that failed before its group formed
// (a flag or file its node refuses, a missing GPU) left the others waiting in the rendezvous for
// the timeout (ANATOMY_DIST_TIMEOUT, 300 s). Now, under srun and torchrun, it puts its error in
// the bootstrap store, where each member's rendezvous wait finds it at its next poll
// (dist/bootstrap.cpp) and ends with it. A failing rank 0 has no store yet, so it serves one for
// that, until every rank has seen the error or failed too. Each waits TcpStore::kTellFailureFor at most,
// so a process started by hand with a launcher's variables and no others still ends soon. Failures
// inside the rendezvous are not told (a duplicate rank must not end the group it could not join);
// after it, Note [failure watch] ends the group.
void tell_group_of_failure(const LaunchEnv& env, const std::string& error) noexcept {
  const bool others_wait = env.launcher == "srun" || (env.launcher == "torchrun" && env.torchrun_agent);
  if (!others_wait || env.by_anatomy || env.world_size < 2) return;
  try {
    const auto bound = std::min<std::chrono::milliseconds>(env.timeout, TcpStore::kTellFailureFor);
    TcpStore store(env.master_addr, env.bootstrap_port, env.rank == 0, bound);
    store.fail_group(env.rank, str_cat("rank ", env.rank, " (", this_process(), ") failed before the group formed: ", error));
    if (env.rank == 0) store.await_failure_seen(env.world_size);
  } catch (const std::exception&) {  // no store to tell (rank 0 gone, its port taken): the timeout, as before
  }
}

std::unique_ptr<Communicator> make_process_group(const LaunchEnv& env, Backend& backend) {
  if (backend.device() == Device::CUDA) return make_nccl_process_group(env, backend);
  return make_gloo_group(env);
}

}  // namespace anatomy
