// NCCL collectives for ranks that are threads of one process, one CUDA device each. Shards of
// uneven size are done as grouped per-owner reductions and broadcasts (ncclReduce / ncclBroadcast
// in place inside ncclGroupStart/End), which need no padding of the flat buffers.
#include <nccl.h>

#include <atomic>
#include <exception>

#include "dist/communicator.h"
#include "ops/backend.h"
#include "ops/cuda/check.h"

namespace anatomy {

namespace {

// The communicators of one group: any rank that fails aborts them all (a peer blocked in a
// collective with the failed rank returns only when its own communicator is aborted).
struct NcclGroupState {
  std::vector<ncclComm_t> comms;
  std::vector<std::atomic<bool>> aborted;
  explicit NcclGroupState(std::vector<ncclComm_t> c) : comms(std::move(c)), aborted(comms.size()) {}
  void abort_all() noexcept {
    for (size_t r = 0; r < comms.size(); ++r)
      if (!aborted[r].exchange(true)) (void)ncclCommAbort(comms[r]);
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
  NcclCommunicator(std::shared_ptr<NcclGroupState> g, cudaStream_t stream, int rank, int world)
      : m_group(std::move(g)), m_comm(m_group->comms[static_cast<size_t>(rank)]), m_stream(stream), m_rank(rank),
        m_world(world) {}
  ~NcclCommunicator() override {
    if (m_scratch) (void)cudaFree(m_scratch);
    if (!m_group->aborted[static_cast<size_t>(m_rank)].exchange(true)) (void)ncclCommDestroy(m_comm);
  }
  void abort() noexcept override { m_group->abort_all(); }
  int rank() const override { return m_rank; }
  int size() const override { return m_world; }
  const char* kind() const override { return "nccl"; }

  void all_reduce_sum(const Tensor& buf) override {
    float* p = f32(buf);
    ANATOMY_CUDA_CHECK(ncclAllReduce(p, p, buf.numel(), ncclFloat, ncclSum, m_comm, m_stream));
  }
  void reduce_scatter_sum(const Tensor& buf, const std::vector<ShardRange>& shards) override {
    float* p = f32(buf);
    GroupScope group;
    for (int r = 0; r < m_world; ++r) {
      const ShardRange s = shards[static_cast<size_t>(r)];
      ANATOMY_CUDA_CHECK(ncclReduce(p + s.begin, p + s.begin, s.size(), ncclFloat, ncclSum, r, m_comm, m_stream));
    }
  }
  void all_gather(const Tensor& buf, const std::vector<ShardRange>& shards) override {
    float* p = f32(buf);
    GroupScope group;
    for (int r = 0; r < m_world; ++r) {
      const ShardRange s = shards[static_cast<size_t>(r)];
      ANATOMY_CUDA_CHECK(ncclBroadcast(p + s.begin, p + s.begin, s.size(), ncclFloat, r, m_comm, m_stream));
    }
  }

  // Host values go through a small device buffer on this rank's stream (NCCL reduces device
  // memory only); the stream is synchronized so the result is on the host when this returns.
  void all_reduce_host(std::span<double> v, Op op) override {
    double* d = scratch(v.size());
    ANATOMY_CUDA_CHECK(cudaMemcpyAsync(d, v.data(), v.size_bytes(), cudaMemcpyHostToDevice, m_stream));
    const ncclRedOp_t o = op == Op::Sum ? ncclSum : op == Op::Max ? ncclMax : ncclMin;
    ANATOMY_CUDA_CHECK(ncclAllReduce(d, d, v.size(), ncclDouble, o, m_comm, m_stream));
    ANATOMY_CUDA_CHECK(cudaMemcpyAsync(v.data(), d, v.size_bytes(), cudaMemcpyDeviceToHost, m_stream));
    ANATOMY_CUDA_CHECK(cudaStreamSynchronize(m_stream));
  }
  void broadcast_host(std::span<double> v, int root) override {
    double* d = scratch(v.size());
    ANATOMY_CUDA_CHECK(cudaMemcpyAsync(d, v.data(), v.size_bytes(), cudaMemcpyHostToDevice, m_stream));
    ANATOMY_CUDA_CHECK(ncclBroadcast(d, d, v.size(), ncclDouble, root, m_comm, m_stream));
    ANATOMY_CUDA_CHECK(cudaMemcpyAsync(v.data(), d, v.size_bytes(), cudaMemcpyDeviceToHost, m_stream));
    ANATOMY_CUDA_CHECK(cudaStreamSynchronize(m_stream));
  }
  void barrier() override {
    double one = 1;
    all_reduce_host(std::span<double>(&one, 1), Op::Sum);
  }

 private:
  double* scratch(size_t n) {
    if (n > m_scratch_n) {
      if (m_scratch) ANATOMY_CUDA_CHECK(cudaFree(m_scratch));
      m_scratch = nullptr;
      ANATOMY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&m_scratch), n * sizeof(double)));
      m_scratch_n = n;
    }
    return m_scratch;
  }
  static float* f32(const Tensor& t) {
    ANATOMY_CHECK(t.dtype == DType::F32 && t.device == Device::CUDA, "internal error: NCCL collectives take F32 device buffers");
    return t.ptr<float>();
  }
  std::shared_ptr<NcclGroupState> m_group;
  ncclComm_t m_comm;
  cudaStream_t m_stream;
  int m_rank, m_world;
  double* m_scratch = nullptr;  // for the host collectives (a few doubles, outside the plan)
  size_t m_scratch_n = 0;
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
        group, static_cast<cudaStream_t>(backends[static_cast<size_t>(r)]->native_stream()), r, world));
  return out;
}

}  // namespace anatomy
