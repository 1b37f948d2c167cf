// One trainer at any scale, through the command line with real processes (issue 12): `anatomy
// train --nproc-per-node N` spawns N processes with torchrun's environment, which meet over the
// TCP bootstrap and train through Gloo. Against one process with the combined batch (fp32, from
// the same weights, dropout off: its masks are drawn per rank), ZeRO-1 against ZeRO-0, and a job
// that loses a rank to SIGKILL, then resumes on another number of processes.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../common/cli.h"
#include "../common/compare.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using anatomy::testing_cli::CmdResult;

CmdResult run(const std::string& args) { return anatomy::testing_cli::run_anatomy(args); }

const std::string kData = std::string(ANATOMY_SOURCE_DIR) + "/tests/data/text/sentiment.jsonl";
const std::string kTokenizer = std::string(ANATOMY_SOURCE_DIR) + "/tests/data/tokenizer";

// step -> logged loss (rank 0's metrics.jsonl: the step's loss over the global batch).
std::map<int64_t, double> losses(const std::string& out) {
  std::map<int64_t, double> m;
  std::ifstream in(fs::path(out) / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line);
    if (j.contains("loss")) m[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return m;
}

// A bert-tiny model directory with dropout off, and a copy of the text data (its token cache
// goes beside it): the common start of every run below.
struct Start {
  std::string dir, model, data;
};
const Start& start() {
  static const Start s = [] {
    Start st;
    // One directory per test: ctest runs the tests of this file as concurrent processes.
    st.dir = anatomy::testing_cli::fresh_dir(std::string("train_processes_") +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    st.data = st.dir + "/data.jsonl";
    fs::copy_file(kData, st.data);
    st.model = st.dir + "/start";
    const CmdResult r = run("train --device cpu --preset bert-tiny --tokenizer " + kTokenizer + " --train-file " + st.data +
                            " --max-steps 1 --save-strategy final --disable-tqdm --output-dir " + st.model);
    EXPECT_EQ(r.status, 0) << r.output;
    json cfg;
    std::ifstream(fs::path(st.model) / "config.json") >> cfg;
    cfg["hidden_dropout_prob"] = 0.0;
    cfg["attention_probs_dropout_prob"] = 0.0;
    std::ofstream(fs::path(st.model) / "config.json") << cfg.dump(2);
    return st;
  }();
  return s;
}

std::string train_args(const std::string& out, int procs, int per_device, const std::string& extra = "") {
  const Start& s = start();
  return "train --device cpu --threads 1 --model-name-or-path " + s.model + " --train-file " + s.data +
         " --max-seq-length 32 --learning-rate 1e-4 --logging-steps 1 --disable-tqdm"
         " --nproc-per-node " + std::to_string(procs) + " --per-device-train-batch-size " + std::to_string(per_device) +
         " --output-dir " + out + " " + extra;
}

// The first child process of `pid` (the spawner's ranks), or -1.
pid_t first_child(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  pid_t c = -1;
  in >> c;
  return c;
}

}  // namespace

TEST(TrainProcesses, TwoAndThreeProcessesTrainLikeOneWithTheCombinedBatch) {
  const std::string dir = start().dir;
  for (int procs : {2, 3}) {
    SCOPED_TRACE(std::to_string(procs) + " processes");
    const std::string one = dir + "/one_" + std::to_string(procs), many = dir + "/many_" + std::to_string(procs);
    CmdResult a = run(train_args(one, 1, 4 * procs, "--max-steps 4"));
    ASSERT_EQ(a.status, 0) << a.output;
    CmdResult b = run(train_args(many, procs, 4, "--max-steps 4"));
    ASSERT_EQ(b.status, 0) << b.output;
    const auto la = losses(one), lb = losses(many);
    ASSERT_EQ(la.size(), 4u);
    ASSERT_EQ(lb.size(), 4u);
    for (const auto& [step, loss] : la) EXPECT_NEAR(lb.at(step), loss, 1e-5) << "step " << step;
    EXPECT_TRUE(anatomy::testing_compare::same_safetensors(fs::path(one) / "model.safetensors",
                                                           fs::path(many) / "model.safetensors", 1e-5));
  }
}

// ZeRO-1 and ZeRO-2 bit for bit ZeRO-0 on 3 processes; with accumulation ZeRO-2 keeps only its
// shard of the gradients and agrees to rounding; each process holds exactly its own plan.
TEST(TrainProcesses, ZeroStagesOneAndTwoAreBitForBitStageZeroAcrossProcesses) {
  const std::string dir = start().dir;
  for (int stage : {0, 1, 2}) {
    CmdResult r = run(train_args(dir + "/z" + std::to_string(stage), 3, 4, "--max-steps 3 --zero-stage " + std::to_string(stage)));
    ASSERT_EQ(r.status, 0) << r.output;
  }
  for (const char* z : {"z1", "z2"})
    EXPECT_TRUE(anatomy::testing_compare::same_safetensors(fs::path(dir) / "z0" / "model.safetensors",
                                                           fs::path(dir) / z / "model.safetensors"))
        << z;
  std::map<int, json> results;
  for (int stage : {0, 2}) {
    const std::string out = dir + "/acc" + std::to_string(stage);
    CmdResult r = run(train_args(out, 3, 2, "--max-steps 3 --gradient-accumulation-steps 2 --zero-stage " + std::to_string(stage)));
    ASSERT_EQ(r.status, 0) << r.output;
    json res;
    std::ifstream(fs::path(out) / "train_results.json") >> res;
    ASSERT_EQ(res["rank_peak_bytes"].size(), 3u);
    for (int k = 0; k < 3; ++k) EXPECT_EQ(res["rank_peak_bytes"][k], res["rank_planned_bytes"][k]) << out << " rank " << k;
    results[stage] = res;
  }
  // The full gradients in activation memory plus a third of them, against a buffer of their own.
  EXPECT_LT(results[2]["rank_peak_bytes"][0].get<int64_t>(), results[0]["rank_peak_bytes"][0].get<int64_t>());
  EXPECT_TRUE(anatomy::testing_compare::same_safetensors(fs::path(dir) / "acc0" / "model.safetensors",
                                                         fs::path(dir) / "acc2" / "model.safetensors", 1e-5));
}

// --profile-steps on 2 processes: the time anatomy also says how the gradients were reduced
// (Note [overlap timing]): per-layer buckets during backward, their time, and on the CPU, whose
// collectives block the backward thread, none of it hidden.
TEST(TrainProcesses, ProfileStepsShowTheGradientReduction) {
  const std::string out = start().dir + "/profiled";
  CmdResult r = run(train_args(out, 2, 4, "--max-steps 1 --profile-steps 2 --ddp-bucket-cap-mb 0"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("gradient reduction (2 ranks):"), std::string::npos) << r.output;
  json p;
  std::ifstream(fs::path(out) / "profile.json") >> p;
  ASSERT_TRUE(p.contains("gradient_reduction")) << p.dump(2);
  const json& g = p["gradient_reduction"];
  EXPECT_EQ(g["ranks"], 2);
  EXPECT_GE(g["buckets_per_step"].get<double>(), 4.0);  // bert-tiny's two layers, the embeddings, the tail
  EXPECT_GT(g["reduce_ms"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(g["exposed_ms"].get<double>(), g["reduce_ms"].get<double>());
  EXPECT_EQ(g["hidden_pct"].get<double>(), 0.0);
}

// Text data with evaluation and a checkpoint every step on 2 processes; one rank is killed; the
// job ends within seconds with a failure; the run resumes on 3 processes and ends where an
// uninterrupted one-process run ends.
TEST(TrainProcesses, KillOneRankThenResumeOnAnotherNumberOfProcesses) {
  const std::string dir = start().dir;
  const std::string common = "--validation-split 0.2 --eval-strategy steps --eval-steps 3 --max-steps 12";
  const std::string ref = dir + "/ref", out = dir + "/killed";
  CmdResult r = run(train_args(ref, 1, 12, common));
  ASSERT_EQ(r.status, 0) << r.output;

  const std::string args = std::string(ANATOMY_BINARY) + " " +
                           train_args(out, 2, 6, common + " --save-strategy steps --save-steps 1");
  const pid_t job = fork();
  ASSERT_GE(job, 0);
  if (job == 0) {
    ::execl("/bin/sh", "sh", "-c", ("exec " + args + " > " + dir + "/killed.log 2>&1").c_str(), nullptr);
    _exit(127);
  }
  // Wait for the first checkpoint, then kill one rank.
  for (int i = 0; i < 600 && !fs::exists(fs::path(out) / "checkpoint-2"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const pid_t rank = first_child(job);
  ASSERT_GT(rank, 0);
  ASSERT_EQ(kill(rank, SIGKILL), 0);
  const auto t0 = std::chrono::steady_clock::now();
  int st = 0;
  waitpid(job, &st, 0);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(!WIFEXITED(st) || WEXITSTATUS(st) != 0) << "the job must fail when a rank dies";
  EXPECT_LT(took, 15.0) << "the job must end within seconds of losing a rank";
  EXPECT_FALSE(fs::exists(fs::path(out) / "train_results.json"));

  CmdResult resumed = run(train_args(out, 3, 4, common + " --save-strategy steps --save-steps 1 "
                                                          "--resume-from-checkpoint latest --save-total-limit 2"));
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  const auto lr = losses(ref), lo = losses(out);
  ASSERT_EQ(lr.size(), 12u);
  EXPECT_NEAR(lo.at(12), lr.at(12), 1e-5);
  json a, b;
  std::ifstream(fs::path(ref) / "train_results.json") >> a;
  std::ifstream(fs::path(out) / "train_results.json") >> b;
  EXPECT_NEAR(a["eval_loss"].get<double>(), b["eval_loss"].get<double>(), 1e-5);
  EXPECT_TRUE(anatomy::testing_compare::same_safetensors(fs::path(ref) / "model.safetensors",
                                                         fs::path(out) / "model.safetensors", 1e-5));
}
