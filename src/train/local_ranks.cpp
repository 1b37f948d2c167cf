// train(opt): the ranks of one process (Note [one loop] in train/trainer.cpp): a world of one, or
// --nproc-per-node ranks as threads, each with its own device, over an in-process group (CPU) or
// NCCL (CUDA devices 0 .. N-1). Processes started by a launcher call train(opt, comm, device)
// themselves.
#include <atomic>
#include <barrier>
#include <exception>
#include <thread>
#include <vector>

#include "dist/communicator.h"
#include "train/setup.h"
#include "train/signals.h"
#include "train/trainer.h"

namespace anatomy {

TrainResult train(const TrainOptions& opt) {
  opt.validate();
  const int N = opt.nproc_per_node;
  StopSignals stop;  // one handler for every rank of this process
  if (N == 1) {
    TrainDevice dev = make_train_device(opt, 0, 1);
    auto comms = make_local_group(1);
    return train(opt, *comms[0], dev);
  }
  // Ranks as threads of this process: every device first, then the group over them.
  std::vector<TrainDevice> devs(static_cast<size_t>(N));
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<TrainResult> results(static_cast<size_t>(N));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(N));
  std::barrier<> sync(N);
  std::atomic<bool> failed{false};
  auto rank_main = [&](int r) {
    const size_t i = static_cast<size_t>(r);
    try {
      devs[i] = make_train_device(opt, r, N);
      sync.arrive_and_wait();
      if (failed) return;
      if (r == 0) {
        std::vector<Backend*> raw;
        for (auto& d : devs) raw.push_back(d.backend.get());
        comms = devs[0].cuda ? make_nccl_group(raw) : make_local_group(N);
      }
      sync.arrive_and_wait();
      if (failed) return;
      devs[i].backend->bind_to_thread();
      results[i] = train(opt, *comms[i], devs[i]);
    } catch (...) {
      errors[i] = std::current_exception();
      failed = true;
      sync.arrive_and_drop();
    }
  };
  std::vector<std::thread> pool;
  for (int r = 0; r < N; ++r) pool.emplace_back(rank_main, r);
  for (auto& t : pool) t.join();
  // The run's error is a rank's own, not the "another rank failed" of the ranks it took along.
  std::exception_ptr first;
  for (const std::exception_ptr& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const GroupAborted&) {
      if (!first) first = e;
      continue;
    } catch (...) {
    }
    std::rethrow_exception(e);
  }
  if (first) std::rethrow_exception(first);
  return results[0];
}

}  // namespace anatomy
