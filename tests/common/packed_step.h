// One training step of a small irregular encoder (BERT, or ModernBERT: Note [modernbert packed
// tokens]), packed (Note [packed training] in model/bert.cpp) or padded, on any backend: shared
// by the CPU test and its GPU twin.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/dataset.h"
#include "model/bert.h"
#include "model/encoder.h"
#include "model/heads.h"
#include "ops/backend.h"
#include "ops/observer.h"

namespace anatomy::testing_packed {

// Small and deliberately irregular: intermediate 48 < 3 * hidden, so backward's scratch is
// sized by q|k|v, not by the feed-forward.
inline BertConfig config(bool dropout) {
  BertConfig c;
  c.vocab_size = 40;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 48;
  c.max_position_embeddings = 32;
  c.num_labels = 3;
  c.hidden_dropout_prob = dropout ? 0.1 : 0.0;
  c.attention_probs_dropout_prob = dropout ? 0.1 : 0.0;
  return c;
}

// A config's sizes for the GPU's flash attention kernels: hidden 64 over two heads of 32, and
// positions for sequences of 64.
inline BertConfig on_flash_kernels(BertConfig c) {
  c.hidden_size = 64;
  c.num_attention_heads = 2;
  c.max_position_embeddings = 64;
  return c;
}

// The same encoder with a per-token head: "BertForTokenClassification" or "BertForMaskedLM".
inline BertConfig token_config(bool dropout, const std::string& architecture) {
  BertConfig c = config(dropout);
  c.architectures = {architecture};
  return c;
}

// A small ModernBERT of the same sizes: hidden 32 over 4 heads (head dim 8), 3 layers (global,
// local with a window of 2 either side, global), biases everywhere but the norms' (norm_bias
// off, so their beta is the kernels' zero), the head on the mean of the tokens, or per token:
// "ModernBertForSequenceClassification", "ModernBertForTokenClassification" or "ModernBertForMaskedLM".
inline BertConfig modernbert_config(const std::string& architecture, const std::string& pooling = "mean") {
  nlohmann::json j = {{"model_type", "modernbert"}, {"architectures", {architecture}}, {"vocab_size", 40},
                      {"hidden_size", 32}, {"num_hidden_layers", 3}, {"num_attention_heads", 4},
                      {"intermediate_size", 40}, {"max_position_embeddings", 32}, {"pad_token_id", 0},
                      {"global_attn_every_n_layers", 2}, {"local_attention", 4}, {"attention_bias", true},
                      {"mlp_bias", true}, {"norm_bias", false}, {"classifier_bias", true},
                      {"classifier_pooling", pooling}, {"hidden_activation", "gelu"},
                      {"classifier_activation", "gelu"}, {"id2label", {{"0", "a"}, {"1", "b"}, {"2", "c"}}}};
  return BertConfig::from_json(j, "modernbert_config");
}

// Sequence b has lengths[b] tokens ([CLS] words [SEP]), then padding; the per-token labels (for
// a head of `classes` outputs) label every third token and leave the rest -100.
inline HostBatch batch_of(const std::vector<int64_t>& lengths, int64_t T, uint64_t seed, int64_t classes = 3) {
  Rng rng(seed);
  HostBatch hb;
  hb.resize(static_cast<int64_t>(lengths.size()), T);
  for (size_t b = 0; b < lengths.size(); ++b) {
    for (int64_t t = 0; t < lengths[b]; ++t) {
      hb.input_ids[b * T + t] = t == 0 ? 2 : t == lengths[b] - 1 ? 3 : static_cast<int32_t>(rng.randint(5, 40));
      hb.token_type_ids[b * T + t] = t >= lengths[b] / 2 ? 1 : 0;
      hb.attention_mask[b * T + t] = 1;
    }
    hb.labels[b] = static_cast<int32_t>(b % 3);
  }
  hb.token_labels.assign(static_cast<size_t>(hb.batch * T), -100);
  for (size_t b = 0; b < lengths.size(); ++b)
    for (int64_t t = 1; t < lengths[b]; t += 3)
      hb.token_labels[b * T + t] = static_cast<int32_t>(rng.randint(0, classes));
  return hb;
}

// How a packed batch is made: with its sequence offsets when every sequence is right-padded
// (attention on the packed rows, Note [packed attention] in ops/cpu/attention.cpp) or without
// (attention on the padded layout), and the packing's row multiple (padding rows after the tokens).
struct Packing {
  bool attention = true;
  int64_t multiple = 1;
};

struct Uploaded {
  Buffer ids, types, mask, labels, rows, first;
  DeviceBatch db;
  Uploaded(Backend& be, const HostBatch& hb, bool packed, Packing how = {}, bool per_token = false) {
    Allocator& al = be.allocator();
    const int64_t B = hb.batch, T = hb.seq;
    ids = Buffer(al, DType::I32, {B, T}, Category::Other);
    types = Buffer(al, DType::I32, {B, T}, Category::Other);
    mask = Buffer(al, DType::I32, {B, T}, Category::Other);
    be.upload(ids, hb.input_ids.data());
    be.upload(types, hb.token_type_ids.data());
    be.upload(mask, hb.attention_mask.data());
    if (per_token) {  // I32 [B, T] with -100 where unlabelled (Note [masked LM head])
      labels = Buffer(al, DType::I32, {B, T}, Category::Other);
      be.upload(labels, hb.token_labels.data());
    } else {
      labels = Buffer(al, DType::I32, {B}, Category::Other);
      be.upload(labels, hb.labels.data());
    }
    db = DeviceBatch{ids.tensor(), types.tensor(), mask.tensor(), labels.tensor()};
    if (per_token)
      for (int32_t l : hb.token_labels) db.masked_tokens += l != -100;
    if (packed) {
      const PackedRows pr = pack_token_rows(hb.attention_mask.data(), B, T, how.multiple);
      rows = Buffer(al, DType::I32, {static_cast<int64_t>(pr.token_rows.size())}, Category::Other);
      first = Buffer(al, DType::I32, {B + 1}, Category::Other);
      be.upload(rows, pr.token_rows.data());
      db.token_rows = rows.tensor();
      db.first_rows = first.tensor().slice(0, B);
      if (how.attention && pr.right_padded()) {
        be.upload(first, pr.seq_offsets().data());
        db.seq_offsets = first.tensor();
        db.attended_pairs = pr.attended_pairs;
      } else {
        be.upload(db.first_rows, pr.first_rows.data());
      }
    }
  }
};

// What a backend ran, by op: the row copies (scatter_rows, gather_rows), fills and attention
// calls, and the FLOPs the ops report (attention's, rotary's, all): on the packed rows they
// count the real tokens alone.
struct OpTally : OpObserver {
  int copies = 0, fills = 0, attention = 0;
  double attention_flops = 0, rotary_flops = 0, flops = 0;
  void before(Backend&, const OpEvent& e) override {
    const std::string n = e.name;
    copies += n == "scatter_rows" || n == "gather_rows";
    fills += n == "fill";
    attention += n == "attention";
    attention_flops += n == "attention" ? e.cost.flops : 0;
    rotary_flops += n == "rotary" ? e.cost.flops : 0;
    flops += e.cost.flops;
  }
  void after(Backend&, const OpEvent&) override {}
};

struct Step {
  std::vector<float> losses, grads;
};

// One forward_backward of `hb` on a fresh model (seeded weights), packed or padded;
// first_tokens: ModelShape::last_layer_first_tokens.
inline Step step(Backend& be_ref, const BertConfig& cfg, const HostBatch& hb, bool packed, CheckpointPolicy policy,
                 GradientPlacement place, DType compute = DType::F32, Packing how = {}, bool first_tokens = true) {
  Backend* be = &be_ref;
  ModelShape shape;
  shape.last_layer_first_tokens = first_tokens;
  shape.compute = compute;
  shape.max_batch = hb.batch;
  shape.max_seq = hb.seq;
  shape.checkpointing = policy;
  shape.gradients = place;
  shape.packed_tokens = packed;
  const std::unique_ptr<EncoderModel> m = make_model(*be, cfg, shape);
  m->init_weights(7);
  m->set_dropout_seed(11);
  if (!m->gradients_in_activations()) m->zero_grads();
  Uploaded up(*be, hb, packed, how, has_token_labels(cfg));
  m->forward_backward(up.db, 1.0f / static_cast<float>(hb.batch), 0);
  Step s;
  s.losses.resize(static_cast<size_t>(hb.batch));
  be->download(s.losses.data(), m->losses());
  s.grads = m->grads_to_host();
  return s;
}

// The inference forward's logits (forward_eval) of `hb` on a fresh inference model (seeded
// weights), packed or padded: [B, C], or [B*T, C] under a per-token head.
inline std::vector<float> eval_logits(Backend& be, const BertConfig& cfg, const HostBatch& hb, bool packed,
                                      Packing how = {}, bool first_tokens = true, DType compute = DType::F32) {
  ModelShape shape;
  shape.last_layer_first_tokens = first_tokens;
  shape.compute = compute;
  shape.max_batch = hb.batch;
  shape.max_seq = hb.seq;
  shape.training = false;
  const std::unique_ptr<EncoderModel> m = make_model(be, cfg, shape);
  m->init_weights(7);
  Uploaded up(be, hb, packed, how, has_token_labels(cfg));
  m->forward_eval(up.db);
  std::vector<float> out(m->logits().numel());
  if (m->logits().dtype == DType::F32) {
    be.download(out.data(), m->logits());
  } else {  // the compute dtype's logits, widened on the device
    Buffer wide(be.allocator(), DType::F32, m->logits().shape, Category::Other);
    be.cast(wide, m->logits());
    be.download(out.data(), wide);
  }
  return out;
}

}  // namespace anatomy::testing_packed
