// Reading the launcher's environment: torchrun, mpirun, srun; one-line errors naming the variable.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <iterator>

#include "../common/dirs.h"
#include "core/error.h"
#include "dist/bootstrap.h"
#include "dist/launch.h"
#include "dist/spawn.h"

namespace anatomy {
namespace {

using Env = std::map<std::string, std::string>;

std::string error_of(const Env& env) {
  try {
    detect_launch(env);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Launch, NoLauncherIsAGroupOfOne) {
  const LaunchEnv e = detect_launch(Env{{"PATH", "/bin"}});
  EXPECT_FALSE(e.launched());
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.rank, 0);
}

TEST(Launch, Torchrun) {
  const LaunchEnv e = detect_launch(Env{{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                                        {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}});
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.bootstrap_port, 29500);
}

TEST(Launch, UnderTorchrunsAgentStoreTheBootstrapTakesTheNextPort) {
  Env env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  EXPECT_EQ(detect_launch(env).master_port, 29500);
  EXPECT_EQ(detect_launch(env).bootstrap_port, 29501);
  env["ANATOMY_BOOTSTRAP_PORT"] = "31000";
  EXPECT_EQ(detect_launch(env).bootstrap_port, 31000);
}

TEST(Launch, Mpirun) {
  const LaunchEnv e = detect_launch(Env{{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"},
                                        {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
                                        {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(e.launcher, "mpirun");
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.world_size, 3);
  EXPECT_EQ(e.local_rank, 2);
}

TEST(Launch, SrunTakesTheFirstHostOfTheNodeList) {
  const LaunchEnv e = detect_launch(Env{{"SLURM_PROCID", "3"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_LOCALID", "1"},
                                        {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                                        {"SLURM_JOB_NODELIST", "gpu[07-08,12],cpu1"}, {"SLURM_JOB_ID", "123456"}});
  EXPECT_EQ(e.launcher, "srun");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "gpu07");
  EXPECT_EQ(e.master_port, 20000 + 123456 % 10000);
  EXPECT_EQ(detect_launch(Env{{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_JOB_NODELIST", "solo"}}).master_addr,
            "solo");
}

// Two steps of one job side by side (a sweep: srun ... & srun ... &) derive different ports.
TEST(Launch, SrunStepsOfOneJobTakeDifferentPorts) {
  auto port = [](const std::string& step) {
    Env env{{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_JOB_NODELIST", "n1"}, {"SLURM_JOB_ID", "4242"}};
    if (!step.empty()) env["SLURM_STEP_ID"] = step;
    return detect_launch(env).master_port;
  };
  EXPECT_EQ(port(""), 24242);
  EXPECT_EQ(port("0"), 24242);
  EXPECT_NE(port("1"), port("0"));
  EXPECT_NE(port("2"), port("1"));
  for (const char* s : {"1", "2", "3", "40", "1073741824"}) {  // the last: 7919 x it overflows 32 bits
    EXPECT_GE(port(s), 20000);
    EXPECT_LT(port(s), 30000);
  }
}

// Another launch's variables left in the environment (a shell torchrun started, then mpirun -np
// 3): each process would be a world of one training alone into the same files. Refused, naming
// both; a world of one by itself needs no address.
TEST(Launch, VariablesOfAnEarlierLaunchAreRefused) {
  const std::string stale = error_of(Env{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"},
                                         {"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"}});
  EXPECT_NE(stale.find("torchrun's variables say a world of 1 but OMPI_COMM_WORLD_SIZE=3 (mpirun's)"), std::string::npos)
      << stale;
  EXPECT_NE(stale.find("unset the torchrun ones (RANK, WORLD_SIZE)"), std::string::npos) << stale;
  const std::string old_mpi = error_of(Env{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"},
                                           {"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "2"}});
  EXPECT_NE(old_mpi.find("SLURM_STEP_NUM_TASKS=2 (srun's)"), std::string::npos) << old_mpi;
  // mpirun inside a one-task srun step: mpirun's world is the larger, and it is taken.
  const LaunchEnv inside = detect_launch(Env{{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "3"},
                                             {"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}, {"MASTER_ADDR", "h"},
                                             {"MASTER_PORT", "29500"}});
  EXPECT_EQ(inside.launcher, "mpirun");
  EXPECT_EQ(inside.world_size, 3);
  // torchrun --standalone per task of a multi-task srun step: ANATOMY_LAUNCHER says whose variables.
  const LaunchEnv standalone = detect_launch(Env{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"},
                                                 {"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "4"},
                                                 {"ANATOMY_LAUNCHER", "torchrun"}});
  EXPECT_EQ(standalone.world_size, 1);
  EXPECT_NE(stale.find("ANATOMY_LAUNCHER=torchrun takes torchrun's variables alone"), std::string::npos) << stale;
  const LaunchEnv forced = detect_launch(Env{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_RANK", "1"},
                                             {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"},
                                             {"ANATOMY_LAUNCHER", "mpirun"}});
  EXPECT_EQ(forced.launcher, "mpirun");
  EXPECT_EQ(forced.rank, 1);
  EXPECT_NE(error_of(Env{{"ANATOMY_LAUNCHER", "slurm"}}).find("ANATOMY_LAUNCHER=slurm: expected torchrun"),
            std::string::npos);
  const LaunchEnv one = detect_launch(Env{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}});
  EXPECT_EQ(one.world_size, 1);
  EXPECT_FALSE(one.launched());
}

// A batch script's own shell (no srun): rank 0 of the allocation's tasks, but nobody else runs.
TEST(Launch, SbatchWithoutSrunIsAGroupOfOne) {
  const LaunchEnv e = detect_launch(Env{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"},
                                        {"SLURM_JOB_NODELIST", "gnode[10,20]"}, {"SLURM_JOB_ID", "7"}});
  EXPECT_FALSE(e.launched());
  EXPECT_EQ(e.world_size, 1);
}

TEST(Launch, InconsistentVariablesAreNamed) {
  const Env base{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}};
  auto with = [&](const std::string& k, const std::string& v) {
    Env e = base;
    if (v.empty()) e.erase(k); else e[k] = v;
    return error_of(e);
  };
  EXPECT_NE(with("RANK", "2").find("RANK=2 is not below WORLD_SIZE=2"), std::string::npos) << with("RANK", "2");
  EXPECT_NE(with("WORLD_SIZE", "two").find("WORLD_SIZE=two"), std::string::npos);
  EXPECT_NE(with("WORLD_SIZE", "").find("WORLD_SIZE is not set"), std::string::npos);
  EXPECT_NE(with("LOCAL_RANK", "").find("LOCAL_RANK is not set"), std::string::npos);
  EXPECT_NE(with("MASTER_ADDR", "").find("MASTER_ADDR is not set"), std::string::npos);
  EXPECT_NE(with("MASTER_PORT", "70000").find("MASTER_PORT=70000"), std::string::npos);
  EXPECT_NE(with("ANATOMY_DIST_TIMEOUT", "0").find("ANATOMY_DIST_TIMEOUT=0"), std::string::npos);
  EXPECT_NE(error_of(Env{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}).find("mpirun -x MASTER_ADDR"),
            std::string::npos);
  for (const std::string& e : {with("RANK", "2"), with("MASTER_ADDR", "")}) EXPECT_EQ(e.find('\n'), std::string::npos);
}

// A rank whose rank 0 never comes up gives up after the timeout, naming the address.
TEST(Launch, NoStoreAtTheAddressIsAOneLineErrorNamingIt) {
  const int port = free_local_port();
  const std::string where = "127.0.0.1:" + std::to_string(port);
  try {
    TcpStore store("127.0.0.1", port, false, std::chrono::milliseconds(300));
    FAIL() << "connected to nothing";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no store at " + where), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

// The store itself: a key set by one rank is read by another; a key nobody sets times out.
TEST(Launch, StoreSetGetWaitAndTimeout) {
  const int port = free_local_port();
  TcpStore server("127.0.0.1", port, true, std::chrono::seconds(5));
  TcpStore client("127.0.0.1", port, false, std::chrono::seconds(5));
  server.set("id", {'a', 'b', '\0', 'c'});
  EXPECT_EQ(client.get("id"), (std::vector<char>{'a', 'b', '\0', 'c'}));
  try {
    client.wait({"never"}, std::chrono::milliseconds(200));
    FAIL() << "waited for a key nobody set";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'never' never appeared in the store at 127.0.0.1:" + std::to_string(port)),
              std::string::npos)
        << e.what();
  }
}

// Under a launcher, anatomy train checks --nproc-per-node against it (one line, exit 2).
TEST(Launch, TrainChecksNprocPerNodeAgainstTheLauncher) {
  const std::string dir = testing_dirs::fresh_dir("launch_cli");
  const std::string cmd = "RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 " +
                          std::string(ANATOMY_BINARY) + " train --device cpu --preset bert-tiny --nproc-per-node 3 --output-dir " + dir +
                          "/out 2> " + dir + "/err.txt";
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 2);
  std::ifstream f(dir + "/err.txt");
  const std::string err{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  EXPECT_EQ(err, "anatomy: error: --nproc-per-node 3 disagrees with torchrun's 2 processes on this node (leave the flag out "
                 "under a launcher)\n");
}

}  // namespace
}  // namespace anatomy
