// One rank of a real process group, for tests/unit/test_process_group.cpp. Reads its rank from
// the launcher's environment (dist/launch.h) and runs one mode:
//   script OUT_DIR       every collective of pg_script.h; writes OUT_DIR/rank<R>.bin
//   fail R               rank R fails (an error, exit 2) after a first barrier; the others go on
//                        into a collective with it, which must throw within seconds
//   stall                after a first barrier rank 0 writes a ready file and every rank waits
//                        in a collective that one rank never joins (the test kills that rank)
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "core/error.h"
#include "dist/launch.h"
#include "ops/backend.h"
#include "pg_script.h"

using namespace anatomy;

static int run(int argc, char** argv) {
  ANATOMY_CHECK(argc >= 2, "usage: anatomy_pg_worker script OUT_DIR | fail RANK | stall READY_FILE");
  const std::string mode = argv[1];
  const LaunchEnv env = detect_launch();
  auto backend = make_cpu_backend(1);
  std::unique_ptr<Communicator> comm = make_process_group(env, *backend);
  try {
    if (mode == "script" && argc == 3) {
      const std::vector<char> out = pg_test::run_script(*comm);
      std::ofstream f(std::string(argv[2]) + "/rank" + std::to_string(env.rank) + ".bin", std::ios::binary);
      f.write(out.data(), static_cast<std::streamsize>(out.size()));
      ANATOMY_CHECK(f.good(), "cannot write ", argv[2]);
      return 0;
    }
    comm->barrier();
    std::vector<float> buf(1000, 1.0f);
    const Tensor t(buf.data(), DType::F32, Shape{1000}, Device::CPU);
    if (mode == "fail" && argc == 3) {
      if (env.rank == std::atoi(argv[2])) fail("rank ", env.rank, " fails on purpose");
      for (int i = 0; i < 1000; ++i) comm->all_reduce_sum(t);  // the failed rank never joins
      return 0;
    }
    if (mode == "stall" && argc == 3) {
      if (env.rank == 0) std::ofstream(argv[2]) << getpid() << "\n";
      if (env.rank == env.world_size - 1) std::this_thread::sleep_for(std::chrono::seconds(60));  // to be killed
      comm->all_reduce_sum(t);
      return 0;
    }
    fail("unknown mode ", mode);
  } catch (...) {
    comm->abort();  // what a trainer does on failure: the others' collectives throw
    throw;
  }
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pg_worker: error: %s\n", e.what());
    return 2;
  }
}
