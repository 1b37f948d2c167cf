// What the data-parallel tests share (tests/unit and tests/cuda): a dropout-free model, the run
// options, and the weights a run saved.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dirs.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "model/bert.h"
#include "ops/backend.h"
#include "train/options.h"

namespace anatomy::testing_dp {

using testing_dirs::fresh_dir;

// bert-tiny without dropout (so that a batch split over ranks computes the same gradient as
// one batch), as a model directory with only config.json.
inline std::string dropout_free_model(const std::string& name) {
  const std::string dir = fresh_dir(name);
  BertConfig c = BertConfig::preset("bert-tiny");
  c.hidden_dropout_prob = 0.0;
  c.attention_probs_dropout_prob = 0.0;
  write_file_atomic(dir + "/config.json", c.to_json().dump(2));
  return dir;
}

// A few steps of the learnable task; output in a fresh directory named `out`.
inline TrainOptions options(const std::string& device, const std::string& model, const std::string& out, int world,
                            int64_t batch, int zero) {
  TrainOptions o;
  o.model_name_or_path = model;
  o.device = device == "cpu" ? DeviceChoice::Cpu : DeviceChoice::Cuda;
  o.dataset = "learnable";
  o.seq_len = device == "cpu" ? 32 : 64;
  o.num_samples = device == "cpu" ? 64 : 256;
  o.per_device_train_batch_size = batch;
  o.nproc_per_node = world;
  o.zero_stage = zero;
  o.max_steps = device == "cpu" ? 4 : 6;
  o.logging_steps = 0;
  o.learning_rate = 1e-3f;
  o.disable_progress_bar = true;
  o.output_dir = fresh_dir(out);
  return o;
}

inline std::vector<float> saved_weights(const std::string& dir) {
  auto be = make_cpu_backend(1);
  const BertConfig cfg = BertConfig::from_json_file(dir + "/config.json");
  const std::unique_ptr<EncoderModel> m = make_model(*be, cfg, {1, 8, DType::F32, CheckpointPolicy::None, false});
  load_pretrained_weights(dir, *m);
  return m->master_to_host();
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
  return worst;
}

}  // namespace anatomy::testing_dp
