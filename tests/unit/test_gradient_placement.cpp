// Gradients written into activation memory that backward has finished with (Note [gradients in
// freed activations] in model/bert.cpp): the same gradients as a buffer of their own, the bytes
// the planner predicted, and the savings it claims for bert-large.
#include <gtest/gtest.h>

#include <string>

#include "../common/compare.h"
#include "../common/cli.h"
#include "../common/shared_gradients.h"
#include "test_cpu_util.h"
#include "core/rng.h"
#include "memory/planner.h"
#include "model/bert.h"
#include "model/params.h"
#include "ops/backend.h"
#include "ops/observer.h"

using namespace anatomy;

namespace {

// bert-tiny with three layers and dropout everywhere, so that a gradient written over a saved
// tensor still to be read would change the result.
BertConfig small_config() {
  BertConfig c = BertConfig::preset("bert-tiny");
  c.num_hidden_layers = 3;
  c.hidden_dropout_prob = 0.1;
  c.attention_probs_dropout_prob = 0.1;
  return c;
}

struct HostBatch {
  std::vector<int32_t> ids, types, mask, labels;
};

HostBatch random_batch(Rng& rng, const BertConfig& c, int64_t B, int64_t T) {
  HostBatch h;
  for (int64_t i = 0; i < B * T; ++i) {
    h.ids.push_back(static_cast<int32_t>(rng.randint(1, c.vocab_size)));
    h.types.push_back(static_cast<int32_t>(rng.randint(0, 2)));
    h.mask.push_back(i % T < T - (i / T) ? 1 : 0);  // sequence b has b padding tokens
  }
  for (int64_t b = 0; b < B; ++b) h.labels.push_back(static_cast<int32_t>(rng.randint(0, c.num_labels)));
  return h;
}

struct StepGrads {
  std::vector<float> grads, losses;
  CategoryBytes peak;
  int backward_fills = 0;  // fill ops the model issued in backward
};

struct BackwardFills final : OpObserver {
  int n = 0;
  void before(Backend&, const OpEvent& e) override { n += e.phase == Phase::Backward && std::string(e.name) == "fill"; }
  void after(Backend&, const OpEvent&) override {}
};

// Two forward/backward calls (different dropout) on one model; the gradients after each.
std::vector<StepGrads> run_twice(const BertConfig& cfg, const ModelShape& shape, const HostBatch& hb) {
  auto be = make_cpu_backend(1);
  std::vector<StepGrads> out;
  {
    BertForSequenceClassification model(*be, cfg, shape);
    model.init_weights(7);
    model.set_dropout_seed(11);
    const int64_t B = shape.max_batch, T = shape.max_seq;
    Buffer ids(be->allocator(), DType::I32, {B, T}, Category::Other), types(be->allocator(), DType::I32, {B, T}, Category::Other);
    Buffer mask(be->allocator(), DType::I32, {B, T}, Category::Other), labels(be->allocator(), DType::I32, {B}, Category::Other);
    be->upload(ids, hb.ids.data());
    be->upload(types, hb.types.data());
    be->upload(mask, hb.mask.data());
    be->upload(labels, hb.labels.data());
    const DeviceBatch db{ids, types, mask, labels};
    for (uint64_t call = 0; call < 2; ++call) {
      EXPECT_EQ(model.gradients_in_activations(), shape.gradients == GradientPlacement::InActivations);
      if (!model.gradients_in_activations()) model.zero_grads();
      BackwardFills fills;
      be->set_observer(&fills);
      model.forward_backward(db, 1.0f / static_cast<float>(B), call << 12);
      be->set_observer(nullptr);
      StepGrads r;
      r.backward_fills = fills.n;
      r.grads = model.grads_to_host();
      r.losses.resize(static_cast<size_t>(B));
      be->download(r.losses.data(), model.losses());
      out.push_back(std::move(r));
    }
  }
  out.back().peak = be->allocator().stats().peak();
  return out;
}

}  // namespace

TEST(GradientPlacement, InActivationsGivesTheOwnBuffersGradientsBitForBit) {
  ANATOMY_FRESH_RNG(rng);
  const BertConfig cfg = small_config();
  const HostBatch hb = random_batch(rng, cfg, 3, 24);
  for (CheckpointPolicy pol : {CheckpointPolicy::None, CheckpointPolicy::Selective, CheckpointPolicy::Layer}) {
    SCOPED_TRACE(checkpoint_policy_name(pol));
    ModelShape own{3, 24, DType::F32, pol, true, GradientPlacement::Own};
    ModelShape in = own;
    in.gradients = GradientPlacement::InActivations;
    const std::vector<StepGrads> a = run_twice(cfg, own, hb), b = run_twice(cfg, in, hb);
    for (size_t call = 0; call < 2; ++call) {
      EXPECT_TRUE(testing_compare::same_values(a[call].losses, b[call].losses)) << "call " << call;
      // The second call writes over the first call's gradients: the layers' stored by their GEMMs
      // (Note [layer gradients stored]), the embeddings and the tail zeroed again.
      EXPECT_TRUE(testing_compare::same_values(a[call].grads, b[call].grads)) << "call " << call;
      // Two ranges are zeroed in backward (the tail, the embeddings), none of the layers'.
      EXPECT_EQ(b[call].backward_fills, a[call].backward_fills + 2) << "call " << call;
    }
    EXPECT_FALSE(testing_compare::same_values(a[0].grads, a[1].grads));  // the dropout masks differ between the calls
    // The allocator holds what the planner predicted, including the bytes counted twice.
    const MemoryPlan plan = plan_memory({cfg, in, OptimizerKind::AdamW, Device::CPU});
    const CategoryBytes& peak = b.back().peak;
    EXPECT_GT(plan.bytes.shared, 0);
    EXPECT_EQ(peak.shared, plan.bytes.shared);
    for (Category c : {Category::Weights, Category::Gradients, Category::Activations, Category::Temporary})
      EXPECT_EQ(peak[c], plan.bytes[c]) << category_name(c);
    EXPECT_EQ(peak[Category::Gradients], a.back().peak[Category::Gradients]);  // still 4 bytes/param
    EXPECT_EQ(peak.total(), a.back().peak.total() - plan.bytes.shared);
  }
}

// bert-large at seq 512: nearly all of the 1.25 GiB of fp32 gradients fits into activation memory
// that backward frees (all but about one layer's worth and the embeddings' share).
TEST(GradientPlacement, BertLargeSharesNearlyAllGradientMemory) {
  const BertConfig cfg = BertConfig::preset("bert-large");
  struct Case {
    int64_t batch;
    DType dt;
    CheckpointPolicy pol;
    double min_fraction;
  };
  for (const Case& k : {Case{4, DType::F32, CheckpointPolicy::None, 0.9}, Case{32, DType::BF16, CheckpointPolicy::None, 0.9},
                        Case{32, DType::BF16, CheckpointPolicy::Layer, 0.5}}) {
    SCOPED_TRACE(std::to_string(k.batch) + " " + checkpoint_policy_name(k.pol));
    testing_plan::expect_gradients_shared(cfg, ModelShape{k.batch, 512, k.dt, k.pol, true}, k.min_fraction);
  }
}

TEST(GradientPlacement, AccumulationKeepsAnOwnBuffer) {
  EXPECT_EQ(resolve_gradient_placement("auto", 1), GradientPlacement::InActivations);
  EXPECT_EQ(resolve_gradient_placement("auto", 4), GradientPlacement::Own);
  EXPECT_EQ(resolve_gradient_placement("own", 1), GradientPlacement::Own);
  EXPECT_THROW(resolve_gradient_placement("in-activations", 2), Error);
  EXPECT_THROW(resolve_gradient_placement("sideways", 1), Error);
  // The out-of-memory levers that trade batch for accumulation plan an own buffer.
  const BertConfig cfg = BertConfig::preset("bert-large");
  PlanInput in{cfg, {64, 512, DType::BF16, CheckpointPolicy::None, true, GradientPlacement::InActivations},
               OptimizerKind::AdamW, Device::CUDA};
  for (const Lever& l : levers_that_fit(in, parse_bytes("16GiB", "--gpu-memory"), 0, 1))
    if (l.description.find("accumulation") != std::string::npos) {
      PlanInput t = in;
      t.shape.max_batch = std::stoll(l.description.substr(l.description.find("size ") + 5));
      t.shape.gradients = GradientPlacement::Own;
      EXPECT_EQ(l.total, plan_memory(t).total()) << l.description;
    }
}

TEST(GradientPlacement, CliRefusesInActivationsWithAccumulation) {
  using namespace testing_cli;
  const std::string out = fresh_dir("placement_accum");
  CmdResult r = run_anatomy("train --preset bert-tiny --device cpu --seq-len 16 --num-samples 8 "
                            "--per-device-train-batch-size 2 --gradient-accumulation-steps 2 "
                            "--gradient-placement in-activations --output-dir " + out);
  expect_clean_error(r, "--gradient-placement");
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(out) / "train_results.json"));
}

// Memory over a step (memory_timeline.json): saved activations grow through forward and shrink
// through backward while the gradients are written; live activations and the gradients written
// so far always fit together in the one block (the reason the placement works).
TEST(GradientPlacement, TimelineFitsLiveActivationsAndWrittenGradientsInTheBlock) {
  const BertConfig cfg = BertConfig::preset("bert-large");
  for (CheckpointPolicy pol : {CheckpointPolicy::None, CheckpointPolicy::Selective, CheckpointPolicy::Layer}) {
    SCOPED_TRACE(checkpoint_policy_name(pol));
    ModelShape s{4, 512, DType::F32, pol, true, GradientPlacement::InActivations};
    const ArenaBytes a = model_arena_bytes(cfg, s);
    ASSERT_GT(a.block, 0u);
    const std::vector<LivenessPoint> t = activation_liveness(cfg, s);
    const int64_t all_grads = 4 * static_cast<int64_t>(ParamLayout::for_sequence_classification(cfg).total());
    int64_t prev_grads = 0, peak_acts = 0;
    for (const LivenessPoint& p : t) {
      ASSERT_GE(p.gradient_bytes, prev_grads) << p.label;  // written once, kept to the end
      EXPECT_LE(p.activation_bytes + p.gradient_bytes, static_cast<int64_t>(a.block)) << p.label;
      prev_grads = p.gradient_bytes;
      peak_acts = std::max(peak_acts, p.activation_bytes);
    }
    EXPECT_EQ(t.front().gradient_bytes, 0);
    EXPECT_EQ(t.back().gradient_bytes, all_grads);
    EXPECT_LE(peak_acts, static_cast<int64_t>(a.activations));
    s.gradients = GradientPlacement::Own;
    for (const LivenessPoint& p : activation_liveness(cfg, s)) EXPECT_EQ(p.gradient_bytes, -1) << p.label;
  }
}
