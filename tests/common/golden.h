// Runs the Hugging Face golden fixture (tests/golden/make_golden.py) through anatomy on any
// backend: the forward, every gradient, and 5 AdamW and SGD steps. Shared by the CPU test
// (tests/unit/test_golden.cpp) and the GPU test (tests/cuda/test_golden_cuda.cpp).
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/bert.h"
#include "model/heads.h"
#include "optim/grad_norm.h"
#include "model/config.h"
#include "optim/optimizer.h"

namespace anatomy::golden {

// ANATOMY_SOURCE_DIR in the environment overrides the build-time path (binaries run elsewhere).
inline std::string dir() {
  const char* env = std::getenv("ANATOMY_SOURCE_DIR");
  return std::string(env ? env : ANATOMY_SOURCE_DIR) + "/tests/data/golden";
}

inline std::vector<float> read_f32(const SafetensorsReader& r, const std::string& name) {
  const auto& info = r.info(name);
  std::vector<float> out(info.numel());
  r.read(name, DType::F32, out.data(), info.shape);
  return out;
}

inline std::vector<int32_t> read_i32(const SafetensorsReader& r, const std::string& name) {
  const auto& info = r.info(name);
  std::vector<uint8_t> raw = r.read_bytes(name);
  std::vector<int32_t> out(info.numel());
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t v;
    std::memcpy(&v, raw.data() + 8 * i, 8);
    out[i] = static_cast<int32_t>(v);
  }
  return out;
}

// ||a - b|| / ||b||
inline double rel_err(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}
inline double cosine(const float* a, const float* b, size_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return -1;
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return ab / std::sqrt(std::max(aa * bb, 1e-60));
}

// What a comparison with a fixture measured, printed as one line by the GPU tests so that a run's
// log holds the numbers beside the bounds: the logits' and the loss's relative error and the
// smallest cosine over the gradients that are not negligible (and where it was).
struct Measured {
  explicit Measured(std::string w) : what(std::move(w)) {}
  std::string what;
  double logits = 0, loss = 0, min_cos = 1;
  std::string at;
  double gradient(const std::string& name, double c) {
    if (c < min_cos) {
      min_cos = c;
      at = name;
    }
    return c;
  }
  ~Measured() {
    std::printf("[measured] %s: logits rel. error %.4f, loss rel. error %.4f, min gradient cosine %.5f (%s)\n",
                what.c_str(), logits, loss, min_cos, at.c_str());
  }
};

// Gradients that are zero in exact arithmetic are rounding noise on both sides: the key bias
// shifts every score of a softmax row by the same q.b_k, so its true gradient is 0. Such a
// gradient (norm below 1e-5 of all gradients together) is compared in absolute terms,
// against tol times the norm of all gradients.
inline double grads_norm(const SafetensorsReader& r, const std::vector<std::string>& names) {
  double s = 0;
  for (const auto& n : names)
    for (float v : read_f32(r, "grad." + n)) s += double(v) * v;
  return std::sqrt(s);
}
inline bool negligible(const std::vector<float>& ref, double total_norm) {
  double s = 0;
  for (float v : ref) s += double(v) * v;
  return std::sqrt(s) < 1e-5 * total_norm;
}
inline double abs_err(const float* a, const float* b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s);
}

// labels holds integer labels (I64 in the file); float_labels the F32 [B, num_labels] ones of
// regression and multi-label (Note [problem types] in model/heads.h), the other one empty.
struct Fixture {
  BertConfig cfg;
  int64_t B = 0, T = 0;
  std::vector<int32_t> ids, types, mask, labels;
  std::vector<float> float_labels;
  SafetensorsReader ref;
  explicit Fixture(const std::string& d)
      : cfg(BertConfig::from_json_file(d + "/config.json")), ref(SafetensorsReader::open(d + "/golden.safetensors")) {
    ids = read_i32(ref, "input_ids");
    types = read_i32(ref, "token_type_ids");
    mask = read_i32(ref, "attention_mask");
    if (ref.info("labels").dtype == DType::F32)
      float_labels = read_f32(ref, "labels");
    else
      labels = read_i32(ref, "labels");
    B = ref.info("input_ids").shape[0];
    T = ref.info("input_ids").shape[1];
  }
};

// The device batch, uploaded into buffers the caller keeps alive: labels I32 [B], F32 [B, C]
// (regression, multi-label), or per token I32 [B, T] (masked-LM, token classification) with the
// count of labelled tokens.
struct Batch {
  Buffer ids, types, mask, labels;
  DeviceBatch db;
  Batch(Backend& be, const Fixture& f)
      : ids(be.allocator(), DType::I32, {f.B, f.T}, Category::Other),
        types(be.allocator(), DType::I32, {f.B, f.T}, Category::Other),
        mask(be.allocator(), DType::I32, {f.B, f.T}, Category::Other),
        labels(be.allocator(), label_dtype(f.cfg), label_shape(f.cfg, f.B, f.T), Category::Other) {
    be.upload(ids, f.ids.data());
    be.upload(types, f.types.data());
    be.upload(mask, f.mask.data());
    if (label_dtype(f.cfg) == DType::F32) {
      ANATOMY_CHECK(f.float_labels.size() == labels.tensor().numel(), "fixture: ", f.float_labels.size(),
                    " float labels for a batch of ", labels.tensor().numel());
      be.upload(labels, f.float_labels.data());
    } else {
      ANATOMY_CHECK(f.labels.size() == labels.tensor().numel(), "fixture: ", f.labels.size(),
                    " labels for a batch of ", labels.tensor().numel());
      be.upload(labels, f.labels.data());
    }
    db = {ids, types, mask, labels};
    if (has_token_labels(f.cfg))
      for (int32_t l : f.labels) db.masked_tokens += l != -100;
  }
};

inline std::vector<float> to_f32(Backend& be, const Tensor& t) {
  std::vector<float> out(t.numel());
  if (t.dtype == DType::F32) {
    be.download(out.data(), t);
    return out;
  }
  std::vector<uint16_t> raw(t.numel());
  be.download(raw.data(), t);
  for (size_t i = 0; i < raw.size(); ++i) out[i] = t.dtype == DType::BF16 ? bf16_to_f32(raw[i]) : f16_to_f32(raw[i]);
  return out;
}

// Loss before each of `steps` optimizer steps with the fixture's recipe (constant lr, clip 1.0).
inline std::vector<float> train_losses(Backend& be, const Fixture& f, DType compute, OptimizerKind kind, int steps) {
  BertForSequenceClassification model(be, f.cfg, {f.B, f.T, compute, CheckpointPolicy::None, true});
  load_pretrained_weights(dir(), model);
  Batch batch(be, f);
  OptimizerOptions oo;
  oo.kind = kind;
  oo.weight_decay = kind == OptimizerKind::AdamW ? 0.01f : 0.0f;
  oo.momentum = 0.9f;
  auto opt = Optimizer::create(be, oo, model.layout());
  GradNorm norm(be, model.layout().total());
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    model.zero_grads();
    model.forward_backward(batch.db, 1.0f / static_cast<float>(f.B), 0);
    std::vector<float> l = to_f32(be, model.losses());
    double mean = 0;
    for (float v : l) mean += v;
    losses.push_back(static_cast<float>(mean / f.B));
    norm.compute(model.grads());
    ParamGroups g{model.master(), compute == DType::F32 ? Tensor() : model.compute_params(), model.grads(),
                  model.layout().decay_end()};
    opt->step(g, GradTransform{norm.norm_sq(), 1.0f, 1.0f}, kind == OptimizerKind::AdamW ? 1e-3f : 1e-2f);
  }
  return losses;
}

}  // namespace anatomy::golden
