// A run you can leave: training killed with SIGKILL at random points (saves included) and
// resumed from the newest checkpoint gives the same loss curve and final weights, bit for bit,
// as the run that was never interrupted; SIGINT finishes the step, saves, and exits 0 with the
// command that resumes. The runs are the real `anatomy` binary on the CPU.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../common/compare.h"
#include "dist/spawn.h"
#include "train/signals.h"

extern char** environ;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Named per process: runs of this suite from other checkouts may share the temp directory.
std::string tmp(const std::string& name) {
  fs::path p = fs::path(testing::TempDir()) / (name + "-" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// bert-tiny with dropout on a learnable synthetic task: 30 steps, a checkpoint after every
// step (so kills often land inside a save), one thread so the arithmetic is reproducible.
std::vector<std::string> train_args(const std::string& out) {
  return {ANATOMY_BINARY, "train", "--device", "cpu", "--threads", "1", "--preset", "bert-tiny", "--dataset",
          "learnable", "--num-samples", "240", "--seq-len", "32", "--per-device-train-batch-size", "8",
          "--gradient-accumulation-steps", "2", "--max-steps", "30", "--learning-rate", "1e-3", "--warmup-steps", "3",
          "--logging-steps", "1", "--save-strategy", "steps", "--save-steps", "1", "--save-total-limit", "2",
          "--disable-tqdm", "--output-dir", out};
}

void set_flag(std::vector<std::string>& args, const std::string& flag, const std::string& value) {
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == flag) {
      args[i + 1] = value;
      return;
    }
  ADD_FAILURE() << "no flag " << flag;
}

// checkpoint-<step> exactly: staging ("checkpoint-7.tmp-XXXXXX") and trash directories are not checkpoints.
bool is_checkpoint_name(const std::string& name) {
  return name.size() > 11 && name.rfind("checkpoint-", 0) == 0 &&
         name.find_first_not_of("0123456789", 11) == std::string::npos;
}

bool has_checkpoint(const std::string& out) {
  for (const auto& e : fs::directory_iterator(out))
    if (is_checkpoint_name(e.path().filename().string())) return true;
  return false;
}

// Starts the binary with stdout and stderr into `log`.
pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

int wait_exit(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// step -> the logged loss, exactly as written.
std::map<int64_t, double> loss_curve(const std::string& out) {
  std::map<int64_t, double> curve;
  std::ifstream in(fs::path(out) / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) curve[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return curve;
}

// Every checkpoint-N directory present is whole: the three files, and a trainer state that
// parses and names step N.
void expect_checkpoints_whole(const std::string& out) {
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string name = e.path().filename().string();
    if (!is_checkpoint_name(name)) continue;
    for (const char* f : {"model.safetensors", "optimizer.safetensors", "anatomy_state.json", "config.json"})
      EXPECT_TRUE(fs::is_regular_file(e.path() / f)) << name << " lacks " << f;
    auto st = nlohmann::json::parse(slurp(e.path() / "anatomy_state.json"));
    EXPECT_EQ(std::to_string(st.at("trainer").at("global_step").get<int64_t>()), name.substr(11)) << name;
  }
}

}  // namespace

TEST(Resume, SigkillAtRandomPointsThenResumeIsBitwiseIdentical) {
  const std::string ref = tmp("resume_ref"), run = tmp("resume_killed");
  const auto t0 = Clock::now();
  ASSERT_EQ(wait_exit(spawn(train_args(ref), ref + "/log.txt")), 0) << slurp(ref + "/log.txt");
  const double full = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto want = loss_curve(ref);
  ASSERT_EQ(want.size(), 30u);

  // The first kill lands inside a save: as soon as a staging directory appears. The others at
  // random times (seeded), resuming each time from the newest complete checkpoint.
  std::mt19937 rng(20261122);
  int kills = 0, resumes = 0, in_save = 0;
  for (int attempt = 0; attempt < 12 && kills < 6; ++attempt) {
    std::vector<std::string> args = train_args(run);
    if (has_checkpoint(run)) {
      args.push_back("--resume-from-checkpoint");
      args.push_back("latest");
      ++resumes;
    }
    const pid_t pid = spawn(args, run + "/log.txt");
    if (kills == 0) {
      bool saving = false;
      for (int i = 0; i < 20000 && !saving; ++i) {
        for (const auto& e : fs::directory_iterator(run))
          saving |= e.path().filename().string().find(".tmp-") != std::string::npos;
        if (!saving) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      in_save += saving;
    } else {
      std::uniform_real_distribution<double> when(0.1 * full, 0.5 * full);
      std::this_thread::sleep_for(std::chrono::duration<double>(when(rng)));
    }
    if (kill(pid, SIGKILL) == 0) ++kills;
    wait_exit(pid);
    expect_checkpoints_whole(run);
    if (fs::exists(fs::path(run) / "train_results.json")) break;  // it finished before the kill
  }
  EXPECT_EQ(in_save, 1) << "the first kill should have landed inside a save";
  EXPECT_GE(kills, 4);
  // The last leg runs to the end.
  std::vector<std::string> args = train_args(run);
  args.push_back("--resume-from-checkpoint");
  args.push_back("latest");
  ASSERT_EQ(wait_exit(spawn(args, run + "/log.txt")), 0) << slurp(run + "/log.txt");
  expect_checkpoints_whole(run);

  const auto got = loss_curve(run);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [step, loss] : want) EXPECT_EQ(got.at(step), loss) << "step " << step;  // bitwise: no tolerance
  EXPECT_TRUE(anatomy::testing_compare::same_file_bytes(fs::path(run) / "model.safetensors", fs::path(ref) / "model.safetensors"));
  auto a = nlohmann::json::parse(slurp(fs::path(ref) / "train_results.json"));
  auto b = nlohmann::json::parse(slurp(fs::path(run) / "train_results.json"));
  EXPECT_EQ(a["train_loss"].get<double>(), b["train_loss"].get<double>());
  EXPECT_GT(b["resumed_from_step"].get<int64_t>(), 0);
  // --save-total-limit 2: only the two newest checkpoints are left.
  int n = 0;
  for (const auto& e : fs::directory_iterator(run)) n += is_checkpoint_name(e.path().filename().string());
  EXPECT_EQ(n, 2);
  std::printf("[resume] %d SIGKILLs (%d inside a save), %d resumes, %zu steps identical\n", kills, in_save, resumes,
              got.size());
}

TEST(Resume, SigintSavesAndPrintsTheResumeCommand) {
  const std::string ref = tmp("sigint_ref"), run = tmp("sigint_run");
  std::vector<std::string> args = train_args(ref);
  set_flag(args, "--save-strategy", "final");  // no periodic checkpoints: SIGINT saves one anyway
  ASSERT_EQ(wait_exit(spawn(args, ref + "/log.txt")), 0);
  set_flag(args, "--output-dir", run);
  const pid_t pid = spawn(args, run + "/log.txt");
  // Wait for the first logged step, then interrupt.
  for (int i = 0; i < 600 && loss_curve(run).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  kill(pid, SIGINT);
  EXPECT_EQ(wait_exit(pid), 0) << slurp(run + "/log.txt");
  const std::string log = slurp(run + "/log.txt");
  EXPECT_NE(log.find("stopped by SIGINT"), std::string::npos) << log;
  EXPECT_NE(log.find("resume with: "), std::string::npos) << log;
  EXPECT_NE(log.find("--resume-from-checkpoint latest"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(fs::path(run) / "train_results.json"));
  if (loss_curve(run).size() == 30) GTEST_SKIP() << "the run finished before SIGINT arrived";
  args.push_back("--resume-from-checkpoint");
  args.push_back("latest");
  ASSERT_EQ(wait_exit(spawn(args, run + "/log.txt")), 0) << slurp(run + "/log.txt");
  EXPECT_EQ(loss_curve(run), loss_curve(ref));
  EXPECT_TRUE(anatomy::testing_compare::same_file_bytes(fs::path(run) / "model.safetensors", fs::path(ref) / "model.safetensors"));
}

// Under an outside launcher (here torchrun's variables, two ranks started by hand as torchrun
// starts them, each sent SIGINT as torchrun forwards it) the bare command would resume a world of
// one: the hint says to run it under the launcher again.
TEST(Resume, UnderALauncherTheResumeHintNamesIt) {
  const std::string run = tmp("sigint_launcher");
  std::vector<std::string> args = train_args(run);
  set_flag(args, "--max-steps", "2000");
  const std::string port = std::to_string(anatomy::free_local_port());
  std::vector<pid_t> pids;
  for (const char* rank : {"0", "1"}) {
    for (auto [k, v] : {std::pair<const char*, const char*>{"RANK", rank}, {"LOCAL_RANK", rank}, {"WORLD_SIZE", "2"},
                        {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port.c_str()}})
      ::setenv(k, v, 1);
    pids.push_back(spawn(args, run + "/log" + rank + ".txt"));
  }
  for (const char* k : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(k);
  for (int i = 0; i < 1500 && loss_curve(run).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (pid_t p : pids) kill(p, SIGINT);
  for (pid_t p : pids) EXPECT_EQ(wait_exit(p), 0) << slurp(run + "/log0.txt");
  const std::string log = slurp(run + "/log0.txt");
  EXPECT_NE(log.find("resume with: torchrun [its options] " + std::string(ANATOMY_BINARY) + " train "), std::string::npos)
      << log;
  EXPECT_NE(log.find("--resume-from-checkpoint latest"), std::string::npos) << log;
}

// A second SIGINT ends the process at once, as a second Ctrl-C should, and says so (it died
// silently); one SIGINT and one SIGTERM stay one stop. In a child process, with raise(), which
// delivers each signal before it returns (two kill()s may merge into one pending signal).
TEST(Resume, ASecondSigintStopsAtOnceAndSaysSo) {
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], 2);
    anatomy::StopSignals stop;
    raise(SIGINT);
    raise(SIGTERM);  // one of each: still a stop
    if (stop.pending() != SIGTERM) _exit(3);
    raise(SIGINT);  // the second SIGINT
    _exit(4);       // not reached
  }
  close(out[1]);
  std::string said;
  char buf[256];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) said.append(buf, static_cast<size_t>(n));
  close(out[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFSIGNALED(st)) << "exit status " << WEXITSTATUS(st);
  EXPECT_EQ(WTERMSIG(st), SIGINT);
  EXPECT_NE(said.find("anatomy: a second signal: stopping now, without saving a checkpoint"), std::string::npos) << said;
}

TEST(Resume, ACheckpointOfAnotherConfigurationIsRefused) {
  const std::string out = tmp("resume_mismatch");
  std::vector<std::string> args = train_args(out);
  set_flag(args, "--max-steps", "3");
  ASSERT_EQ(wait_exit(spawn(args, out + "/log.txt")), 0);
  std::vector<std::string> other = train_args(out);
  set_flag(other, "--per-device-train-batch-size", "4");
  other.push_back("--resume-from-checkpoint");
  other.push_back("latest");
  fs::remove(out + "/log2.txt");
  EXPECT_EQ(wait_exit(spawn(other, out + "/log2.txt")), 2);
  const std::string log = slurp(out + "/log2.txt");
  EXPECT_NE(log.find("--per-device-train-batch-size"), std::string::npos) << log;
  EXPECT_NE(log.find("--resume-from-checkpoint"), std::string::npos) << log;
  // The batch is said as the global one it is, with this run's per-device batch and ranks.
  EXPECT_NE(log.find(", this run's is 4 (4 x 1 rank)"), std::string::npos) << log;
}

// fp8's gradient format is part of the run: a hybrid checkpoint does not resume as e4m3, and
// resumes as itself.
TEST(Resume, AnFp8CheckpointResumesOnlyInItsFormat) {
  const std::string out = tmp("resume_fp8_format");
  std::vector<std::string> args = train_args(out);
  set_flag(args, "--max-steps", "2");
  args.insert(args.end(), {"--precision", "fp8"});
  ASSERT_EQ(wait_exit(spawn(args, out + "/log.txt")), 0) << slurp(out + "/log.txt");
  std::vector<std::string> e4 = args;
  set_flag(e4, "--max-steps", "3");
  e4.insert(e4.end(), {"--fp8-format", "e4m3", "--resume-from-checkpoint", "latest"});
  EXPECT_EQ(wait_exit(spawn(e4, out + "/log2.txt")), 2);
  const std::string log = slurp(out + "/log2.txt");
  EXPECT_NE(log.find("--fp8-format \"hybrid\", this run has \"e4m3\""), std::string::npos) << log;
  std::vector<std::string> same = args;
  set_flag(same, "--max-steps", "3");
  same.insert(same.end(), {"--resume-from-checkpoint", "latest"});
  EXPECT_EQ(wait_exit(spawn(same, out + "/log3.txt")), 0) << slurp(out + "/log3.txt");
}

// Note [stopping cleanly] at two ranks: a SIGTERM reaches the process, every rank finishes the
// step, saves its part of the checkpoint, and the run exits 0 without results; one process then
// resumes it (the same global batch) to the end.
TEST(Resume, SigtermStopsEveryRankWithACheckpointAndOneProcessResumes) {
  const std::string run = tmp("sigterm_ranks");
  std::vector<std::string> args = train_args(run);
  set_flag(args, "--per-device-train-batch-size", "4");
  set_flag(args, "--save-strategy", "final");
  std::vector<std::string> ranks = args;
  ranks.insert(ranks.end(), {"--nproc-per-node", "2", "--zero-stage", "1"});
  const pid_t pid = spawn(ranks, run + "/log.txt");
  for (int i = 0; i < 600 && loss_curve(run).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_exit(pid), 0) << slurp(run + "/log.txt");
  const std::string log = slurp(run + "/log.txt");
  if (loss_curve(run).size() == 30) GTEST_SKIP() << "the run finished before SIGTERM arrived";
  EXPECT_NE(log.find("stopped by SIGTERM"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(fs::path(run) / "train_results.json"));
  ASSERT_TRUE(has_checkpoint(run)) << log;
  bool shards = false;
  for (const auto& e : fs::directory_iterator(run))
    if (is_checkpoint_name(e.path().filename().string()))
      shards |= fs::exists(e.path() / "optimizer-shard-1.safetensors");
  EXPECT_TRUE(shards) << "each rank writes its optimizer shard";
  set_flag(args, "--per-device-train-batch-size", "8");
  args.insert(args.end(), {"--resume-from-checkpoint", "latest"});
  ASSERT_EQ(wait_exit(spawn(args, run + "/log.txt")), 0) << slurp(run + "/log.txt");
  EXPECT_EQ(loss_curve(run).size(), 30u);
  EXPECT_TRUE(fs::exists(fs::path(run) / "train_results.json"));
}
