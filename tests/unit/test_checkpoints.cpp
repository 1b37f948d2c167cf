// Training checkpoints on the CPU: every optimizer resumes bitwise identically, rotation and
// "latest" see only complete checkpoints, and every damaged checkpoint is a one-line error
// naming the file that leaves model and optimizer untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "io/checkpoint.h"
#include "model/bert.h"
#include "io/safetensors.h"
#include "optim/grad_norm.h"
#include "train/checkpoints.h"

using namespace anatomy;
namespace fs = std::filesystem;

namespace {

BertConfig small_config() {
  BertConfig cfg = BertConfig::preset("bert-tiny");
  cfg.vocab_size = 1000;  // the embedding dominates bert-tiny; keep the tests quick
  return cfg;
}

// A model and optimizer that take deterministic training steps (batch and dropout by step).
struct Trainee {
  static constexpr int64_t B = 4, T = 16;
  Backend& be;
  BertForSequenceClassification model;
  std::unique_ptr<Optimizer> opt;
  Buffer ids, types, mask, labels;
  GradNorm norm;

  Trainee(Backend& b, OptimizerKind kind, uint64_t init_seed)
      : be(b), model(b, small_config(), {B, T, DType::F32, CheckpointPolicy::None, true}),
        ids(b.allocator(), DType::I32, {B, T}, Category::Other), types(b.allocator(), DType::I32, {B, T}, Category::Other),
        mask(b.allocator(), DType::I32, {B, T}, Category::Other), labels(b.allocator(), DType::I32, {B}, Category::Other),
        norm(b, model.layout().total()) {
    model.init_weights(init_seed);
    model.set_dropout_seed(7);
    OptimizerOptions o;
    o.kind = kind;
    o.weight_decay = 0.01f;
    opt = Optimizer::create(b, o, model.layout());
  }

  void step(int64_t k) {
    Rng rng(1000 + static_cast<uint64_t>(k));
    std::vector<int32_t> i(B * T), ty(B * T, 0), m(B * T, 1), l(B);
    for (auto& v : i) v = static_cast<int32_t>(rng.randint(5, 1000));
    for (int64_t b = 0; b < B; ++b) l[b] = static_cast<int32_t>(rng.randint(0, 2));
    be.upload(ids, i.data());
    be.upload(types, ty.data());
    be.upload(mask, m.data());
    be.upload(labels, l.data());
    model.zero_grads();
    model.forward_backward({ids, types, mask, labels}, 1.0f / B, static_cast<uint64_t>(k) << 12);
    norm.compute(model.grads());
    opt->step({model.master(), Tensor(), model.grads(), model.layout().decay_end()}, GradTransform{norm.norm_sq(), 1.0f, 1.0f},
              1e-3f);
  }

  // Each state tensor's bytes, by name.
  std::vector<std::pair<std::string, std::vector<uint8_t>>> state_bytes() {
    std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
    for (const auto& [name, t] : opt->state()) {
      out.emplace_back(name, std::vector<uint8_t>(t.bytes()));
      be.download(out.back().second.data(), t);
    }
    return out;
  }
};

std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::path(testing::TempDir()) / name;
  fs::remove_all(p);
  return p.string();
}

// Bitwise, naming the first tensor that differs (printing megabytes of bytes helps nobody).
void expect_same_state(Trainee& a, Trainee& b) {
  const auto sa = a.state_bytes(), sb = b.state_bytes();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i)
    EXPECT_TRUE(sa[i].first == sb[i].first && sa[i].second == sb[i].second) << "optimizer state " << sa[i].first;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The trainer's part of a checkpoint as the trainer writes it (validate_trainer_state checks it).
nlohmann::json trainer_json(int64_t step, int64_t optimizer_steps, nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json j = {{"global_step", step}, {"skipped_steps", step - optimizer_steps}, {"samples", 4 * step},
                      {"window_samples", 0}, {"loss_scale_clean_steps", 0}, {"loss_sum", 0.0}, {"first_step_loss", 0.0},
                      {"window_loss", 0.0}, {"loss_scale", 1.0}, {"fingerprint", nlohmann::json::object()}};
  j.update(extra);
  return j;
}

// After editing a checkpoint's file on purpose, record its new size and checksum so the
// loader's own checks (not the manifest's) are what the test exercises.
void reseal(const std::string& dir, const std::string& file) {
  const std::string state_path = dir + "/anatomy_state.json";
  nlohmann::json st = nlohmann::json::parse(std::ifstream(state_path));
  st["files"][file] = {{"bytes", static_cast<uint64_t>(fs::file_size(dir + "/" + file))},
                       {"checksum", checkpoint_file_checksum(dir + "/" + file)}};
  std::ofstream(state_path) << st.dump(2);
}

}  // namespace

TEST(Checkpoints, EveryOptimizerResumesBitwise) {
  auto be = make_cpu_backend(2);
  for (OptimizerKind kind : {OptimizerKind::AdamW, OptimizerKind::AdamW8bit, OptimizerKind::Sgd, OptimizerKind::Adafactor}) {
    SCOPED_TRACE(optimizer_name(kind));
    const std::string out = fresh_dir(std::string("anatomy_ckpt_") + optimizer_name(kind));
    Trainee a(*be, kind, 1);
    for (int64_t k = 0; k < 3; ++k) a.step(k);
    const nlohmann::json trainer = trainer_json(3, 3, {{"data_position", 12}, {"rng", {1, 2, 3}}, {"loss_scale", 65536.0}});
    const std::string path = save_training_checkpoint(out, 3, a.model, *a.opt, trainer);
    EXPECT_EQ(path, out + "/checkpoint-3");

    Trainee b(*be, kind, 2);  // different weights, zero state: the load must overwrite all of it
    EXPECT_EQ(load_training_checkpoint(path, b.model, *b.opt), trainer);
    EXPECT_EQ(b.opt->steps(), 3);
    EXPECT_TRUE(a.model.master_to_host() == b.model.master_to_host());
    expect_same_state(a, b);
    for (int64_t k = 3; k < 5; ++k) a.step(k), b.step(k);
    const std::vector<float> wa = a.model.master_to_host(), wb = b.model.master_to_host();
    ASSERT_EQ(wa.size(), wb.size());
    EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)), 0);
    expect_same_state(a, b);
    EXPECT_EQ(a.opt->steps(), b.opt->steps());

    // The weights are an ordinary Hugging Face model directory too.
    Trainee c(*be, kind, 3);
    LoadReport rep = load_pretrained_weights(path, c.model);
    EXPECT_TRUE(rep.newly_initialized.empty() && rep.unused.empty());
  }
}

TEST(Checkpoints, LatestAndRotationSeeOnlyCompleteCheckpoints) {
  auto be = make_cpu_backend(2);
  const std::string out = fresh_dir("anatomy_ckpt_rotate");
  EXPECT_EQ(latest_checkpoint(out), std::nullopt);  // no directory at all
  Trainee a(*be, OptimizerKind::Sgd, 1);
  for (int64_t s : {9, 10}) save_training_checkpoint(out, s, a.model, *a.opt, {});
  EXPECT_EQ(latest_checkpoint(out), out + "/checkpoint-10");  // numeric, not lexicographic

  // Leftovers of crashed runs: staging of a save, the old side of a swap, a removal's trash,
  // each holding a copy of a valid checkpoint; and an empty directory named like a checkpoint.
  for (const char* name : {"checkpoint-11.tmp-abc123", "checkpoint-12.old-def456", ".trash-checkpoint-13"})
    fs::copy(out + "/checkpoint-10", out + "/" + name, fs::copy_options::recursive);
  fs::create_directories(out + "/checkpoint-50");
  EXPECT_EQ(latest_checkpoint(out), out + "/checkpoint-10");
  // A checkpoint whose anatomy_state.json names another step does not count either.
  fs::copy(out + "/checkpoint-10", out + "/checkpoint-40", fs::copy_options::recursive);
  EXPECT_EQ(latest_checkpoint(out), out + "/checkpoint-10");

  for (int64_t s : {2, 11, 12}) save_training_checkpoint(out, s, a.model, *a.opt, {});
  rotate_checkpoints(out, 0);  // keep all; still cleans the leftovers
  EXPECT_FALSE(fs::exists(out + "/checkpoint-11.tmp-abc123"));
  EXPECT_FALSE(fs::exists(out + "/checkpoint-12.old-def456"));
  EXPECT_FALSE(fs::exists(out + "/.trash-checkpoint-13"));
  EXPECT_TRUE(fs::exists(out + "/checkpoint-2"));
  rotate_checkpoints(out, 2);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(out)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"checkpoint-11", "checkpoint-12", "checkpoint-40", "checkpoint-50"}))
      << "incomplete or misnamed checkpoint directories are left alone";
  EXPECT_EQ(latest_checkpoint(out), out + "/checkpoint-12");

  // Saving a step again replaces that checkpoint whole.
  a.step(0);
  save_training_checkpoint(out, 12, a.model, *a.opt, trainer_json(12, a.opt->steps(), {{"again", true}}));
  Trainee b(*be, OptimizerKind::Sgd, 2);
  EXPECT_EQ(load_training_checkpoint(out + "/checkpoint-12", b.model, *b.opt)["again"], true);
  EXPECT_TRUE(a.model.master_to_host() == b.model.master_to_host());
}

TEST(Checkpoints, DamagedCheckpointsFailNamingTheFileAndLoadNothing) {
  auto be = make_cpu_backend(2);
  const std::string out = fresh_dir("anatomy_ckpt_damaged");
  Trainee a(*be, OptimizerKind::AdamW, 1);
  a.step(0);
  const std::string good = save_training_checkpoint(out, 1, a.model, *a.opt, trainer_json(1, 1));
  Trainee sgd(*be, OptimizerKind::Sgd, 1);
  const std::string other = save_training_checkpoint(out, 2, sgd.model, *sgd.opt, trainer_json(2, 0));

  Trainee fresh(*be, OptimizerKind::AdamW, 2);
  const std::vector<float> w0 = fresh.model.master_to_host();
  const auto s0 = fresh.state_bytes();
  auto damaged = [&](const std::string& name) {
    const std::string d = out + "/" + name;
    fs::copy(good, d, fs::copy_options::recursive);
    return d;
  };
  auto expect_fails = [&](const std::string& dir, const std::string& file, const std::string& what) {
    const std::string msg = error_of([&] { load_training_checkpoint(dir, fresh.model, *fresh.opt); });
    EXPECT_NE(msg.find(dir + "/" + file), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_TRUE(fresh.model.master_to_host() == w0) << "weights changed by a failed load";
    EXPECT_TRUE(fresh.state_bytes() == s0) << "optimizer state changed by a failed load";
    EXPECT_EQ(fresh.opt->steps(), 0);
  };

  const std::string truncated = damaged("truncated");
  fs::resize_file(truncated + "/optimizer.safetensors", fs::file_size(truncated + "/optimizer.safetensors") - 100);
  expect_fails(truncated, "optimizer.safetensors", "truncated");
  // Even with a manifest that agrees, the reader refuses the short file.
  reseal(truncated, "optimizer.safetensors");
  expect_fails(truncated, "optimizer.safetensors", "data_offsets");

  const std::string corrupt = damaged("corrupt");
  {
    std::fstream f(corrupt + "/optimizer.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(corrupt + "/optimizer.safetensors") / 2));
    f.put('\x5a');
  }
  expect_fails(corrupt, "optimizer.safetensors", "checksum");

  const std::string missing = damaged("missing");
  {
    SafetensorsReader r = SafetensorsReader::open(good + "/optimizer.safetensors");
    std::vector<uint8_t> m = r.read_bytes("exp_avg");
    write_safetensors(missing + "/optimizer.safetensors", {{"exp_avg", DType::F32, r.info("exp_avg").shape, m.data()},
                                                           {"exp_avg_bogus", DType::F32, r.info("exp_avg").shape, m.data()}},
                      r.metadata());
    reseal(missing, "optimizer.safetensors");
  }
  expect_fails(missing, "optimizer.safetensors", "no tensor named 'exp_avg_sq'");

  const std::string reshaped = damaged("reshaped");
  {
    SafetensorsReader r = SafetensorsReader::open(good + "/optimizer.safetensors");
    std::vector<uint8_t> m = r.read_bytes("exp_avg"), v = r.read_bytes("exp_avg_sq");
    const int64_t n = r.info("exp_avg").shape[0];
    write_safetensors(reshaped + "/optimizer.safetensors",
                      {{"exp_avg", DType::F32, {n}, m.data()}, {"exp_avg_sq", DType::F32, {1, n}, v.data()}}, r.metadata());
    reseal(reshaped, "optimizer.safetensors");
  }
  expect_fails(reshaped, "optimizer.safetensors", "tensor 'exp_avg_sq' is F32 [1, ");

  expect_fails(other, "optimizer.safetensors", "'sgd' optimizer");

  const std::string no_state = damaged("no_state");
  { std::ofstream(no_state + "/anatomy_state.json") << "{\"format_version\": 1, \"st"; }
  expect_fails(no_state, "anatomy_state.json", "not valid JSON");
  // A checkpoint written before Note [two state files] kept anatomy's state as trainer_state.json.
  const std::string legacy = damaged("legacy_name");
  fs::remove(legacy + "/trainer_state.json");
  fs::rename(legacy + "/anatomy_state.json", legacy + "/trainer_state.json");
  Trainee old(*be, OptimizerKind::AdamW, 1);
  EXPECT_NO_THROW(load_training_checkpoint(legacy, old.model, *old.opt));
  EXPECT_TRUE(old.model.master_to_host() == a.model.master_to_host());
  EXPECT_NE(error_of([&] { resolve_resume_path(no_state, out); }).find("--resume-from-checkpoint " + no_state),
            std::string::npos);

  // None of the damaged copies is named checkpoint-<step>; the good ones are the candidates.
  EXPECT_EQ(latest_checkpoint(out), other);
  // The good checkpoint still loads into the same model after all those failures.
  EXPECT_NO_THROW(load_training_checkpoint(good, fresh.model, *fresh.opt));
  EXPECT_TRUE(fresh.model.master_to_host() == a.model.master_to_host());
}

TEST(Checkpoints, ResolveResumePath) {
  auto be = make_cpu_backend(2);
  const std::string out = fresh_dir("anatomy_ckpt_resolve");
  std::string msg = error_of([&] { resolve_resume_path("latest", out); });
  EXPECT_NE(msg.find("--resume-from-checkpoint latest"), std::string::npos) << msg;
  msg = error_of([&] { resolve_resume_path(out + "/nowhere", out); });
  EXPECT_NE(msg.find("--resume-from-checkpoint " + out + "/nowhere"), std::string::npos) << msg;
  Trainee a(*be, OptimizerKind::AdamW, 1);
  const std::string p = save_training_checkpoint(out, 7, a.model, *a.opt, {});
  EXPECT_EQ(resolve_resume_path("latest", out), p);
  EXPECT_EQ(resolve_resume_path(p, "/unused"), p);
  fs::remove(p + "/model.safetensors");
  msg = error_of([&] { resolve_resume_path(p, out); });
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { resolve_resume_path("latest", out); }).find("no complete checkpoint"), std::string::npos);
}
