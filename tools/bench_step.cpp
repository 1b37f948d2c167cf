// anatomy_bench_step: does replaying a training step from a CUDA graph beat issuing it op by op?
//
// For each configuration (preset, precision, micro-batch, sequence length) it builds the model and
// AdamW on the GPU with a fixed random device batch, runs warm-up steps, then times with CUDA
// events
//   (a) eager: N steps of zero_grads + forward_backward + gradient norm + AdamW, op by op;
//   (b) graph: the same sequence recorded once (Backend::begin_capture / end_capture) and
//       replayed N times. The replay repeats the recorded arguments: its dropout masks, learning
//       rate and AdamW step count stay those of the captured step (fine for timing, not for
//       training).
// and prints one markdown table: ms/step each way, their ratio, the kernels (graph nodes) per
// step, the host time to enqueue an eager step, and two views of how busy the GPU is in eager
// mode: the replay time over the eager time (an upper bound on the busy fraction, since the
// replay still has small gaps) and NVML's utilization sampled during the eager loop (coarse:
// the fraction of sample periods in which any kernel ran).
//
//   anatomy_bench_step                      # bert-large seq 512: fp32 batch 4, bf16 batch 32
//   anatomy_bench_step --config bert-large:bf16:32:512 --config bert-base:fp16:32:128 --steps 30
//   anatomy_bench_step --config bert-large:bf16:32:512 --gemm-tuning   # Note [gemm tuning] after the warm-up
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "model/bert.h"
#include "optim/grad_norm.h"
#include "model/config.h"
#include "ops/backend.h"
#include "ops/cuda/cuda_backend.h"
#include "optim/optimizer.h"
#include "telemetry/nvml.h"
#include "train/options.h"

using namespace anatomy;

namespace {

struct Config {
  std::string preset = "bert-large", precision = "bf16";
  int64_t batch = 32, seq = 512;
  std::string str() const {
    return str_cat(preset, ":", precision, ":", batch, ":", seq);
  }
};

Config parse_config(const std::string& s) {
  Config c;
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == ':') {
      parts.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  ANATOMY_CHECK(parts.size() == 4, "--config ", s, ": expected preset:precision:batch:seq, e.g. bert-large:bf16:32:512");
  c.preset = parts[0];
  c.precision = parts[1];
  c.batch = std::stoll(parts[2]);
  c.seq = std::stoll(parts[3]);
  ANATOMY_CHECK(c.batch > 0 && c.seq > 0, "--config ", s, ": batch and seq must be positive");
  return c;
}

struct Result {
  Config cfg;
  std::string device;
  double eager_ms = 0, graph_ms = 0, enqueue_ms = 0;
  size_t nodes = 0;
  double nvml_util = -1;  // percent; < 0: unavailable
  float eager_loss = NAN, graph_loss = NAN;
};

// Average NVML GPU utilization over a region, sampled every 20 ms by a helper thread.
class UtilSampler {
 public:
  explicit UtilSampler(const Nvml& nvml, unsigned device) : m_nvml(nvml), m_device(device) {}
  void start() {
    m_stop = false;
    m_sum = 0;
    m_count = 0;
    if (!m_nvml.available()) return;
    m_thread = std::thread([this] {
      while (!m_stop.load()) {
        if (auto u = m_nvml.utilization(m_device)) {
          m_sum += u->gpu;
          ++m_count;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }
  double stop() {
    m_stop = true;
    if (m_thread.joinable()) m_thread.join();
    return m_count ? m_sum / m_count : -1.0;
  }

 private:
  const Nvml& m_nvml;
  unsigned m_device;
  std::thread m_thread;
  std::atomic<bool> m_stop{false};
  double m_sum = 0;
  int64_t m_count = 0;
};

float mean_loss(Backend& be, const Tensor& losses) {
  std::vector<float> h(losses.numel());
  be.download(h.data(), losses);
  double s = 0;
  for (float x : h) s += x;
  return static_cast<float>(s / static_cast<double>(h.size()));
}

Result run(const Config& c, int steps, int warmup, bool tune, const Nvml& nvml) {
  Result r;
  r.cfg = c;
  auto owner = make_cuda_backend(0);
  Backend& be = *owner;
  r.device = be.name();
  auto* cuda_be = dynamic_cast<cuda::CudaBackend*>(&be);
  ANATOMY_CHECK(cuda_be != nullptr, "internal error: make_cuda_backend did not return a CudaBackend");
  const Precision prec = parse_precision(c.precision);
  if (prec == Precision::Tf32) be.set_allow_tf32(true);
  const BertConfig cfg = BertConfig::preset(c.preset);
  ANATOMY_CHECK(c.seq <= cfg.max_sequence_length(), "--config ", c.str(), ": seq exceeds max_position_embeddings ",
                cfg.max_sequence_length());
  const ModelShape shape{c.batch, c.seq, compute_dtype(prec, Device::CUDA), CheckpointPolicy::None, true};
  BertForSequenceClassification model(be, cfg, shape);
  model.init_weights(1);
  model.set_dropout_seed(42);
  OptimizerOptions oo;
  oo.kind = OptimizerKind::AdamW;
  oo.weight_decay = 0.01f;
  auto opt = Optimizer::create(be, oo, model.layout());

  // A fixed random batch (ids, token types 0, every key attended, random labels).
  const int64_t B = c.batch, T = c.seq;
  Allocator& al = be.allocator();
  Buffer ids(al, DType::I32, {B, T}, Category::Other), types(al, DType::I32, {B, T}, Category::Other),
      mask(al, DType::I32, {B, T}, Category::Other), labels(al, DType::I32, {B}, Category::Other);
  GradNorm norm(be, model.layout().total());
  {
    Rng rng(7);
    std::vector<int32_t> h_ids(static_cast<size_t>(B * T)), h_zero(h_ids.size(), 0), h_one(h_ids.size(), 1),
        h_labels(static_cast<size_t>(B));
    for (auto& x : h_ids) x = static_cast<int32_t>(rng.randint(1000, cfg.vocab_size));
    for (auto& x : h_labels) x = static_cast<int32_t>(rng.randint(0, cfg.num_labels));
    be.upload(ids, h_ids.data());
    be.upload(types, h_zero.data());
    be.upload(mask, h_one.data());
    be.upload(labels, h_labels.data());
  }
  const DeviceBatch batch{ids.tensor(), types.tensor(), mask.tensor(), labels.tensor(), Tensor(), Tensor()};
  // fp16: a fixed loss scale and the device-side overflow skip (no host synchronization).
  const float loss_scale = prec == Precision::Fp16 ? 1024.0f : 1.0f;
  const ParamGroups groups{model.master(), shape.compute == DType::F32 ? Tensor() : model.compute_params(),
                           model.grads(), model.layout().decay_end()};
  int64_t k = 0;
  auto step = [&] {
    model.zero_grads();
    model.forward_backward(batch, loss_scale / static_cast<float>(B), static_cast<uint64_t>(k) << 12);
    norm.compute(model.grads());
    GradTransform gt{norm.norm_sq(), 1.0f / loss_scale, 1.0f};
    gt.skip_nonfinite = prec == Precision::Fp16;
    opt->step(groups, gt, 1e-5f);
    ++k;
  };

  for (int i = 0; i < warmup; ++i) step();
  be.synchronize();
  if (tune) {  // as the trainer does after its first step: the activation arena holds nothing now
    const auto [scratch, bytes] = model.activation_memory();
    const std::string report = be.tune_matmuls(scratch, bytes);
    std::fprintf(stderr, "bench_step: --gemm-tuning: %s", report.c_str());
    step();  // once more before timing
    be.synchronize();
  }

  // (a) eager.
  UtilSampler util(nvml, static_cast<unsigned>(cuda_be->device_index()));
  util.start();
  const int e0 = be.timing_mark();
  const auto h0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  const auto h1 = std::chrono::steady_clock::now();
  const int e1 = be.timing_mark();
  be.synchronize();
  r.nvml_util = util.stop();
  r.eager_ms = be.timing_elapsed_ms(e0, e1) / steps;
  r.enqueue_ms = std::chrono::duration<double, std::milli>(h1 - h0).count() / steps;
  r.eager_loss = mean_loss(be, model.losses());

  // (b) one step recorded, replayed `steps` times (after one untimed replay).
  ANATOMY_CHECK(be.begin_capture(), "the CUDA backend could not start a graph recording");
  step();
  be.end_capture();
  r.nodes = cuda_be->captured_nodes();
  be.replay();
  be.synchronize();
  const int g0 = be.timing_mark();
  for (int i = 0; i < steps; ++i) be.replay();
  const int g1 = be.timing_mark();
  be.synchronize();
  r.graph_ms = be.timing_elapsed_ms(g0, g1) / steps;
  r.graph_loss = mean_loss(be, model.losses());
  be.timing_reset();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"anatomy_bench_step: a training step (forward_backward + gradient norm + AdamW) eager vs replayed "
               "from a CUDA graph"};
  std::vector<std::string> configs;
  int steps = 20, warmup = 3;
  bool tune = false;
  app.add_option("--config", configs,
                 "preset:precision:batch:seq (repeatable); default bert-large:fp32:4:512 and bert-large:bf16:32:512");
  app.add_option("--steps", steps, "Timed steps per mode")->capture_default_str();
  app.add_option("--warmup", warmup, "Eager steps before timing (at least 1: sizes the attention scratch)")
      ->capture_default_str();
  app.add_flag("--gemm-tuning", tune, "Time cuBLASLt's candidates after the warm-up (Note [gemm tuning]), as the "
                                      "trainer's --gemm-tuning measure does");
  CLI11_PARSE(app, argc, argv);
  try {
    ANATOMY_CHECK(cuda_available(), "no CUDA device (or this build has no CUDA backend)");
    ANATOMY_CHECK(steps > 0 && warmup > 0, "--steps and --warmup must be positive");
    std::vector<Config> todo;
    for (const auto& s : configs) todo.push_back(parse_config(s));
    if (todo.empty()) todo = {parse_config("bert-large:fp32:4:512"), parse_config("bert-large:bf16:32:512")};
    Nvml nvml;
    std::vector<Result> results;
    for (const Config& c : todo) {
      std::fprintf(stderr, "bench_step: %s (%d warm-up, %d timed steps per mode)...\n", c.str().c_str(), warmup, steps);
      results.push_back(run(c, steps, warmup, tune, nvml));
    }
    std::printf("\n%s. Graph replays repeat the captured step's arguments: dropout masks, learning rate and AdamW "
                "step are fixed by the capture (a timing experiment, not training).\n\n",
                results.front().device.c_str());
    std::printf("| preset | precision | batch | seq | eager ms/step | graph ms/step | eager/graph | kernels/step | "
                "host enqueue ms/step | busy <= graph/eager | NVML util (eager) | loss eager / graph |\n");
    std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (const Result& r : results) {
      char util[32];
      if (r.nvml_util >= 0) std::snprintf(util, sizeof util, "%.0f%%", r.nvml_util);
      else std::snprintf(util, sizeof util, "n/a");
      std::printf("| %s | %s | %lld | %lld | %.2f | %.2f | %.3f | %zu | %.2f | %.1f%% | %s | %.4f / %.4f |\n",
                  r.cfg.preset.c_str(), r.cfg.precision.c_str(), static_cast<long long>(r.cfg.batch),
                  static_cast<long long>(r.cfg.seq), r.eager_ms, r.graph_ms, r.eager_ms / r.graph_ms, r.nodes,
                  r.enqueue_ms, 100.0 * std::min(1.0, r.graph_ms / r.eager_ms), util, r.eager_loss, r.graph_loss);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "anatomy_bench_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
