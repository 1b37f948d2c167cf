// Real process groups on the CPU: 2 and 3 processes of tests/dist/pg_worker.cpp, started by the
// spawner (dist/spawn.h) or by hand with torchrun's environment, run every collective over Gloo
// and must hold bitwise what the in-process group holds; a rank that fails or is killed ends the
// others within seconds.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "../common/dirs.h"
#include "core/error.h"
#include "dist/bootstrap.h"
#include "dist/spawn.h"
#include "ops/backend.h"
#include "../dist/pg_script.h"

extern char** environ;

namespace anatomy {
namespace {

using Clock = std::chrono::steady_clock;

// What each thread of an in-process group of `world` holds after the script.
std::vector<std::vector<char>> expected(int world) {
  auto group = make_local_group(world);
  std::vector<std::vector<char>> out(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      auto be = make_cpu_backend(1);
      out[static_cast<size_t>(r)] = pg_test::run_script(*group[static_cast<size_t>(r)], *be);
    });
  for (auto& t : threads) t.join();
  return out;
}

std::vector<char> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void expect_script_results(const std::string& dir, int world) {
  const auto want = expected(world);
  for (int r = 0; r < world; ++r) {
    const std::vector<char> got = read_all(dir + "/rank" + std::to_string(r) + ".bin");
    const std::vector<char>& w = want[static_cast<size_t>(r)];
    ASSERT_EQ(got.size(), w.size()) << "rank " << r;
    const auto diff = std::mismatch(got.begin(), got.end(), w.begin());
    EXPECT_TRUE(diff.first == got.end()) << "rank " << r << ": first differing byte at " << (diff.first - got.begin());
  }
}

// Runs spawn_local with this process's stderr sent to a file; returns (status, that output).
std::pair<int, std::string> spawn_capturing(const SpawnOptions& opt, const std::string& log) {
  std::fflush(stderr);
  const int saved = ::dup(2), fd = ::open(log.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  ::dup2(fd, 2);
  ::close(fd);
  const int rc = spawn_local(opt);
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  const std::vector<char> text = read_all(log);
  return {rc, std::string(text.begin(), text.end())};
}

// One process with torchrun's variables for rank r of world, its stderr to `log`.
// A process of `args` with this environment and `vars` (theirs win), stderr into `log`.
pid_t start_process(const std::vector<std::string>& args, const std::map<std::string, std::string>& vars,
                    const std::string& log) {
  std::vector<std::string> env;
  for (char** p = environ; *p; ++p) {
    const std::string kv = *p;
    if (!vars.count(kv.substr(0, kv.find('=')))) env.push_back(kv);
  }
  for (const auto& [k, v] : vars) env.push_back(k + "=" + v);
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  argv.push_back(nullptr);
  envp.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    ::dup2(fd, 2);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

// Rank r of `world` with torchrun's variables (as set by hand: no agent), plus `extra`.
pid_t start_rank(const std::vector<std::string>& args, int r, int world, int port, const std::string& log,
                 std::map<std::string, std::string> extra = {}) {
  for (const auto& [k, v] : std::map<std::string, std::string>{{"RANK", std::to_string(r)},
                                                                {"LOCAL_RANK", std::to_string(r)},
                                                                {"WORLD_SIZE", std::to_string(world)},
                                                                {"LOCAL_WORLD_SIZE", std::to_string(world)},
                                                                {"MASTER_ADDR", "127.0.0.1"},
                                                                {"MASTER_PORT", std::to_string(port)},
                                                                {"ANATOMY_DIST_TIMEOUT", "60"}})
    extra.emplace(k, v);
  return start_process(args, extra, log);
}

// Task r of an srun step of `world` tasks on one node.
pid_t start_srun_task(const std::vector<std::string>& args, int r, int world, int port, const std::string& log) {
  return start_process(args,
                       {{"SLURM_PROCID", std::to_string(r)}, {"SLURM_LOCALID", std::to_string(r)},
                        {"SLURM_STEP_NUM_TASKS", std::to_string(world)},
                        {"SLURM_STEP_TASKS_PER_NODE", std::to_string(world)}, {"MASTER_ADDR", "127.0.0.1"},
                        {"MASTER_PORT", std::to_string(port)}, {"ANATOMY_DIST_TIMEOUT", "60"}},
                       log);
}

std::string slurp(const std::string& path) {
  const std::vector<char> t = read_all(path);
  return std::string(t.begin(), t.end());
}

class ProcessGroupSpawn : public ::testing::TestWithParam<int> {};

TEST_P(ProcessGroupSpawn, CollectivesMatchTheInProcessGroupBitwise) {
  const int world = GetParam();
  const std::string dir = testing_dirs::fresh_dir("pg_spawn_" + std::to_string(world));
  SpawnOptions opt;
  opt.nproc = world;
  opt.argv = {ANATOMY_PG_WORKER, "script", dir};
  const auto [rc, log] = spawn_capturing(opt, dir + "/stderr.txt");
  ASSERT_EQ(rc, 0) << log;
  expect_script_results(dir, world);
}

TEST_P(ProcessGroupSpawn, AFailingRankEndsTheOthersWithItsStatusAndError) {
  const int world = GetParam();
  const std::string dir = testing_dirs::fresh_dir("pg_fail_" + std::to_string(world));
  SpawnOptions opt;
  opt.nproc = world;
  opt.argv = {ANATOMY_PG_WORKER, "fail", std::to_string(world - 1)};
  const auto t0 = Clock::now();
  const auto [rc, log] = spawn_capturing(opt, dir + "/stderr.txt");
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(rc, 2) << log;
  EXPECT_LT(secs, 15.0) << log;
  EXPECT_NE(log.find("pg_worker: error: rank " + std::to_string(world - 1) + " fails on purpose"), std::string::npos) << log;
  // The first rank the spawner sees end (the failing one, or a peer that lost it) is named.
  EXPECT_NE(log.find("exited with status 2; ending the other"), std::string::npos) << log;
}

INSTANTIATE_TEST_SUITE_P(Worlds, ProcessGroupSpawn, ::testing::Values(2, 3));

// Its peers name the failed rank, from rank 0's store (Note [failure watch]); they said "lost its
// peers (another rank failed, or 60 s passed)" with Gloo's socket error. Started without a
// spawner, which would end them first.
TEST(ProcessGroupFail, ThePeersNameTheRankThatLeft) {
  const std::string dir = testing_dirs::fresh_dir("pg_fail_named");
  const int port = free_local_port();
  std::vector<pid_t> pids;
  for (int r : {0, 1}) pids.push_back(start_rank({ANATOMY_PG_WORKER, "fail", "1"}, r, 2, port, dir + "/log" + std::to_string(r)));
  for (pid_t p : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(p, &status, 0), p);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2);
  }
  const std::string log = slurp(dir + "/log0");
  EXPECT_NE(log.find("rank 1 ("), std::string::npos) << log;
  EXPECT_NE(log.find("left the group without a goodbye (it failed or was killed: its own log has the cause)"),
            std::string::npos)
      << log;
}

// A rank lost after the join, before its engine connected (killed; here it exits without a
// goodbye to the store): the other waited in NCCL's init for ever, and under Gloo ended saying it
// had lost rank 0's store (its own, which had closed it on seeing the failure). The failure watch
// now starts at the join and ends it within seconds naming the lost rank (Note [non-blocking
// NCCL] in dist/nccl_group.cpp, Note [failure watch] in dist/bootstrap.cpp). The CUDA case needs
// one device: the lost rank never touches one.
class RankLostAfterJoin : public ::testing::TestWithParam<std::string> {};

TEST_P(RankLostAfterJoin, TheOtherEndsWithinSeconds) {
  const bool cuda = GetParam() == "cuda";
  if (cuda && cuda_device_count() < 1) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing_dirs::fresh_dir("pg_lost_after_join_" + GetParam());
  const int port = free_local_port();
  const std::map<std::string, std::string> device = {{"ANATOMY_PG_DEVICE", GetParam()}};
  const auto t0 = Clock::now();
  const pid_t lost = start_rank({ANATOMY_PG_WORKER, "vanish", "1"}, 1, 2, port, dir + "/log1", device);
  const pid_t kept = start_rank({ANATOMY_PG_WORKER, "vanish", "1"}, 0, 2, port, dir + "/log0", device);
  int status = 0;
  ASSERT_EQ(::waitpid(lost, &status, 0), lost);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << slurp(dir + "/log1");
  ASSERT_EQ(::waitpid(kept, &status, 0), kept);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string log = slurp(dir + "/log0");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << log;
  EXPECT_LT(secs, 20.0) << log;  // ANATOMY_DIST_TIMEOUT is 60 s here
  EXPECT_NE(log.find(str_cat(cuda ? "nccl: the group of 2 did not form: " : "the group did not form: ", "rank 1 (")),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("left the group without a goodbye"), std::string::npos) << log;
  std::printf("[lost after join] %s: rank 0 ended after %.1f s\n", GetParam().c_str(), secs);
}

INSTANTIATE_TEST_SUITE_P(Engines, RankLostAfterJoin, ::testing::Values("cpu", "cuda"));

// Three ranks: rank 1 joins and is killed while the group waits for rank 2, which starts after
// (a review's case). Nobody watched rank 1 yet, and ranks 0 and 2 waited out the timeout in Gloo's
// rendezvous ("'1' never appeared ... a rank did not start"); now both end within seconds naming it.
TEST(RankLostAfterJoin, WhileTheGroupWaitsForALateRank) {
  const std::string dir = testing_dirs::fresh_dir("pg_lost_while_forming");
  const int port = free_local_port();
  const auto t0 = Clock::now();
  const pid_t r0 = start_rank({ANATOMY_PG_WORKER, "script", dir}, 0, 3, port, dir + "/log0");
  const pid_t r1 = start_rank({ANATOMY_PG_WORKER, "script", dir}, 1, 3, port, dir + "/log1");
  {  // rank 1 has joined (its key is in rank 0's store) and waits for rank 2
    TcpStore look("127.0.0.1", port, false, std::chrono::seconds(30));
    look.wait({"anatomy/joined/1"});
  }
  ASSERT_EQ(::kill(r1, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(r1, &status, 0), r1);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const pid_t r2 = start_rank({ANATOMY_PG_WORKER, "script", dir}, 2, 3, port, dir + "/log2");
  for (auto [pid, r] : {std::pair{r0, 0}, std::pair{r2, 2}}) {
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    const std::string log = slurp(dir + "/log" + std::to_string(r));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << "rank " << r << ": " << log;
    EXPECT_NE(log.find("the group did not form: rank 1 ("), std::string::npos) << "rank " << r << ": " << log;
    EXPECT_NE(log.find("left the group without a goodbye"), std::string::npos) << "rank " << r << ": " << log;
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(secs, 20.0);  // ANATOMY_DIST_TIMEOUT is 60 s here
  std::printf("[lost while forming] ranks 0 and 2 ended after %.1f s\n", secs);
}

// Rank 0 working alone (predicting, writing a checkpoint) for longer than ANATOMY_DIST_TIMEOUT:
// the others wait for it in wait_for_all, which a rank's failure ends, not the timeout; a plain
// barrier ends at the timeout (3 s here, rank 0 alone for 6.5 s; rank 0 starts first, since the
// timeout bounds the join too). The trainer waits so for rank 0 working alone: a CPU prediction
// longer than the timeout failed the run at its end.
TEST(ProcessGroupWaits, ForARankWorkingAloneAsLongAsItTakes) {
  for (const std::string how : {"wait_for_all", "barrier"}) {
    SCOPED_TRACE(how);
    const std::string dir = testing_dirs::fresh_dir("pg_late_lead_" + how);
    const int port = free_local_port();
    std::vector<pid_t> pids;
    for (int r : {0, 1})
      pids.push_back(start_rank({ANATOMY_PG_WORKER, "late-lead", how}, r, 2, port, dir + "/log" + std::to_string(r),
                                {{"ANATOMY_DIST_TIMEOUT", "3"}}));
    for (size_t i : {1, 0}) {
      int status = 0;
      ASSERT_EQ(::waitpid(pids[i], &status, 0), pids[i]);
      const std::string after = slurp(dir + "/log" + std::to_string(i));
      if (how == "wait_for_all") {
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << after;
        EXPECT_NE(after.find("met the others"), std::string::npos) << after;
      } else if (i == 1) {  // rank 1, waiting: the timeout ends it
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << after;
        EXPECT_NE(after.find("gloo barrier"), std::string::npos) << after;
      }
    }
  }
}

class ProcessGroupTorchrunEnv : public ::testing::TestWithParam<int> {};

TEST_P(ProcessGroupTorchrunEnv, CollectivesMatchTheInProcessGroupBitwise) {
  const int world = GetParam();
  const std::string dir = testing_dirs::fresh_dir("pg_env_" + std::to_string(world));
  const int port = free_local_port();
  std::vector<pid_t> pids;
  for (int r = world - 1; r >= 0; --r)  // rank 0 last: the others wait for its store
    pids.push_back(start_rank({ANATOMY_PG_WORKER, "script", dir}, r, world, port, dir + "/log" + std::to_string(r)));
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    ASSERT_EQ(::waitpid(pids[i], &status, 0), pids[i]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << slurp(dir + "/log" + std::to_string(world - 1 - i));
  }
  expect_script_results(dir, world);
}

// Three processes for a world of two, two of them rank 1 (a launcher's variables set twice): the
// rank 1 that claims its place second fails at once naming the first, and the group of the other
// two is not disturbed (the extra waited out the rendezvous timeout, or took a place in it). The
// group stalls inside a collective (pg_worker stall) while the extra comes, so that it always
// finds the store up.
TEST(ProcessGroupTorchrunEnvDuplicate, ASecondProcessOfOneRankFailsAtOnceNamingTheFirst) {
  const std::string dir = testing_dirs::fresh_dir("pg_duplicate_rank");
  const int port = free_local_port();
  const std::string ready = dir + "/ready";
  std::vector<pid_t> group;
  for (int r : {1, 0}) group.push_back(start_rank({ANATOMY_PG_WORKER, "stall", ready}, r, 2, port, dir + "/log" + std::to_string(r)));
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (!std::filesystem::exists(ready) && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(std::filesystem::exists(ready));
  const auto t0 = Clock::now();
  const pid_t extra = start_rank({ANATOMY_PG_WORKER, "script", dir}, 1, 2, port, dir + "/log1b");
  int status = 0;
  ASSERT_EQ(::waitpid(extra, &status, 0), extra);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
  const std::string log = slurp(dir + "/log1b");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << log;
  EXPECT_NE(log.find("rank 1 is already a process of this group"), std::string::npos) << log;
  for (pid_t p : group) {
    EXPECT_EQ(::waitpid(p, &status, WNOHANG), 0) << "the group was disturbed: " << slurp(dir + "/log0") << slurp(dir + "/log1");
    ::kill(p, SIGKILL);
    ::waitpid(p, &status, 0);
  }
}

// A second process started as rank 0 cannot listen on the port the first serves: it says that a
// rank 0 already holds the group (naming it), not "set MASTER_PORT to a free port"; the group of
// the first rank 0 and rank 1 works.
TEST(ProcessGroupTorchrunEnvDuplicate, ASecondRankZeroIsToldTheFirstHoldsThePort) {
  const std::string dir = testing_dirs::fresh_dir("pg_duplicate_rank0");
  const int port = free_local_port();
  const pid_t first = start_rank({ANATOMY_PG_WORKER, "script", dir}, 0, 2, port, dir + "/log0a");
  // Its store is up (a connection is accepted), then its place claimed (the claim follows at once).
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  for (bool up = false; !up && Clock::now() < deadline;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    up = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const pid_t second = start_rank({ANATOMY_PG_WORKER, "script", dir}, 0, 2, port, dir + "/log0b");
  int status = 0;
  ASSERT_EQ(::waitpid(second, &status, 0), second);
  const std::string log = slurp(dir + "/log0b");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << log;
  EXPECT_NE(log.find("rank 0 is already a process of a group at 127.0.0.1:"), std::string::npos) << log;
  EXPECT_EQ(log.find("to a free port"), std::string::npos) << log;
  const pid_t one = start_rank({ANATOMY_PG_WORKER, "script", dir}, 1, 2, port, dir + "/log1");
  for (pid_t p : {first, one}) {
    ASSERT_EQ(::waitpid(p, &status, 0), p);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << slurp(dir + "/log0a") << slurp(dir + "/log1");
  }
  expect_script_results(dir, 2);
}

// The last rank is killed (SIGKILL: no goodbye, no error of its own) while the others wait for
// it inside a collective: they must fail within seconds, each saying so.
TEST_P(ProcessGroupTorchrunEnv, KillingOneProcessEndsTheOthersWithinSeconds) {
  const int world = GetParam();
  const std::string dir = testing_dirs::fresh_dir("pg_kill_" + std::to_string(world));
  const int port = free_local_port();
  const std::string ready = dir + "/ready";
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r)
    pids.push_back(start_rank({ANATOMY_PG_WORKER, "stall", ready}, r, world, port, dir + "/log" + std::to_string(r)));
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (!std::filesystem::exists(ready) && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(std::filesystem::exists(ready));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the others are inside the collective
  ::kill(pids.back(), SIGKILL);
  const auto t0 = Clock::now();
  for (int r = 0; r < world; ++r) {
    int status = 0;
    ASSERT_EQ(::waitpid(pids[static_cast<size_t>(r)], &status, 0), pids[static_cast<size_t>(r)]);
    if (r == world - 1) {
      EXPECT_TRUE(WIFSIGNALED(status));
      continue;
    }
    const std::string log = slurp(dir + "/log" + std::to_string(r));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << log;
    EXPECT_NE(log.find("pg_worker: error: gloo "), std::string::npos) << log;
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
}

INSTANTIATE_TEST_SUITE_P(Worlds, ProcessGroupTorchrunEnv, ::testing::Values(2, 3));

// Note [ranks agree]: ranks started with different flags (here the batch) end at start-up, each
// naming the flag and its own value, instead of training on silently or waiting on each other.
TEST(TrainRanks, DifferentFlagsEndEveryRankNamingThem) {
  const std::string dir = testing_dirs::fresh_dir("train_ranks_differ");
  const int port = free_local_port();
  std::vector<pid_t> pids;
  for (int r = 1; r >= 0; --r)
    pids.push_back(start_rank({ANATOMY_BINARY, "train", "--device", "cpu", "--threads", "1", "--disable-tqdm", "--preset",
                               "bert-tiny", "--num-samples", "32", "--seq-len", "16", "--max-steps", "2", "--output-dir",
                               dir + "/out", "--per-device-train-batch-size", r == 0 ? "4" : "2", "--learning-rate",
                               r == 0 ? "5e-5" : "1e-4"},
                              r, 2, port, dir + "/log" + std::to_string(r)));
  for (size_t i = 0; i < pids.size(); ++i) {
    const int r = 1 - static_cast<int>(i);
    int status = 0;
    ASSERT_EQ(::waitpid(pids[i], &status, 0), pids[i]);
    const std::string log = slurp(dir + "/log" + std::to_string(r));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << log;
    EXPECT_NE(log.find("anatomy: error: the ranks were started with different flags: "), std::string::npos) << log;
    EXPECT_NE(log.find(anatomy::str_cat("--per-device-train-batch-size (rank ", r, ": ", r == 0 ? 4 : 2, ")")),
              std::string::npos)
        << log;
    // As given, not as a float widened to a double (4.999999873689376e-05).
    EXPECT_NE(log.find(anatomy::str_cat("--learning-rate (rank ", r, ": ", r == 0 ? "5e-05" : "0.0001", ")")),
              std::string::npos)
        << log;
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/out/train_results.json"));
}

// The values named are the flags' own spellings: the default --save-strategy is "final" (a model
// at the end, no checkpoints), not "no" (the message said rank 0's "no" against rank 1's "no").
TEST(TrainRanks, DifferentSaveStrategiesAreNamedAsTheFlagSpellsThem) {
  const std::string dir = testing_dirs::fresh_dir("train_ranks_save_differ");
  const int port = free_local_port();
  std::vector<pid_t> pids;
  for (int r = 1; r >= 0; --r) {
    std::vector<std::string> args = {ANATOMY_BINARY, "train", "--device", "cpu", "--threads", "1", "--disable-tqdm",
                                     "--preset", "bert-tiny", "--num-samples", "32", "--seq-len", "16", "--max-steps",
                                     "2", "--output-dir", dir + "/out"};
    if (r == 1) args.insert(args.end(), {"--save-strategy", "no"});
    pids.push_back(start_rank(args, r, 2, port, dir + "/log" + std::to_string(r)));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    const int r = 1 - static_cast<int>(i);
    int status = 0;
    ASSERT_EQ(::waitpid(pids[i], &status, 0), pids[i]);
    const std::string log = slurp(dir + "/log" + std::to_string(r));
    EXPECT_NE(log.find(str_cat("--save-strategy (rank ", r, ": \"", r == 0 ? "final" : "no", "\")")), std::string::npos)
        << log;
  }
}

// A rank killed while rank 0 predicts alone (--do-predict) ends the job before the run is marked
// finished: rank 0 fails at the barrier before train_results.json (it wrote it, and its summary).
TEST(TrainRanks, ARankLostDuringPredictionLeavesTheRunUnfinished) {
  const std::string dir = testing_dirs::fresh_dir("train_ranks_predict_kill");
  const std::string data = std::string(ANATOMY_SOURCE_DIR) + "/tests/data/text/sentiment.jsonl";
  {
    std::ifstream in(data);
    const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream train(dir + "/train.jsonl"), big(dir + "/test.jsonl");
    train << all;
    for (int i = 0; i < 100; ++i) big << all;  // 19700 sentences: seconds of prediction
  }
  const int port = free_local_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r)
    pids.push_back(start_rank({ANATOMY_BINARY, "train", "--device", "cpu", "--threads", "1", "--disable-tqdm", "--preset",
                               "bert-tiny", "--tokenizer", std::string(ANATOMY_SOURCE_DIR) + "/tests/data/tokenizer",
                               "--train-file", dir + "/train.jsonl", "--validation-file", dir + "/train.jsonl",
                               "--max-seq-length", "32", "--max-steps", "2", "--do-predict", "--test-file",
                               dir + "/test.jsonl", "--output-dir", dir + "/out"},
                              r, 2, port, dir + "/log" + std::to_string(r)));
  // The end's evaluation is logged once the model is saved; prediction follows it on rank 0.
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (slurp(dir + "/out/metrics.jsonl").find("eval_loss") == std::string::npos && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_LT(Clock::now(), deadline) << slurp(dir + "/log0");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // past the result gathers: predicting
  ::kill(pids[1], SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pids[1], &status, 0), pids[1]);
  ASSERT_EQ(::waitpid(pids[0], &status, 0), pids[0]);
  const std::string log = slurp(dir + "/log0");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << log;
  EXPECT_FALSE(std::filesystem::exists(dir + "/out/train_results.json")) << log;
  EXPECT_TRUE(std::filesystem::exists(dir + "/out/model.safetensors")) << log;
}

// Note [failure before the group] (dist/launch.cpp): a rank refusing its flags before it joins
// the group (here --num-samples 0, as if its node's command line differed) ends the others with
// its error within seconds, where they waited out the rendezvous (ANATOMY_DIST_TIMEOUT, 60 s in
// these tests): under srun, rank 1 failing, rank 0 failing (it serves the store only to tell
// them), and both failing alike (no rank waits for another to see what it knows); under
// torchrun's agent (TORCHELASTIC_RUN_ID), rank 1 failing; three ranks, rank 1 failing and rank
// 2 starting after rank 0 has seen it (rank 0's store stays until rank 2 has seen it too).
class TrainRanksFailBeforeGroup : public ::testing::TestWithParam<int> {};

TEST_P(TrainRanksFailBeforeGroup, TheOthersEndWithItsErrorWithinSeconds) {
  const int bad = GetParam() % 10;  // the failing rank; 2: both
  const bool srun = GetParam() % 100 < 10;  // else torchrun's variables with its agent's
  const int world = GetParam() >= 100 ? 3 : 2;  // 3: rank 2 healthy, started 1.5 s after the failure
  const std::string dir = testing_dirs::fresh_dir("train_fail_before_group_" + std::to_string(GetParam()));
  const int port = free_local_port();
  std::vector<pid_t> pids(static_cast<size_t>(world));
  const auto t0 = Clock::now();
  std::vector<int> order = {1 - std::min(bad, 1), std::min(bad, 1)};  // the healthy rank first, waiting for the other
  if (world == 3) order.push_back(2);
  for (int r : order) {
    if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    const bool fails = (bad == 2 && world == 2) || r == bad;
    const std::vector<std::string> args = {ANATOMY_BINARY, "train", "--device", "cpu", "--threads", "1",
                                           "--disable-tqdm", "--preset", "bert-tiny", "--num-samples", fails ? "0" : "32",
                                           "--seq-len", "16", "--max-steps", "2", "--output-dir", dir + "/out"};
    const std::string log = dir + "/log" + std::to_string(r);
    pids[static_cast<size_t>(r)] = srun ? start_srun_task(args, r, world, port, log)
                                        : start_rank(args, r, world, port, log, {{"TORCHELASTIC_RUN_ID", "qa"}});
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  for (int r = 0; r < world; ++r) {
    int status = 0;
    ASSERT_EQ(::waitpid(pids[static_cast<size_t>(r)], &status, 0), pids[static_cast<size_t>(r)]);
    const std::string log = slurp(dir + "/log" + std::to_string(r));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << log;
    if ((bad == 2 && world == 2) || r == bad) {
      EXPECT_NE(log.find("anatomy: error: --num-samples"), std::string::npos) << log;
      EXPECT_EQ(log.find("the group did not form"), std::string::npos) << log;
    } else {
      EXPECT_NE(log.find(str_cat("anatomy: error: the group did not form: rank ", bad, " (")), std::string::npos) << log;
      EXPECT_NE(log.find("failed before the group formed: --num-samples"), std::string::npos) << log;
    }
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 20.0);
  EXPECT_FALSE(std::filesystem::exists(dir + "/out/train_results.json"));
}

INSTANTIATE_TEST_SUITE_P(FailingRank, TrainRanksFailBeforeGroup, ::testing::Values(0, 1, 2, 11, 101));

// Variables set by hand (no launcher that would leave the others waiting): a failing rank 0
// whose group never comes ends at once, serving no store for others that will not come.
TEST(TrainRanks, ByHandAFailingRankEndsAtOnce) {
  const std::string dir = testing_dirs::fresh_dir("train_fail_by_hand");
  const auto t0 = Clock::now();
  const pid_t pid = start_rank({ANATOMY_BINARY, "train", "--device", "cpu", "--preset", "bert-tiny", "--num-samples", "0",
                                "--output-dir", dir + "/out"},
                               0, 2, free_local_port(), dir + "/log");
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << slurp(dir + "/log");
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
}

// Open MPI's launcher (openmpi-bin from scripts/setup.sh) starts the ranks; they find rank 0's
// store through the MASTER_ADDR/MASTER_PORT it forwards (-x). One node, so no ssh: plm=isolated.
class ProcessGroupMpirun : public ::testing::TestWithParam<int> {};

TEST_P(ProcessGroupMpirun, CollectivesMatchTheInProcessGroupBitwise) {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0) GTEST_SKIP() << "mpirun is not installed (openmpi-bin)";
  const int world = GetParam();
  const std::string dir = testing_dirs::fresh_dir("pg_mpi_" + std::to_string(world));
  const std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm=isolated "
                          "timeout 60 mpirun -np " + std::to_string(world) +
                          " --oversubscribe -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=" + std::to_string(free_local_port()) +
                          " " + ANATOMY_PG_WORKER + " script " + dir + " > " + dir + "/log.txt 2>&1";
  const int rc = std::system(cmd.c_str());
  ASSERT_EQ(rc, 0) << slurp(dir + "/log.txt");
  expect_script_results(dir, world);
}

INSTANTIATE_TEST_SUITE_P(Worlds, ProcessGroupMpirun, ::testing::Values(2, 3));

}  // namespace
}  // namespace anatomy

namespace anatomy {
namespace {

// A rank that ignores SIGTERM is killed after the grace; the status is the failed rank's, and
// each rank saw torchrun's variables.
TEST(Spawn, EndsRanksThatIgnoreSigtermAndReturnsTheFailedStatus) {
  const std::string dir = testing_dirs::fresh_dir("spawn_kill");
  SpawnOptions opt;
  opt.nproc = 2;
  opt.settle = std::chrono::milliseconds(200);
  opt.grace = std::chrono::milliseconds(500);
  opt.argv = {"/bin/sh", "-c",
              "echo \"$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR\" > " + dir +
                  "/env$RANK; if [ \"$RANK\" = 1 ]; then echo 'rank 1 gives up' >&2; exit 3; fi; trap '' TERM; exec sleep 30"};
  const auto t0 = Clock::now();
  const auto [rc, log] = spawn_capturing(opt, dir + "/stderr.txt");
  EXPECT_EQ(rc, 3) << log;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
  EXPECT_NE(log.find("rank 1 gives up"), std::string::npos) << log;
  EXPECT_NE(log.find("anatomy: rank 1 (pid"), std::string::npos) << log;
  EXPECT_EQ(slurp(dir + "/env0"), "0 0 2 2 127.0.0.1\n");
  EXPECT_EQ(slurp(dir + "/env1"), "1 1 2 2 127.0.0.1\n");
}

}  // namespace
}  // namespace anatomy

namespace anatomy {
namespace {

// SIGINT to the spawner reaches every rank once; ranks that stop cleanly give status 0.
TEST(Spawn, ForwardsSigintToEveryRank) {
  const std::string dir = testing_dirs::fresh_dir("spawn_int");
  SpawnOptions opt;
  opt.nproc = 2;
  opt.argv = {"/bin/sh", "-c",
              "trap 'kill $! 2>/dev/null; echo \"rank $RANK stops\" >&2; exit 0' INT; sleep 20 & touch " + dir +
                  "/ready$RANK; wait"};
  std::thread interrupter([&] {
    auto ready = [&] { return std::filesystem::exists(dir + "/ready0") && std::filesystem::exists(dir + "/ready1"); };
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (!ready() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (ready()) ::kill(::getpid(), SIGINT);  // spawn_local's handler is installed before the ranks start
  });
  const auto t0 = Clock::now();
  const auto [rc, log] = spawn_capturing(opt, dir + "/stderr.txt");
  interrupter.join();
  EXPECT_EQ(rc, 0) << log;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
  EXPECT_NE(log.find("rank 0 stops"), std::string::npos) << log;
  EXPECT_NE(log.find("rank 1 stops"), std::string::npos) << log;
}

}  // namespace
}  // namespace anatomy
