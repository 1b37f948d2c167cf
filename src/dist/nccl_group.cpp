// NCCL collectives for ranks that are threads of one process, one CUDA device each. Shards of
// uneven size are done as grouped per-owner reductions and broadcasts (ncclReduce / ncclBroadcast
// in place inside ncclGroupStart/End), which need no padding of the flat buffers.
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "dist/bootstrap.h"
#include "dist/communicator.h"
#include "dist/launch.h"
#include "ops/backend.h"
#include "ops/cuda/check.h"

namespace anatomy {

namespace {

// The communicators of one group: any rank that fails aborts them all (a peer blocked in a
// collective with the failed rank returns only when its own communicator is aborted).
// A process group (make_nccl_process_group) holds one communicator here; its failure watch
// (Note [failure watch] in dist/bootstrap.cpp) aborts it from another thread, so there (guarded)
// enqueues hold `mu` and check `aborted` first (an aborted ncclComm_t is freed). Threads of one
// process take no lock: a rank's enqueue may wait for its peers' (connection set-up), and a
// lock held there would stop a failing peer from aborting it. Left as it is: a peer that dies
// while this one sets up its first connections can still block that enqueue.
struct NcclGroupState {
  std::vector<ncclComm_t> comms;
  std::vector<std::atomic<bool>> aborted;
  std::mutex mu;
  bool guarded = false;
  explicit NcclGroupState(std::vector<ncclComm_t> c, bool g = false) : comms(std::move(c)), aborted(comms.size()), guarded(g) {}
  std::unique_lock<std::mutex> lock() { return guarded ? std::unique_lock(mu) : std::unique_lock<std::mutex>(); }
  // A null communicator is one still to be created (make_nccl_process_group): marked aborted, it
  // is aborted by its creator (adopt).
  void abort_all() noexcept {
    auto lk = lock();
    for (size_t r = 0; r < comms.size(); ++r)
      if (!aborted[r].exchange(true) && comms[r]) (void)ncclCommAbort(comms[r]);
  }
  // Slot r's communicator, handed over as NCCL's init returns it (still initializing, for a
  // non-blocking one): false, and aborted here, when the group was aborted before.
  bool adopt(size_t r, ncclComm_t c) {
    auto lk = lock();
    comms[r] = c;
    if (!aborted[r]) return true;
    (void)ncclCommAbort(c);
    return false;
  }
  // A call that returned ncclInProgress (Note [non-blocking NCCL]) is done when the communicator's
  // state leaves it; polled with the lock taken each time, so that an abort from the failure
  // watch ends the wait (a group's abort frees the communicator: it is not read after that).
  // `deadline` bounds a wait that no failure ends (a rank that joined and never came).
  template <class Fail>
  void settle(size_t r, ncclResult_t res, Fail&& failed,
              std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max()) {
    while (res == ncclInProgress) {
      {
        auto lk = lock();
        if (aborted[r]) failed("another rank of the group failed");
        if (std::chrono::steady_clock::now() > deadline) {
          lk.unlock();
          abort_all();
          failed("it did not complete in time (ANATOMY_DIST_TIMEOUT)");
        }
        ANATOMY_CUDA_CHECK(ncclCommGetAsyncError(comms[r], &res));
      }
      if (res == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    ANATOMY_CUDA_CHECK(res);
  }
};

// Closes a grouped launch whatever happens inside it (a throw between Start and End would
// leave the group open).
struct GroupScope {
  GroupScope() { ANATOMY_CUDA_CHECK(ncclGroupStart()); }
  ~GroupScope() noexcept(false) {
    const ncclResult_t r = ncclGroupEnd();
    if (std::uncaught_exceptions() == 0) ANATOMY_CUDA_CHECK(r);
  }
};

class NcclCommunicator final : public Communicator {
 public:
  // `slot`: this rank's communicator in the group state (its rank for threads of one process;
  // 0 for a process group, whose `store` watches the other processes).
  NcclCommunicator(std::shared_ptr<NcclGroupState> g, size_t slot, cudaStream_t stream, int rank, int world,
                   std::unique_ptr<TcpStore> store = nullptr)
      : m_group(std::move(g)), m_slot(slot), m_comm(m_group->comms[slot]), m_stream(stream), m_rank(rank),
        m_world(world), m_store(std::move(store)) {}
  ~NcclCommunicator() override {
    if (m_store) (m_group->aborted[m_slot] || std::uncaught_exceptions() > 0 ? m_store->leave() : m_store->finish());
    if (!m_group->aborted[m_slot].exchange(true)) (void)ncclCommDestroy(m_comm);
    if (m_scratch) (void)cudaFree(m_scratch);
    for (auto [a, b] : m_spans) (void)cudaEventDestroy(a), (void)cudaEventDestroy(b);
    for (auto& tail : m_tails) (void)cudaEventDestroy(tail.first);
    if (m_side) {
      (void)cudaStreamSynchronize(m_side);
      (void)cudaEventDestroy(m_ready);
      (void)cudaEventDestroy(m_done);
      (void)cudaStreamDestroy(m_side);
    }
  }
  void abort() noexcept override {
    if (m_store) m_store->leave();
    m_group->abort_all();
  }
  int rank() const override { return m_rank; }
  int size() const override { return m_world; }
  const char* kind() const override { return "nccl"; }

  void all_reduce_sum(const Tensor& buf) override {
    float* p = f32(buf);
    Enqueue q(*this);
    ANATOMY_CUDA_CHECK(ncclAllReduce(p, p, buf.numel(), ncclFloat, ncclSum, m_comm, op_stream()));
  }
  void begin_async() override {
    if (!m_side) {
      ANATOMY_CUDA_CHECK(cudaStreamCreateWithFlags(&m_side, cudaStreamNonBlocking));
      ANATOMY_CUDA_CHECK(cudaEventCreateWithFlags(&m_ready, cudaEventDisableTiming));
      ANATOMY_CUDA_CHECK(cudaEventCreateWithFlags(&m_done, cudaEventDisableTiming));
    }
    m_async = true;
    m_region_first = m_spans.size();
  }
  void end_async() override {
    if (!m_async) return;
    m_async = false;
    if (m_timing && m_spans.size() > m_region_first)  // where the backend's stream got to, against the last collective
      m_tails.push_back({record(m_stream), m_spans.back().second});
    ANATOMY_CUDA_CHECK(cudaEventRecord(m_done, m_side));
    ANATOMY_CUDA_CHECK(cudaStreamWaitEvent(m_stream, m_done, 0));
  }
  bool overlaps() const override { return true; }
  void time_overlap(bool on) override {
    (void)take_overlap();
    m_timing = on;
  }
  OverlapTiming take_overlap() override {
    OverlapTiming t;
    auto ms = [](cudaEvent_t a, cudaEvent_t b) {
      ANATOMY_CUDA_CHECK(cudaEventSynchronize(b));
      float v = 0;
      ANATOMY_CUDA_CHECK(cudaEventElapsedTime(&v, a, b));
      return static_cast<double>(v);
    };
    for (auto [a, b] : m_spans) t.reduce_ms += ms(a, b);
    for (auto [a, b] : m_tails) t.exposed_ms += std::max(0.0, ms(a, b));
    for (auto [a, b] : m_spans) (void)cudaEventDestroy(a), (void)cudaEventDestroy(b);
    for (auto& tail : m_tails) (void)cudaEventDestroy(tail.first);  // .second is a span's
    m_spans.clear();
    m_tails.clear();
    return t;
  }
  void reduce_scatter_sum(const Tensor& buf, const std::vector<ShardRange>& shards) override {
    float* p = f32(buf);
    Enqueue q(*this);
    const cudaStream_t stream = op_stream();
    GroupScope group;
    for (int r = 0; r < m_world; ++r) {
      const ShardRange s = shards[static_cast<size_t>(r)];
      if (s.size() == 0) continue;  // every rank skips the same empty shards
      ANATOMY_CUDA_CHECK(ncclReduce(p + s.begin, p + s.begin, s.size(), ncclFloat, ncclSum, r, m_comm, stream));
    }
  }
  // F32 or a 16-bit type (the half-precision weights: Note [ZeRO gathers half weights] in dist/zero.h).
  void all_gather(const Tensor& buf, const std::vector<ShardRange>& shards) override {
    ANATOMY_CHECK(buf.device == Device::CUDA && (buf.dtype == DType::F32 || buf.dtype == DType::BF16 || buf.dtype == DType::F16),
                  "internal error: NCCL all_gather takes F32, BF16 or F16 device buffers");
    const ncclDataType_t t = buf.dtype == DType::F32 ? ncclFloat : buf.dtype == DType::BF16 ? ncclBfloat16 : ncclHalf;
    char* p = static_cast<char*>(buf.data);
    const size_t es = dtype_size(buf.dtype);
    Enqueue q(*this);
    GroupScope group;
    for (int r = 0; r < m_world; ++r) {
      const ShardRange s = shards[static_cast<size_t>(r)];
      ANATOMY_CUDA_CHECK(ncclBroadcast(p + s.begin * es, p + s.begin * es, s.size(), t, r, m_comm, m_stream));
    }
  }

  // Host values go through a small device buffer: every rank's row is gathered, then combined on
  // the host in rank order (NCCL's own sum order depends on its algorithm).
  void all_reduce_host(std::span<double> v, Op op) override {
    if (v.empty()) return;
    const size_t n = v.size(), w = static_cast<size_t>(m_world);
    double* d = scratch((w + 1) * n);
    std::vector<double> rows(w * n);
    ANATOMY_CUDA_CHECK(cudaMemcpyAsync(d, v.data(), n * sizeof(double), cudaMemcpyHostToDevice, m_stream));
    {
      Enqueue q(*this);
      ANATOMY_CUDA_CHECK(ncclAllGather(d, d + n, n, ncclDouble, m_comm, m_stream));
    }
    ANATOMY_CUDA_CHECK(cudaMemcpyAsync(rows.data(), d + n, w * n * sizeof(double), cudaMemcpyDeviceToHost, m_stream));
    wait_stream("all_reduce_host");
    combine_in_rank_order(v, rows, m_world, op);
  }
  void broadcast_host(std::span<double> v, int root) override {
    ANATOMY_CHECK(root >= 0 && root < m_world, "internal error: broadcast from rank ", root, " of ", m_world);
    if (v.empty()) return;
    double* d = scratch(v.size());
    ANATOMY_CUDA_CHECK(cudaMemcpyAsync(d, v.data(), v.size_bytes(), cudaMemcpyHostToDevice, m_stream));
    {
      Enqueue q(*this);
      ANATOMY_CUDA_CHECK(ncclBroadcast(d, d, v.size(), ncclDouble, root, m_comm, m_stream));
    }
    ANATOMY_CUDA_CHECK(cudaMemcpyAsync(v.data(), d, v.size_bytes(), cudaMemcpyDeviceToHost, m_stream));
    wait_stream("broadcast_host");
  }
  void barrier() override {
    double one = 1.0;
    all_reduce_host(std::span<double>(&one, 1), Op::Sum);
  }

 private:
  // Holds the group's lock while a collective is enqueued, after checking nobody aborted it.
  // Under overlap timing, a collective on the side stream ends its span when it is enqueued.
  struct Enqueue {
    NcclCommunicator& c;
    std::unique_lock<std::mutex> lk;
    explicit Enqueue(NcclCommunicator& comm) : c(comm), lk(comm.m_group->lock()) {
      ANATOMY_CHECK(!c.m_group->aborted[c.m_slot], "nccl: another rank of the group failed (rank ", c.m_rank, " of ",
                    c.m_world, ")");
    }
    ~Enqueue() {
      if (!std::exchange(c.m_span_open, false)) return;
      cudaEvent_t e = nullptr;
      if (cudaEventCreate(&e) == cudaSuccess && cudaEventRecord(e, c.m_side) == cudaSuccess) c.m_spans.back().second = e;
      else c.m_spans.pop_back();  // an untimed collective (the error surfaces at the next CUDA call)
    }
  };
  cudaEvent_t record(cudaStream_t s) {
    cudaEvent_t e = nullptr;
    ANATOMY_CUDA_CHECK(cudaEventCreate(&e));
    ANATOMY_CUDA_CHECK(cudaEventRecord(e, s));
    return e;
  }
  // The stream's work done, or a throw once the group is aborted or NCCL reports an error: a
  // wait that a dead peer cannot turn into a hang.
  void wait_stream(const char* what) {
    while (true) {
      const cudaError_t s = cudaStreamQuery(m_stream);
      if (s == cudaSuccess) return;
      if (s != cudaErrorNotReady) ANATOMY_CUDA_CHECK(s);
      {
        auto lk = m_group->lock();
        ANATOMY_CHECK(!m_group->aborted[m_slot], "nccl ", what, ": another rank of the group failed (rank ", m_rank,
                      " of ", m_world, ")");
        ncclResult_t async = ncclSuccess;
        ANATOMY_CUDA_CHECK(ncclCommGetAsyncError(m_comm, &async));
        ANATOMY_CUDA_CHECK(async);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  double* scratch(size_t n) {
    if (n > m_scratch_n) {
      ANATOMY_CUDA_CHECK(cudaStreamSynchronize(m_stream));  // the old buffer may be in use
      if (m_scratch) ANATOMY_CUDA_CHECK(cudaFree(m_scratch));
      m_scratch = nullptr;
      ANATOMY_CUDA_CHECK(cudaMalloc(&m_scratch, n * sizeof(double)));
      m_scratch_n = n;
    }
    return m_scratch;
  }
  // The stream of the next collective: the backend's, or under begin_async() the side stream,
  // once it has caught up with what the backend's stream holds now.
  cudaStream_t op_stream() {
    if (!m_async) return m_stream;
    ANATOMY_CUDA_CHECK(cudaEventRecord(m_ready, m_stream));
    ANATOMY_CUDA_CHECK(cudaStreamWaitEvent(m_side, m_ready, 0));
    if (m_timing) {
      m_spans.push_back({record(m_side), nullptr});
      m_span_open = true;
    }
    return m_side;
  }
  static float* f32(const Tensor& t) {
    ANATOMY_CHECK(t.dtype == DType::F32 && t.device == Device::CUDA, "internal error: NCCL collectives take F32 device buffers");
    return t.ptr<float>();
  }
  std::shared_ptr<NcclGroupState> m_group;
  size_t m_slot;
  ncclComm_t m_comm;
  cudaStream_t m_stream;
  int m_rank, m_world;
  std::unique_ptr<TcpStore> m_store;
  double* m_scratch = nullptr;  // host collectives; outside the memory plan, like NCCL's own buffers
  size_t m_scratch_n = 0;
  cudaStream_t m_side = nullptr;  // begin_async's stream and its two events
  cudaEvent_t m_ready = nullptr, m_done = nullptr;
  bool m_async = false;
  // Note [overlap timing] in dist/communicator.h: each timed collective's (start, end) events on
  // the side stream; per region, (the backend's stream at end_async, the last collective's end).
  bool m_timing = false, m_span_open = false;
  size_t m_region_first = 0;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> m_spans, m_tails;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<Backend*>& backends) {
  const int world = static_cast<int>(backends.size());
  std::vector<ncclComm_t> comms(backends.size());
  std::vector<int> devs(backends.size());
  for (int r = 0; r < world; ++r) devs[static_cast<size_t>(r)] = r;
  for (Backend* b : backends) ANATOMY_CHECK(b && b->native_stream(), "internal error: an NCCL rank without a CUDA backend");
  ANATOMY_CUDA_CHECK(ncclCommInitAll(comms.data(), world, devs.data()));
  auto group = std::make_shared<NcclGroupState>(std::move(comms));
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < world; ++r)
    out.push_back(std::make_unique<NcclCommunicator>(
        group, static_cast<size_t>(r), static_cast<cudaStream_t>(backends[static_cast<size_t>(r)]->native_stream()), r,
        world));
  return out;
}

// Puts this rank's blocking communicator in `group`'s slot 0, formed through a non-blocking one
// there, which the failure watch may abort meanwhile (Note [non-blocking NCCL] below).
void form_communicator(NcclGroupState& group, const LaunchEnv& env, const ncclUniqueId& id, TcpStore* store) {
  // Whatever ends the forming early (an NCCL error, the deadline, a peer's failure) aborts what
  // slot 0 holds, so that no NCCL thread of it outlives the error.
  struct AbortUnlessFormed {
    NcclGroupState& g;
    const int unwinding = std::uncaught_exceptions();
    ~AbortUnlessFormed() {
      if (std::uncaught_exceptions() > unwinding) g.abort_all();
    }
  } guard{group};
  const auto deadline = std::chrono::steady_clock::now() + env.timeout;
  auto failed = [&](const char* why) {
    const std::string lost = store && group.aborted[0] ? store->failure() : std::string();  // Note [failure watch]
    fail("nccl: the group of ", env.world_size, " did not form: ", lost.empty() ? std::string(why) : lost, " (rank ",
         env.rank, ")");
  };
  ncclConfig_t forming = NCCL_CONFIG_INITIALIZER;
  forming.blocking = 0;
  ncclComm_t formed = nullptr;
  const ncclResult_t started = ncclCommInitRankConfig(&formed, env.world_size, id, env.rank, &forming);
  if (started != ncclInProgress) ANATOMY_CUDA_CHECK(started);
  if (!group.adopt(0, formed)) failed("another rank of the group failed");
  group.settle(0, started, failed, deadline);
  ncclConfig_t blocking = NCCL_CONFIG_INITIALIZER;
  blocking.blocking = 1;
  ncclComm_t comm = nullptr;
  ncclResult_t split = ncclSuccess;
  {
    auto lk = group.lock();
    if (group.aborted[0]) failed("another rank of the group failed");
    split = ncclCommSplit(formed, 0, env.rank, &comm, &blocking);
  }
  // It returns ncclSuccess with the split still running: the forming communicator's state says
  // when it is done (ncclInProgress until then), and `comm` is set by then.
  if (split != ncclInProgress) ANATOMY_CUDA_CHECK(split);
  group.settle(0, ncclInProgress, failed, deadline);
  ANATOMY_CHECK(comm, "internal error: ncclCommSplit gave no communicator (rank ", env.rank, ")");
  {
    auto lk = group.lock();
    if (group.aborted[0]) {  // the forming communicator was aborted with the group
      (void)ncclCommAbort(comm);
      failed("another rank of the group failed");
    }
    group.comms[0] = comm;  // aborted with the group from here on
  }
  ANATOMY_CUDA_CHECK(ncclCommDestroy(formed));
}

// One rank of a process group: NCCL's unique id comes from rank 0 through the bootstrap store
// (Note [bootstrap port] in dist/launch.cpp); the store watches the group from the join on.
//
// Note [non-blocking NCCL]: ncclCommInitRank waits, with no timeout, for every rank to enter it,
// and a blocking one gives no handle to abort: a rank lost after the join (killed, refusing the
// id, or failing in NCCL's own init) left the others there for good. The group is formed by a
// non-blocking communicator (config blocking 0), whose init returns at once and is polled
// (NcclGroupState::settle) until it completes, the failure watch aborts it, or
// ANATOMY_DIST_TIMEOUT passes. It is not the one that trains: NCCL runs every call on a
// non-blocking communicator through a thread of its own (ncclGroupEnd returns ncclInProgress),
// which made the steady step of two ranks 1% slower (bench/results/2026-11-30-h200/session39/).
// Once formed, it is split (ncclCommSplit, itself non-blocking, so polled and abortable alike)
// into a blocking communicator for the collectives, and destroyed.
std::unique_ptr<Communicator> make_nccl_process_group(const LaunchEnv& env, Backend& backend) {
  ANATOMY_CHECK(backend.native_stream(), "internal error: an NCCL rank without a CUDA backend");
  backend.bind_to_thread();  // its device is current for NCCL's init
  ncclUniqueId id;
  std::unique_ptr<TcpStore> store;
  auto group = std::make_shared<NcclGroupState>(std::vector<ncclComm_t>{nullptr}, true);
  if (env.world_size > 1) {
    store = std::make_unique<TcpStore>(env.master_addr, env.bootstrap_port, env.rank == 0, env.timeout);
    store->join(env.rank, env.world_size);
    store->watch([group] { group->abort_all(); });
    std::vector<char> bytes(sizeof id);
    if (env.rank == 0) {
      ANATOMY_CUDA_CHECK(ncclGetUniqueId(&id));
      std::memcpy(bytes.data(), &id, sizeof id);
      store->set("nccl_unique_id", bytes);
    } else {
      bytes = store->get("nccl_unique_id");
      ANATOMY_CHECK(bytes.size() == sizeof id, "bootstrap: NCCL's unique id from ", store->address(), " has ",
                    bytes.size(), " bytes, not ", sizeof id, " (ranks built against different NCCL versions?)");
      std::memcpy(&id, bytes.data(), sizeof id);
    }
  } else {
    ANATOMY_CUDA_CHECK(ncclGetUniqueId(&id));
  }
  form_communicator(*group, env, id, store.get());
  return std::make_unique<NcclCommunicator>(group, 0, static_cast<cudaStream_t>(backend.native_stream()), env.rank,
                                            env.world_size, std::move(store));
}

}  // namespace anatomy
