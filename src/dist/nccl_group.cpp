// NCCL collectives for ranks that are threads of one process, one CUDA device each. Shards of
// uneven size are done as grouped per-owner reductions and broadcasts (ncclReduce / ncclBroadcast
// in place inside ncclGroupStart/End), which need no padding of the flat buffers.
#include <nccl.h>

#include "dist/communicator.h"
#include "ops/backend.h"
#include "ops/cuda/check.h"

namespace anatomy {

namespace {

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, int rank, int world)
      : m_comm(comm), m_stream(stream), m_rank(rank), m_world(world) {}
  ~NcclCommunicator() override { (void)ncclCommDestroy(m_comm); }
  int rank() const override { return m_rank; }
  int size() const override { return m_world; }
  const char* kind() const override { return "nccl"; }

  void all_reduce_sum(const Tensor& buf) override {
    float* p = f32(buf);
    ANATOMY_CUDA_CHECK(ncclAllReduce(p, p, buf.numel(), ncclFloat, ncclSum, m_comm, m_stream));
  }
  void reduce_scatter_sum(const Tensor& buf, const std::vector<ShardRange>& shards) override {
    float* p = f32(buf);
    ANATOMY_CUDA_CHECK(ncclGroupStart());
    for (int r = 0; r < m_world; ++r) {
      const ShardRange s = shards[static_cast<size_t>(r)];
      ANATOMY_CUDA_CHECK(ncclReduce(p + s.begin, p + s.begin, s.size(), ncclFloat, ncclSum, r, m_comm, m_stream));
    }
    ANATOMY_CUDA_CHECK(ncclGroupEnd());
  }
  void all_gather(const Tensor& buf, const std::vector<ShardRange>& shards) override {
    float* p = f32(buf);
    ANATOMY_CUDA_CHECK(ncclGroupStart());
    for (int r = 0; r < m_world; ++r) {
      const ShardRange s = shards[static_cast<size_t>(r)];
      ANATOMY_CUDA_CHECK(ncclBroadcast(p + s.begin, p + s.begin, s.size(), ncclFloat, r, m_comm, m_stream));
    }
    ANATOMY_CUDA_CHECK(ncclGroupEnd());
  }

 private:
  static float* f32(const Tensor& t) {
    ANATOMY_CHECK(t.dtype == DType::F32 && t.device == Device::CUDA, "internal error: NCCL collectives take F32 device buffers");
    return t.ptr<float>();
  }
  ncclComm_t m_comm;
  cudaStream_t m_stream;
  int m_rank, m_world;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<Backend*>& backends) {
  const int world = static_cast<int>(backends.size());
  std::vector<ncclComm_t> comms(backends.size());
  std::vector<int> devs(backends.size());
  for (int r = 0; r < world; ++r) devs[static_cast<size_t>(r)] = r;
  ANATOMY_CUDA_CHECK(ncclCommInitAll(comms.data(), world, devs.data()));
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < world; ++r)
    out.push_back(std::make_unique<NcclCommunicator>(
        comms[static_cast<size_t>(r)], static_cast<cudaStream_t>(backends[static_cast<size_t>(r)]->native_stream()), r, world));
  return out;
}

}  // namespace anatomy
