#include "dist/data_parallel.h"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <optional>
#include <thread>

#include "data/dataset.h"
#include "dist/zero.h"
#include "io/checkpoint.h"
#include "memory/planner.h"
#include "model/bert.h"
#include "model/params.h"
#include "telemetry/nvml.h"
#include "train/staging.h"
#include "train/summary.h"
#include "train/train_data.h"

namespace anatomy {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

void refuse_unsupported(const TrainOptions& o) {
  const char* what = "--nproc-per-node: data parallelism runs on the synthetic datasets for now; drop ";
  ANATOMY_CHECK(o.train_file.empty(), what, "--train-file");
  ANATOMY_CHECK(o.eval_strategy == "no", what, "--eval-strategy");
  ANATOMY_CHECK(o.checkpoint_strategy == "no", what, "--save-strategy ", o.checkpoint_strategy, " (final or no only)");
  ANATOMY_CHECK(o.resume_from_checkpoint.empty(), what, "--resume-from-checkpoint");
  ANATOMY_CHECK(o.profile_steps == 0, what, "--profile-steps");
  ANATOMY_CHECK(o.precision != Precision::Fp16, "--nproc-per-node: --precision fp16 (loss scaling) is single-device; use bf16");
  ANATOMY_CHECK(o.per_device_train_batch_size >= 1, "--nproc-per-node: --per-device-train-batch-size must be a number");
  ANATOMY_CHECK(o.zero_stage == 0 || o.zero_stage == 1, "--zero-stage: expected 0 or 1 (got ", o.zero_stage, ")");
  if (o.zero_stage == 1) Optimizer::range_state_bytes(o.optim.kind, 0);  // adamw or sgd
}

struct RankOut {
  double loss_sum = 0;
  std::vector<double> step_loss;  // per step, this rank's samples
  CategoryBytes peak;
  int64_t nvml_used_mb = -1;  // this rank's device at the end, the model still allocated
  int64_t context_mb = -1;    // NVML growth from creating this rank's backend
  int64_t model_mb = -1;      // ... and from allocating its model and optimizer shard
  std::exception_ptr error;
};

}  // namespace

TrainResult train_data_parallel(const TrainOptions& opt) {
  opt.validate();
  refuse_unsupported(opt);
  const int N = opt.nproc_per_node;
  ANATOMY_CHECK(N >= 1 && N <= 64, "--nproc-per-node: expected 1 to 64 (got ", N, ")");
  BertConfig cfg = model_config(opt);

  const bool want_cuda = opt.device == "cuda" || (opt.device == "auto" && cuda_available());
  ANATOMY_CHECK(!want_cuda || cuda_device_count() >= N, "--nproc-per-node ", N, ": this machine has ", cuda_device_count(),
                " CUDA device(s) (one rank per device; --device cpu runs ranks as threads)");
  const int64_t B = opt.per_device_train_batch_size, T = opt.seq_len, accum = opt.gradient_accumulation_steps;
  const ModelShape shape{B, T, compute_dtype(opt.precision), opt.gradient_checkpointing, true,
                         resolve_gradient_placement(opt.gradient_placement, accum)};
  const PlanInput plan_in{cfg, shape, opt.optim.kind, want_cuda ? Device::CUDA : Device::CPU, N, opt.zero_stage};
  const MemoryPlan mem_plan = plan_memory(plan_in);
  Nvml nvml;
  const int64_t used_before = want_cuda && nvml.memory(0) ? static_cast<int64_t>(nvml.memory(0)->used) : -1;
  // NVML's device r is taken to be CUDA's device r (true without CUDA_VISIBLE_DEVICES reordering).
  if (want_cuda)
    for (int r = 0; r < N; ++r)
      if (auto m = nvml.memory(static_cast<unsigned>(r)))
        ANATOMY_CHECK(mem_plan.total() + (int64_t{256} << 20) <= static_cast<int64_t>(m->free), "--per-device-train-batch-size ",
                      B, ": the plan needs ", mem_plan.total() >> 20, " MiB per device but GPU ", r, " has ", m->free >> 20,
                      " MiB free");

  const TrainData data = load_train_data(opt, cfg);  // the synthetic set, as the trainer builds it
  const int64_t n = static_cast<int64_t>(data.train->size());
  const int64_t micro_per_epoch = n / (N * B);  // whole global batches only
  ANATOMY_CHECK(micro_per_epoch >= accum, "--num-samples ", opt.num_samples, ": too few for one step of ", N, " ranks x ",
                B, " samples x ", accum, " accumulation steps");
  const int64_t steps_per_epoch = micro_per_epoch / accum;
  const int64_t total_steps = opt.total_steps(steps_per_epoch);
  const uint64_t seed = opt.seed;
  std::error_code ec;
  fs::create_directories(opt.output_dir, ec);
  ANATOMY_CHECK(!ec, opt.output_dir, ": cannot create the output directory: ", ec.message());
  fs::remove(fs::path(opt.output_dir) / "train_results.json", ec);  // a run in progress does not look finished

  std::vector<std::unique_ptr<Backend>> backends(static_cast<size_t>(N));
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<RankOut> outs(static_cast<size_t>(N));
  std::vector<double> stamps;
  std::string device_name;
  double runtime = 0;
  std::barrier<> sync(N);
  // A rank that throws leaves the barrier and its group (Communicator::abort); the others stop at
  // their next barrier or collective, and the first error is the one reported.
  std::atomic<bool> failed{false}, comms_ready{false};
  std::atomic<int> first_failed{-1};
  std::fprintf(stderr, "anatomy: data parallel over %d %s ranks, ZeRO stage %d, %s (%lld parameters), %s, batch %lld x %lld ranks x %lld accumulation, seq %lld, %lld steps\n",
               N, want_cuda ? "CUDA" : "CPU", opt.zero_stage,
               opt.model_name_or_path.empty() ? opt.preset.c_str() : opt.model_name_or_path.c_str(),
               static_cast<long long>(ParamLayout::for_sequence_classification(cfg).num_parameters()),
               precision_name(opt.precision), static_cast<long long>(B), static_cast<long long>(N), static_cast<long long>(accum),
               static_cast<long long>(T), static_cast<long long>(total_steps));

  auto rank_main = [&](int r) {
    RankOut& out = outs[static_cast<size_t>(r)];
    auto in_step = [&] {  // every rank reached this point and none has failed
      sync.arrive_and_wait();
      return !failed.load();
    };
    try {
      const int threads = opt.threads > 0 ? opt.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      auto used = [&]() -> int64_t {  // NVML's device r is taken to be CUDA's device r
        auto m = want_cuda ? nvml.memory(static_cast<unsigned>(r)) : std::nullopt;
        return m ? static_cast<int64_t>(m->used >> 20) : -1;
      };
      const int64_t before = used();
      backends[static_cast<size_t>(r)] = want_cuda ? make_cuda_backend(r) : make_cpu_backend(std::max(1, threads / N));
      const int64_t with_backend = used();
      if (before >= 0) out.context_mb = with_backend - before;
      if (!in_step()) return;  // every backend exists
      if (r == 0) {
        std::vector<Backend*> raw;
        for (auto& b : backends) raw.push_back(b.get());
        comms = want_cuda ? make_nccl_group(raw) : make_local_group(N);
        device_name = backends[0]->name();
        comms_ready.store(true, std::memory_order_release);
      }
      if (!in_step()) return;  // the group exists
      Backend& be = *backends[static_cast<size_t>(r)];
      be.bind_to_thread();
      if (opt.precision == Precision::Tf32) be.set_allow_tf32(true);
      Communicator& comm = *comms[static_cast<size_t>(r)];
      {
        BertForSequenceClassification model(be, cfg, shape);
        model.set_dropout_seed(seed);
        model.init_weights(seed);
        if (!opt.model_name_or_path.empty() && fs::exists(fs::path(opt.model_name_or_path) / "model.safetensors"))
          load_pretrained_weights(opt.model_name_or_path, model);
        DataParallelStep dps(be, comm, opt.optim, model.layout(), opt.zero_stage);
        be.synchronize();
        if (with_backend >= 0) out.model_mb = used() - with_backend;
        Allocator& al = be.allocator();
        Buffer ids(al, DType::I32, {B, T}, Category::Other), types(al, DType::I32, {B, T}, Category::Other);
        Buffer mask(al, DType::I32, {B, T}, Category::Other), labels(al, DType::I32, {B}, Category::Other);
        Buffer sums(al, DType::F32, {B}, Category::Other);
        const DeviceBatch db{ids, types, mask, labels};
        HostBatch hb;
        hb.resize(B, T);
        UploadStaging staging(be, B, T);
        std::vector<float> host_sums(static_cast<size_t>(B));
        // Global batches of N x B samples in the one-device trainer's order for that batch size;
        // rank r trains on slice r of each.
        const BatchPlan plan = data.batch_plan(B * N, seed, false);
        be.synchronize();
        if (!in_step()) return;  // every replica is set up
        const auto t0 = Clock::now();
        for (int64_t step = 0; step < total_steps; ++step) {
          if (!model.gradients_in_activations()) model.zero_grads();
          be.fill(sums, 0.0f);
          for (int64_t m = 0; m < accum; ++m) {
            const int64_t micro = step * accum + m;
            const std::vector<size_t> idx = plan.indices(micro / micro_per_epoch, micro % micro_per_epoch);
            for (int64_t i = 0; i < B; ++i) data.train->get(idx[static_cast<size_t>(r * B + i)], hb, i);
            staging.upload(hb, db, micro);  // no host wait between micro-batches
            model.forward_backward(db, 1.0f / static_cast<float>(B * accum * N), static_cast<uint64_t>(micro * N + r) << 12);
            be.add(sums, sums, model.losses());
          }
          ANATOMY_CHECK(!(r == N - 1 && step == opt.fail_last_rank_at_step), "rank ", r, " failed at step ", step,
                        " (injected by the test)");
          const float lr = scheduled_lr(opt.lr_scheduler_type, opt.learning_rate, step, total_steps, opt.warmup(total_steps));
          dps.step(model, lr, opt.max_grad_norm);
          be.download(host_sums.data(), sums);  // also the step's end on this rank
          double s = 0;
          for (float v : host_sums) s += v;
          out.loss_sum += s;
          out.step_loss.push_back(s);
          if (r == 0) {
            stamps.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
            if (opt.logging_steps > 0 && ((step + 1) % opt.logging_steps == 0 || step + 1 == total_steps)) {
              const double el = stamps.back(), sps = static_cast<double>((step + 1) * B * accum * N) / std::max(el, 1e-9);
              std::fprintf(stderr, "step %lld/%lld  loss (rank 0) %.4f  lr %.3g  %.1f samples/s  ETA %.0f s\n",
                           static_cast<long long>(step + 1), static_cast<long long>(total_steps),
                           s / static_cast<double>(B * accum), lr, sps, el / static_cast<double>(step + 1) * static_cast<double>(total_steps - step - 1));
            }
          }
        }
        be.synchronize();
        if (!in_step()) return;  // every rank is done: the step time is the slowest rank's
        out.nvml_used_mb = used();
        if (r == 0) {
          runtime = std::chrono::duration<double>(Clock::now() - t0).count();
          if (opt.save_model) save_pretrained(opt.output_dir, model);
        }
      }
      out.peak = be.allocator().stats().peak();
    } catch (...) {
      out.error = std::current_exception();
      int none = -1;
      first_failed.compare_exchange_strong(none, r);
      failed = true;
      if (comms_ready.load(std::memory_order_acquire)) comms[static_cast<size_t>(r)]->abort();
      sync.arrive_and_drop();
    }
  };
  std::vector<std::thread> pool;
  for (int r = 0; r < N; ++r) pool.emplace_back(rank_main, r);
  for (auto& t : pool) t.join();
  if (first_failed >= 0) std::rethrow_exception(outs[static_cast<size_t>(first_failed.load())].error);

  TrainResult res;
  res.device = str_cat(device_name, N > 1 ? str_cat(" and ", N - 1, " more") : std::string());
  res.steps = total_steps;
  res.samples = total_steps * accum * B * N;
  res.train_runtime = runtime;
  res.train_samples_per_second = static_cast<double>(res.samples) / std::max(runtime, 1e-9);
  res.train_steps_per_second = static_cast<double>(total_steps) / std::max(runtime, 1e-9);
  const size_t half = stamps.size() / 2;
  res.steady_samples_per_second = stamps.size() > 3 ? static_cast<double>((stamps.size() - 1 - half) * B * accum * N) /
                                                          (stamps.back() - stamps[half])
                                                    : res.train_samples_per_second;
  double all = 0;
  for (const RankOut& o : outs) all += o.loss_sum;
  res.train_loss = all / static_cast<double>(std::max<int64_t>(1, res.samples));
  auto step_mean = [&](size_t k) {
    double s = 0;
    for (const RankOut& o : outs) s += o.step_loss[k];
    return s / static_cast<double>(B * accum * N);
  };
  if (total_steps > 0) {
    res.first_loss = step_mean(0);
    res.last_loss = step_mean(static_cast<size_t>(total_steps - 1));
  }
  res.num_parameters = static_cast<int64_t>(ParamLayout::for_sequence_classification(cfg).num_parameters());
  res.peak_bytes = outs[0].peak;
  res.weights_mb = res.peak_bytes[Category::Weights] >> 20;
  res.process_peak_rss_mb = static_cast<int64_t>(process_peak_rss_bytes() >> 20);
  res.world_size = N;
  res.zero_stage = opt.zero_stage;
  for (const RankOut& o : outs) res.rank_optimizer_state_bytes.push_back(o.peak[Category::OptimizerState]);
  if (want_cuda) {
    for (const RankOut& o : outs) res.gpu_memory_per_rank_mb.push_back(o.nvml_used_mb);
    res.gpu_memory_occupied_mb = res.gpu_memory_per_rank_mb[0];
    res.cuda_context_mb = outs[0].context_mb;
    res.model_nvml_mb = outs[0].model_mb;
  }
  write_run_summary(opt, res, mem_plan, cfg, shape, used_before);
  return res;
}

}  // namespace anatomy
