// One rank of a real process group, for tests/unit/test_process_group.cpp. Reads its rank from
// the launcher's environment (dist/launch.h) and runs one mode, on the CPU (Gloo) or, with
// ANATOMY_PG_DEVICE=cuda, on CUDA device LOCAL_RANK (NCCL):
//   script OUT_DIR       every collective of pg_script.h; writes OUT_DIR/rank<R>.bin
//   check                the same, compared here with an in-process group of as many threads
//                        (bitwise; whole-number values, so NCCL's own sum order cannot show)
//   fail R               rank R fails (an error, exit 2) after a first barrier; the others go on
//                        into a collective with it, which must throw within seconds
//   stall                after a first barrier rank 0 writes a ready file and every rank waits
//                        in a collective that one rank never joins (the test kills that rank)
//   late-lead HOW        rank 0 works alone for 6.5 s, then every rank meets in HOW (barrier or
//                        wait_for_all): run with ANATOMY_DIST_TIMEOUT=3, barrier fails, wait_for_all not
//   vanish R             rank R joins the group's store, is watched, and exits (status 3) a second
//                        later, before its engine connects; the others run `script` into /dev/null
//                        and must fail within seconds (Gloo's mesh, NCCL's init)
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "dist/bootstrap.h"
#include "dist/communicator.h"
#include "memory/category.h"

#include "core/error.h"
#include "dist/launch.h"
#include "ops/backend.h"
#include "pg_script.h"

using namespace anatomy;

static int run(int argc, char** argv) {
  ANATOMY_CHECK(argc >= 2, "usage: anatomy_pg_worker script OUT_DIR | check | fail RANK | stall READY_FILE | late-lead HOW | vanish RANK");
  const std::string mode = argv[1];
  const LaunchEnv env = detect_launch();
  const char* device = std::getenv("ANATOMY_PG_DEVICE");
  const bool cuda = device && std::string(device) == "cuda";
  if (mode == "vanish" && argc == 3 && env.rank == std::atoi(argv[2])) {
    TcpStore store(env.master_addr, env.bootstrap_port, env.rank == 0, env.timeout);
    store.join(env.rank, env.world_size);
    store.watch([] {});
    std::this_thread::sleep_for(std::chrono::seconds(1));
    std::_Exit(3);  // as if killed: no goodbye to the store
  }
  auto backend = cuda ? make_cuda_backend(env.local_rank) : make_cpu_backend(1);
  std::unique_ptr<Communicator> comm = make_process_group(env, *backend);
  try {
    if (mode == "check" && argc == 2) {
      const std::vector<char> got = pg_test::run_script(*comm, *backend, true);
      auto group = make_local_group(env.world_size);
      std::vector<char> want;
      std::vector<std::thread> threads;
      for (int r = 0; r < env.world_size; ++r)
        threads.emplace_back([&, r] {
          auto be = make_cpu_backend(1);
          std::vector<char> o = pg_test::run_script(*group[static_cast<size_t>(r)], *be, true);
          if (r == env.rank) want = std::move(o);
        });
      for (auto& t : threads) t.join();
      const auto d = std::mismatch(got.begin(), got.end(), want.begin(), want.end());
      ANATOMY_CHECK(got.size() == want.size() && d.first == got.end(), "rank ", env.rank, " (", comm->kind(),
                    "): differs from the in-process group at byte ", d.first - got.begin(), " of ", got.size());
      std::printf("rank %d of %d (%s, %s): %zu bytes bitwise equal to the in-process group\n", env.rank,
                  env.world_size, comm->kind(), env.launcher.c_str(), got.size());
      return 0;
    }
    if (mode == "vanish" && argc == 3) {
      (void)pg_test::run_script(*comm, *backend);
      return 0;
    }
    if (mode == "script" && argc == 3) {
      const std::vector<char> out = pg_test::run_script(*comm, *backend);
      std::ofstream f(std::string(argv[2]) + "/rank" + std::to_string(env.rank) + ".bin", std::ios::binary);
      f.write(out.data(), static_cast<std::streamsize>(out.size()));
      ANATOMY_CHECK(f.good(), "cannot write ", argv[2]);
      return 0;
    }
    if (mode == "late-lead" && argc == 3) {
      if (env.rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(6500));
      std::string(argv[2]) == "wait_for_all" ? comm->wait_for_all() : comm->barrier();
      std::fprintf(stderr, "rank %d: met the others\n", env.rank);
      return 0;
    }
    comm->barrier();
    const Tensor t(backend->allocator().allocate(4000, Category::Temporary), DType::F32, Shape{1000}, backend->device());
    backend->fill(t, 1.0f);  // freed with the process
    if (mode == "fail" && argc == 3) {
      if (env.rank == std::atoi(argv[2])) fail("rank ", env.rank, " fails on purpose");
      for (int i = 0; i < 3; ++i) comm->all_reduce_sum(t);  // the failed rank never joins
      comm->barrier();  // NCCL's sums are asynchronous: a host collective waits for them
      return 0;
    }
    if (mode == "stall" && argc == 3) {
      if (env.rank == 0) std::ofstream(argv[2]) << getpid() << "\n";
      if (env.rank == env.world_size - 1) std::this_thread::sleep_for(std::chrono::seconds(60));  // to be killed
      comm->all_reduce_sum(t);
      comm->barrier();
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
