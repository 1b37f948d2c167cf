// Note [modernbert]: ModernBertForSequenceClassification as transformers computes it (eager
// attention, no dropout), per layer l with input x [B*T, H]:
//   h   = l == 0 ? x : attn_norm(x)                (layer 0's attn_norm is an Identity)
//   qkv = rotary(h Wqkv^T (+b), theta_l)            (q and k rotated; theta global or local)
//   x1  = x + attention(qkv, mask, window_l) Wo^T (+b)
//   y   = mlp_norm(x1); [in | gate] = y Wi^T (+b); out = x1 + (gelu(in) * gate) Wo^T (+b)
// Global layers (l % global_attn_every_n_layers == 0, or layer_types) see every key; local ones
// keys within +-local_attention/2 (Note [local attention window], ops/cpu/attention.cpp). The
// embeddings are norm(tok_embeddings[ids]) (no positions: rotary supplies them); the encoder
// ends in final_norm; the head pools (the first token, or the mean over the attention mask),
// then dense (+b) -> GELU -> norm -> classifier (the per-token heads: Note [modernbert token
// head]). Every LayerNorm has a bias only with norm_bias; without one the kernels get a zero
// beta and its gradient goes to scratch.
#include "model/modernbert.h"

#include <cmath>

#include "core/error.h"
#include "core/rng.h"
#include "model/freed_activations.h"
#include "model/heads.h"
#include "io/safetensors.h"
#include <filesystem>
#include <set>

namespace anatomy {

namespace {

std::string layer_prefix(int l) { return "model.layers." + std::to_string(l) + "."; }

}  // namespace

ParamLayout ParamLayout::for_modernbert(const BertConfig& cfg) {
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, L = cfg.num_hidden_layers;
  const ModernBertFields& m = cfg.modern;
  ParamLayout lay;
  // Matrices first (weight decay), then norms and biases (Note [flat parameter layout]).
  lay.add("model.embeddings.tok_embeddings.weight", {cfg.vocab_size, H}, true);
  for (int l = 0; l < L; ++l) {
    const std::string p = layer_prefix(l);
    lay.add(p + "attn.Wqkv.weight", {3 * H, H}, true);
    lay.add(p + "attn.Wo.weight", {H, H}, true);
    lay.add(p + "mlp.Wi.weight", {2 * I, H}, true);
    lay.add(p + "mlp.Wo.weight", {H, I}, true);
  }
  lay.add("head.dense.weight", {H, H}, true);
  if (!is_masked_lm(cfg)) lay.add("classifier.weight", {cfg.num_labels, H}, true);  // else tok_embeddings, tied
  lay.m_decay_end = lay.m_total;
  auto norm = [&](const std::string& n) {
    lay.add(n + ".weight", {H}, false);
    if (m.norm_bias) lay.add(n + ".bias", {H}, false);
  };
  norm("model.embeddings.norm");
  for (int l = 0; l < L; ++l) {
    const std::string p = layer_prefix(l);
    if (l > 0) norm(p + "attn_norm");
    if (m.attention_bias) {
      lay.add(p + "attn.Wqkv.bias", {3 * H}, false);
      lay.add(p + "attn.Wo.bias", {H}, false);
    }
    norm(p + "mlp_norm");
    if (m.mlp_bias) {
      lay.add(p + "mlp.Wi.bias", {2 * I}, false);
      lay.add(p + "mlp.Wo.bias", {H}, false);
    }
  }
  norm("model.final_norm");
  if (m.classifier_bias) lay.add("head.dense.bias", {H}, false);
  norm("head.norm");
  if (!is_masked_lm(cfg))
    lay.add("classifier.bias", {cfg.num_labels}, false);
  else if (m.decoder_bias)
    lay.add("decoder.bias", {cfg.vocab_size}, false);
  return lay;
}

struct ModernBertForSequenceClassification::Acts {
  struct Layer {
    Tensor x, h, rstd_a, qkv, ctx, lse, x1, y, rstd_m, wi, g;
  };
  std::vector<Layer> layers;
  // --gradient-checkpointing layer: layers[l] keeps only x; every other tensor of a layer lives
  // here, in backward's scratch, written by forward and again by backward's recompute.
  Layer work;
  bool recompute = false;
  // --gradient-checkpointing selective: no layer keeps g; it lives in backward's scratch
  // (Note [modernbert selective recompute]).
  bool selective = false;
  Layer at(size_t l) const {
    if (!recompute) return layers[l];
    Layer v = work;
    v.x = layers[l].x;
    return v;
  }
  Tensor emb, rstd_e, xl, xf, rstd_f, pooled, hd, ga, hh, rstd_h, logits, dlogits, losses;
  // Note [modernbert packed tokens]: this forward runs the encoder on the batch's n token rows
  // (n = B*T when padded); ids holds their token ids (I32, used by packed batches), enc the
  // encoder's output as the head reads it.
  bool packed = false;
  int64_t n = 0;
  Tensor ids, enc;
  // Note [modernbert first tokens]: this training step runs the last layer past attention, the
  // final norm and the pooling on the first tokens alone; first_ctx [B, H] their context (cls_ctx,
  // the training layout's, or the pooling's buffer in the packed evaluation).
  bool first_tokens = false;
  Tensor cls_ctx, first_ctx;
  Tensor final_out;  // the final norm's output rows this forward: xf's, or on the first tokens pooled_c
  // The pooled head in fp32 (Note [modernbert fp32 pooled head]): the pooling's output and
  // backward's input in the compute dtype (the F32 tensors themselves in fp32).
  Tensor pooled_c, dpooled_c;
  // Scratch: forward's branch outputs (t1, t2), LayerNorm's mean, the zero beta of norms
  // without a bias and the sink of their beta gradient.
  Tensor t1, t2, mean_scratch, zero_beta, dbeta_scratch;
  // Backward scratch.
  Tensor da, db, t3, dqkv, dg, dwi, dxf, dpooled, dhd, dhh;
};

namespace {

// The head runs on every token (Note [modernbert token head]) rather than on the pooled one.
bool token_head(const BertConfig& cfg) { return has_token_labels(cfg); }

// The head's output width and its last linear layer (Note [modernbert token head]): the masked-LM
// decoder is tied to the token embeddings.
int64_t head_outputs(const BertConfig& cfg) { return is_masked_lm(cfg) ? cfg.vocab_size : cfg.num_labels; }
const char* output_weight(const BertConfig& cfg) {
  return is_masked_lm(cfg) ? "model.embeddings.tok_embeddings.weight" : "classifier.weight";
}
const char* output_bias(const BertConfig& cfg) { return is_masked_lm(cfg) ? "decoder.bias" : "classifier.bias"; }

bool mean_pooling(const BertConfig& cfg) { return !token_head(cfg) && cfg.modern.classifier_pooling != "cls"; }

// Note [modernbert first tokens]: BERT's Note [last layer on the first tokens] for ModernBERT's
// head on the first token (classifier_pooling "cls"). In a training step the last layer runs its
// attention norm, q|k|v and rotary on every token and attention for each sequence's first query
// (its scope: attention_of), then gathers the first tokens' context and input rows; its output
// projection, residual, MLP norm, MLP and residual run on B rows, and so does the final norm,
// which writes the pooled rows itself. Backward starts from the pooled gradient on those rows and
// scatters d ctx and the residual's gradient into zeroed rows for attention's backward. The other
// rows' gradients are exactly zero in the full computation, so the loss and gradients are the same
// up to the GEMMs' summation order. The layer's tensors keep
// their B*T rows (one [B, H] tensor more, the context): fewer FLOPs, not fewer bytes (the same
// tensors serve forward_eval, which keeps the padded hidden state). The packed evaluation (no
// hidden state) does the same, the context in the pooling's buffer (written after the layer has
// read it). Not under mean pooling or a per-token head.
bool first_tokens_apply(const BertConfig& cfg, const ModelShape& s) {
  return s.last_layer_first_tokens && !token_head(cfg) && !mean_pooling(cfg);
}


using freed::kAfterBackward;
using freed::kStageHead;
using freed::stage_of_embeddings;
using freed::stage_of_layer;

// A byte range of the activation arena: the step of forward that writes it (0 the embeddings,
// 1 + l layer l, L + 1 the head) and the last stage of backward that reads it.
struct SavedRegion {
  size_t begin, end;
  int64_t written;
  int last_stage;
};

// Every tensor of a batch [B, T] in the arenas (Note [allocation policy] in bert.cpp): saved
// activations in the compute dtype `dt` (LayerNorm and attention statistics, losses in F32);
// the training layout adds dlogits and backward's scratch. The activations are carved in the
// order of Note [modernbert gradients in freed activations]: what outlives backward, the head,
// the embeddings, then layer by layer (each with its output, the next layer's input). `regions`
// (optional) receives the arena's byte ranges with their writers and last readers.
void carve_modernbert(ModernBertForSequenceClassification::Acts& A, Arena& act, Arena& tmp, const BertConfig& cfg,
                      DType dt, CheckpointPolicy policy, int64_t B, int64_t T, bool training, bool first_tokens,
                      std::vector<SavedRegion>* regions = nullptr) {
  const int64_t R = B * T, H = cfg.hidden_size, I = cfg.intermediate_size, heads = cfg.num_attention_heads;
  const int64_t L = cfg.num_hidden_layers, C = head_outputs(cfg), N = token_head(cfg) ? R : B;  // the head's rows
  constexpr DType F32 = DType::F32;
  size_t mark = 0;
  auto open = [&] { mark = act.used(); };
  auto close = [&](int64_t written, int last_stage) {
    if (regions) regions->push_back({mark, act.used(), written, last_stage});
  };
  // The head: what outlives backward, what the masked-LM decoder's weight gradient reads after
  // the embeddings' backward (Note [modernbert gradients in freed activations]), the rest.
  const DType hdt = token_head(cfg) ? dt : F32;  // Note [modernbert fp32 pooled head]
  open();
  A.logits = act.take(hdt, {N, C}), A.losses = act.take(F32, {B});
  close(L + 1, kAfterBackward);
  open();
  if (training) A.dlogits = act.take(hdt, {N, C});
  A.hh = act.take(hdt, {N, H});
  close(L + 1, is_masked_lm(cfg) ? stage_of_embeddings(L) : kStageHead);
  open();
  A.xf = act.take(dt, {B, T, H}), A.rstd_f = act.take(F32, {R});
  if (!token_head(cfg)) A.pooled = act.take(F32, {B, H});
  A.hd = act.take(hdt, {N, H}), A.ga = act.take(hdt, {N, H}), A.rstd_h = act.take(F32, {N});
  close(L + 1, kStageHead);
  // The embeddings: the looked-up rows (read by their LayerNorm alone: backward reads its
  // output), then the statistics and the output, layer 0's input.
  A.layers.assign(static_cast<size_t>(L), {});
  open();
  A.emb = act.take(dt, {R, H});
  close(0, -1);
  open();
  A.rstd_e = act.take(F32, {R});
  A.layers[0].x = act.take(dt, {R, H});
  A.ids = act.take(DType::I32, {R});  // a packed batch's token ids (any model may evaluate packed batches)
  close(0, stage_of_embeddings(L));
  A.recompute = policy == CheckpointPolicy::Layer;
  A.selective = training && policy == CheckpointPolicy::Selective;
  // A layer's tensors after its input x: in the activations, or once in the scratch (Layer).
  auto internals = [&](ModernBertForSequenceClassification::Acts::Layer& Ly, Arena& a, bool norm) {
    if (norm) Ly.h = a.take(dt, {R, H}), Ly.rstd_a = a.take(F32, {R});
    Ly.qkv = a.take(dt, {B, T, 3 * H});
    Ly.ctx = a.take(dt, {B, T, H});
    Ly.lse = a.take(F32, {B, heads, T});
    Ly.x1 = a.take(dt, {R, H});
    Ly.y = a.take(dt, {R, H});
    Ly.rstd_m = a.take(F32, {R});
    Ly.wi = a.take(dt, {R, 2 * I});
    if (!A.selective) Ly.g = a.take(dt, {R, I});
  };
  // Each layer's output is written by its forward (again by its recompute under Layer) and
  // read by the next layer's: it belongs to the layer that writes it.
  for (int64_t l = 0; l < L; ++l) {
    open();
    if (!A.recompute) internals(A.layers[static_cast<size_t>(l)], act, l > 0);
    (l + 1 < L ? A.layers[static_cast<size_t>(l) + 1].x : A.xl) = act.take(dt, {R, H});
    if (first_tokens && l + 1 == L) A.cls_ctx = act.take(dt, {B, H});  // read by the layer's backward
    close(l + 1, stage_of_layer(l, L));
  }
  if (A.recompute) internals(A.work, tmp, true);
  A.t1 = tmp.take(dt, {R, H}), A.t2 = tmp.take(dt, {R, H}), A.mean_scratch = tmp.take(F32, {R});
  A.zero_beta = tmp.take(F32, {H}), A.dbeta_scratch = tmp.take(F32, {H});
  if (!token_head(cfg)) A.pooled_c = dt == F32 ? A.pooled : tmp.take(dt, {B, H});
  if (!training) return;
  A.da = tmp.take(dt, {R, H}), A.db = tmp.take(dt, {R, H}), A.t3 = tmp.take(dt, {R, H});
  A.dqkv = tmp.take(dt, {B, T, 3 * H}), A.dg = tmp.take(dt, {R, I}), A.dwi = tmp.take(dt, {R, 2 * I});
  if (A.selective)  // Note [modernbert selective recompute]
    for (auto& Ly : A.layers) Ly.g = ParamLayout::range(A.dwi, 0, {R, I});
  A.dxf = tmp.take(dt, {B, T, H});
  if (!token_head(cfg)) {
    A.dpooled = tmp.take(F32, {B, H});
    A.dpooled_c = dt == F32 ? A.dpooled : tmp.take(dt, {B, H});
  }
  A.dhd = tmp.take(hdt, {N, H}), A.dhh = tmp.take(hdt, {N, H});
}

// The flat gradients' stages (elements): the token embeddings, each layer's four matrices, then
// the head's matrices and every vector (adjacent: the layout puts matrices first).
std::vector<std::pair<size_t, size_t>> modernbert_stages(const BertConfig& cfg, const ParamLayout& lay) {
  std::vector<std::pair<size_t, size_t>> st;
  const ParamInfo& emb = lay.get("model.embeddings.tok_embeddings.weight");
  st.emplace_back(emb.offset, emb.offset + emb.numel());
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const ParamInfo& last = lay.get(layer_prefix(l) + "mlp.Wo.weight");
    st.emplace_back(lay.get(layer_prefix(l) + "attn.Wqkv.weight").offset, last.offset + last.numel());
  }
  st.emplace_back(lay.get("head.dense.weight").offset, lay.total());
  for (size_t i = 1; i < st.size(); ++i)
    ANATOMY_ASSERT(st[i].first == st[i - 1].second);
  return st;
}

// The backward stage that first writes each of modernbert_stages' ranges: the embeddings last,
// the tail (the head's matrices and every vector, each layer adding its own) first.
int stage_of_range(size_t i, int64_t L) {
  if (i == 0) return stage_of_embeddings(L);
  return i <= static_cast<size_t>(L) ? stage_of_layer(static_cast<int64_t>(i) - 1, L) : kStageHead;
}

// Note [modernbert gradients in freed activations]: BERT's placement (Note [gradients in freed
// activations] in bert.cpp) for ModernBERT's tensors: with one micro-batch per step the fp32
// gradients live inside the activation arena, each of modernbert_stages' ranges over
// activations that backward has read for the last time before the range's stage begins, at the
// lowest 256-byte aligned offset where that holds for every range (freed::gradient_offset, the
// search BERT's placement runs). Each range is made whole at its stage (the tail and the
// embeddings zeroed just before, a layer's four matrices stored by their GEMMs: Note [layer
// gradients stored] in bert.cpp) and then holds until the next forward. The arena is carved so
// that the freed memory is at the top and grows downwards as backward walks down the layers:
// first what outlives backward (logits, losses), then the head, the embeddings, and the layers
// in order, each with its output. One difference from the order of the step: the masked-LM decoder's weight is the token embeddings, whose
// range is written last, so the decoder's weight gradient (dlogits^T h) waits until after the
// embeddings' backward, with dlogits and h kept until then (and so in every placement: the
// gradients are the same bits in both).
//
// modernbert_stages' ranges with the stage that first writes each.
std::vector<freed::GradRange> gradient_ranges(const BertConfig& cfg, const ParamLayout& lay) {
  const std::vector<std::pair<size_t, size_t>> ranges = modernbert_stages(cfg, lay);
  std::vector<freed::GradRange> out;
  for (size_t i = 0; i < ranges.size(); ++i)
    out.push_back({ranges[i].first, ranges[i].second, stage_of_range(i, cfg.num_hidden_layers)});
  return out;
}

}  // namespace

ArenaBytes modernbert_arena_bytes(const BertConfig& cfg, const ModelShape& s) {
  Arena act = Arena::dry(), tmp = Arena::dry();
  ModernBertForSequenceClassification::Acts a;
  std::vector<SavedRegion> regions;
  carve_modernbert(a, act, tmp, cfg, s.compute, s.checkpointing, s.max_batch, s.max_seq, s.training,
                   s.training && first_tokens_apply(cfg, s), &regions);
  ArenaBytes out{act.used(), tmp.used(), 0, 0};
  if (s.training && s.gradients == GradientPlacement::InActivations) {
    const ParamLayout lay = ParamLayout::for_modernbert(cfg);
    const size_t q = freed::gradient_offset(regions, gradient_ranges(cfg, lay));
    if (q < out.activations) {  // otherwise nothing would be shared: the gradients keep a buffer of their own
      out.gradient_offset = q;
      out.block = std::max(out.activations, q + 4 * lay.total());
    }
  }
  return out;
}

// Forward writes a region at its step; during a stage of backward, what that stage and later
// ones still read is live (the arena keeps the rest until the next forward). With the gradients
// in the activations, the ranges written so far.
std::vector<LivenessPoint> modernbert_liveness(const BertConfig& cfg, const ModelShape& s) {
  Arena act = Arena::dry(), tmp = Arena::dry();
  ModernBertForSequenceClassification::Acts a;
  std::vector<SavedRegion> regions;
  carve_modernbert(a, act, tmp, cfg, s.compute, s.checkpointing, s.max_batch, s.max_seq, true,
                   first_tokens_apply(cfg, s), &regions);
  const int64_t L = cfg.num_hidden_layers;
  auto written_by = [&](int64_t step) {
    int64_t n = 0;
    for (const SavedRegion& r : regions)
      if (r.written <= step) n += static_cast<int64_t>(r.end - r.begin);
    return n;
  };
  auto read_from = [&](int stage) {
    int64_t n = 0;
    for (const SavedRegion& r : regions)
      if (r.last_stage >= stage) n += static_cast<int64_t>(r.end - r.begin);
    return n;
  };
  const bool in_acts = s.gradients == GradientPlacement::InActivations && modernbert_arena_bytes(cfg, s).block != 0;
  const std::vector<freed::GradRange> ranges = gradient_ranges(cfg, ParamLayout::for_modernbert(cfg));
  auto grads_by = [&](int stage) -> int64_t {  // ranges first written at or before `stage`
    if (!in_acts) return -1;
    int64_t n = 0;
    for (const freed::GradRange& g : ranges)
      if (g.stage <= stage) n += static_cast<int64_t>(4 * (g.end - g.begin));
    return n;
  };
  std::vector<LivenessPoint> out;
  out.push_back({"embeddings forward", written_by(0), grads_by(-1)});
  for (int64_t l = 0; l < L; ++l) out.push_back({str_cat("layer ", l, " forward"), written_by(l + 1), grads_by(-1)});
  out.push_back({"head forward", written_by(L + 1), grads_by(-1)});
  out.push_back({"head backward", read_from(kStageHead), grads_by(kStageHead)});
  for (int64_t l = L - 1; l >= 0; --l) {
    const int st = stage_of_layer(l, L);
    out.push_back({str_cat("layer ", l, " backward"), read_from(st), grads_by(st)});
  }
  const int emb = stage_of_embeddings(L);
  out.push_back({"embeddings backward", read_from(emb), grads_by(emb)});
  out.push_back({"optimizer step", read_from(kAfterBackward), grads_by(emb)});
  return out;
}

ModernBertForSequenceClassification::ModernBertForSequenceClassification(Backend& be, const BertConfig& cfg,
                                                                         const ModelShape& shape)
    : m_be(be), m_cfg(cfg), m_layout(ParamLayout::for_modernbert(cfg)), m_shape(shape) {
  ANATOMY_CHECK(cfg.is_modernbert(), "ModernBertForSequenceClassification: model_type is ", cfg.model_type());
  cfg.validate("config");
  ANATOMY_CHECK(shape.max_batch > 0, "--per-device-train-batch-size must be at least 1");
  ANATOMY_CHECK(shape.max_seq > 0 && shape.max_seq <= cfg.max_sequence_length(), "--max-seq-length ", shape.max_seq,
                " must be between 1 and ", cfg.max_sequence_length(), " (max_position_embeddings)");
  ANATOMY_CHECK(!(shape.packed_tokens && shape.checkpointing == CheckpointPolicy::Layer),
                "training on real tokens does not combine with --gradient-checkpointing layer (use selective or none)");
  ANATOMY_CHECK(!shape.fp8, "--precision fp8 covers the BERT family (bert, roberta, xlm-roberta, distilbert, electra); "
                            "train ModernBERT with --precision bf16");
  // Where the step finds each parameter (transformers' names; a bias only where the config has it).
  auto params_of = [&](const std::string& name) {
    return Params{&m_layout.get(name + ".weight"), m_layout.find(name + ".bias")};
  };
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = layer_prefix(l);
    LayerParams lp;
    if (l > 0) lp.attn_norm = params_of(p + "attn_norm");
    lp.wqkv = params_of(p + "attn.Wqkv");
    lp.attn_wo = params_of(p + "attn.Wo");
    lp.mlp_norm = params_of(p + "mlp_norm");
    lp.wi = params_of(p + "mlp.Wi");
    lp.mlp_wo = params_of(p + "mlp.Wo");
    m_layer_params.push_back(lp);
  }
  m_tok_embeddings = &m_layout.get("model.embeddings.tok_embeddings.weight");
  m_emb_norm = params_of("model.embeddings.norm");
  m_final_norm = params_of("model.final_norm");
  m_head_dense = params_of("head.dense");
  m_head_norm = params_of("head.norm");
  m_head_out = Params{&m_layout.get(output_weight(cfg)), m_layout.find(output_bias(cfg))};
  Allocator& a = be.allocator();
  const auto n = static_cast<int64_t>(m_layout.total());
  m_master = Buffer(a, DType::F32, {n}, Category::Weights);
  be.fill(m_master, 0.0f);
  if (shape.compute != DType::F32) {
    m_compute = Buffer(a, shape.compute, {n}, Category::Weights);
    m_compute_view = m_compute.tensor();
  } else {
    m_compute_view = m_master.tensor();
  }
  const ArenaBytes bytes = modernbert_arena_bytes(cfg, shape);  // Note [modernbert gradients in freed activations]
  freed::place_activations(a, bytes, n, shape.training, m_act_block, m_grads, m_act_arena, m_grads_view);
  if (shape.training) {
    be.fill(m_grads_view, 0.0f);
    m_grad_ranges = modernbert_stages(cfg, m_layout);
  }
  sync_compute_copy();
  m_tmp_arena = Arena(a, bytes.temporary, Category::Temporary);
  m_acts = std::make_unique<Acts>();
  carve_modernbert(*m_acts, m_act_arena, m_tmp_arena, cfg, shape.compute, shape.checkpointing, shape.max_batch,
                   shape.max_seq, shape.training, shape.training && first_tokens_apply(cfg, shape));
  be.fill(m_acts->zero_beta, 0.0f);
}

ModernBertForSequenceClassification::~ModernBertForSequenceClassification() = default;

void ModernBertForSequenceClassification::set_master_from_host(const std::vector<float>& flat) {
  ANATOMY_CHECK(flat.size() == m_layout.total(), "set_master_from_host: ", flat.size(), " values for ",
                m_layout.total());
  m_be.upload(m_master, flat.data());
  sync_compute_copy();
}
std::vector<float> ModernBertForSequenceClassification::master_to_host() {
  std::vector<float> v(m_layout.total());
  m_be.download(v.data(), m_master);
  return v;
}
std::vector<float> ModernBertForSequenceClassification::grads_to_host() {
  std::vector<float> v(m_layout.total());
  m_be.download(v.data(), m_grads_view);
  return v;
}
void ModernBertForSequenceClassification::sync_compute_copy() {
  if (m_compute.data()) m_be.cast(m_compute.tensor(), m_master.tensor());
}
void ModernBertForSequenceClassification::zero_grads() {
  if (m_grads_view.defined()) m_be.fill(m_grads_view, 0.0f);
}
void ModernBertForSequenceClassification::zero_grad_range(const std::pair<size_t, size_t>& r) {
  m_be.fill(ParamLayout::range(m_grads_view, r.first, {static_cast<int64_t>(r.second - r.first)}), 0.0f);
}

std::vector<std::string> ModernBertForSequenceClassification::layernorm_weights_below(float limit) {
  std::vector<std::string> out;
  for (const ParamInfo& p : m_layout.params()) {
    if (p.name.find("norm.weight") == std::string::npos) continue;
    std::vector<float> v(p.numel());
    m_be.download(v.data(), m_layout.view(m_master.tensor(), p));
    for (float x : v)
      if (std::fabs(x) < limit) {
        out.push_back(p.name);
        break;
      }
  }
  return out;
}

void ModernBertForSequenceClassification::init_weights(uint64_t seed) {
  std::vector<float> flat(m_layout.total(), 0.0f);
  Rng rng(seed);
  for (const ParamInfo& p : m_layout.params()) {
    const bool norm = p.name.find("norm.weight") != std::string::npos;
    for (size_t i = 0; i < p.numel(); ++i)
      flat[p.offset + i] = p.decay ? static_cast<float>(rng.normal() * m_cfg.initializer_range) : norm ? 1.0f : 0.0f;
  }
  set_master_from_host(flat);
}

// ---- building blocks -------------------------------------------------------------------------------
void ModernBertForSequenceClassification::linear(const Tensor& y, const Tensor& x, const Params& p) {
  if (p.bias)
    m_be.matmul(y, x, Trans::N, weights_for(p.weight, x), Trans::T, {1, 0, Epilogue::Bias, weights_for(p.bias, x), {}});
  else
    m_be.matmul(y, x, Trans::N, weights_for(p.weight, x), Trans::T, {1, 0, Epilogue::None, {}, {}});
}

void ModernBertForSequenceClassification::linear_backward(const Tensor& dx, const Tensor& dy, const Tensor& x,
                                                          const Params& p, bool weight_gradient, bool store) {
  if (weight_gradient) m_be.matmul(G(p.weight), dy, Trans::T, x, Trans::N, {1, store ? 0.0f : 1.0f, Epilogue::None, {}, {}});
  if (p.bias) m_be.bias_grad(G(p.bias), dy);
  if (dx.defined()) m_be.matmul(dx, dy, Trans::N, weights_for(p.weight, x), Trans::N, {1, 0, Epilogue::None, {}, {}});
}

void ModernBertForSequenceClassification::norm_forward(const Params& p, const Tensor& y, const Tensor& rstd,
                                                       const Tensor& branch, const Tensor& residual,
                                                       const Tensor& sum) {
  const Tensor beta = p.bias ? M(p.bias) : m_acts->zero_beta;
  const Tensor mean = ParamLayout::range(m_acts->mean_scratch, 0, rstd.shape);
  m_be.layernorm_forward(y, sum, mean, rstd, branch, residual, M(p.weight), beta,
                         static_cast<float>(m_cfg.layer_norm_eps), {});
}

void ModernBertForSequenceClassification::norm_backward(const Params& p, const Tensor& dsum, const Tensor& dy,
                                                        const Tensor& y, const Tensor& rstd) {
  const Tensor beta = p.bias ? M(p.bias) : m_acts->zero_beta;
  const Tensor dbeta = p.bias ? G(p.bias) : m_acts->dbeta_scratch;
  m_be.layernorm_backward(dsum, Tensor(), G(p.weight), dbeta, dy, y, rstd, M(p.weight), beta, {});
}

// ---- forward ---------------------------------------------------------------------------------------
namespace {
Tensor shaped(const Tensor& t, Shape s) { return ParamLayout::range(t, 0, s); }
}  // namespace

Tensor ModernBertForSequenceClassification::rows(const Tensor& t, int64_t width) const {
  return shaped(t, {m_acts->n, width});
}

std::pair<float, AttentionScope> ModernBertForSequenceClassification::attention_of(int l) const {
  const bool global = m_cfg.is_global_layer(l);
  const ModernBertFields& m = m_cfg.modern;
  // Note [modernbert first tokens]: the last layer's first query alone (Note [attention scope]).
  const bool first = m_acts->first_tokens && static_cast<size_t>(l) + 1 == m_acts->layers.size();
  return {static_cast<float>(global ? m.global_rope_theta : m.local_rope_theta),
          {global ? 0 : static_cast<int>(m.local_attention / 2), first ? 1 : 0}};
}

void ModernBertForSequenceClassification::layer_forward(int l, const DeviceBatch& b) {
  const Acts::Layer A = m_acts->at(static_cast<size_t>(l));
  const int64_t B = b.batch(), T = b.seq(), n = m_acts->n, H = m_cfg.hidden_size;
  const int heads = static_cast<int>(m_cfg.num_attention_heads);
  const LayerParams& P = m_layer_params[static_cast<size_t>(l)];
  const Tensor x = rows(A.x, H);
  Tensor h = x;
  if (l > 0) {
    h = rows(A.h, H);
    norm_forward(P.attn_norm, h, shaped(A.rstd_a, {n}), x, Tensor(), Tensor());
  }
  const Tensor qkv = shaped(A.qkv, {B, T, 3 * H});
  linear(rows(A.qkv, 3 * H), h, P.wqkv);
  const auto [theta, scope] = attention_of(l);
  if (m_acts->packed) {  // Note [modernbert packed tokens]
    m_be.rotary_forward(qkv, qkv, heads, theta, b.token_rows);
    m_be.attention_packed_forward(rows(A.ctx, H), shaped(A.lse, {B, heads, T}), rows(A.qkv, 3 * H), b.seq_offsets,
                                  heads, {}, b.attended_pairs.of(scope.queries), scope);
  } else {
    m_be.rotary_forward(qkv, qkv, heads, theta);
    m_be.attention_forward(shaped(A.ctx, {B, T, H}), shaped(A.lse, {B, heads, T}), qkv, b.attention_mask, heads, {},
                           scope);
  }
  const size_t next = static_cast<size_t>(l) + 1;
  const Tensor out = next < m_acts->layers.size() ? m_acts->layers[next].x : m_acts->xl;
  if (m_acts->first_tokens && next == m_acts->layers.size()) {  // Note [modernbert first tokens]
    const Tensor ctx0 = m_acts->first_ctx, x0 = shaped(m_acts->t2, {B, H});  // t2: free until the MLP's output
    first_token_rows(m_be, ctx0, rows(A.ctx, H), b, m_acts->packed);
    first_token_rows(m_be, x0, x, b, m_acts->packed);
    mlp_forward(l, ctx0, x0, shaped(out, {B, H}));
  } else {
    mlp_forward(l, rows(A.ctx, H), x, rows(out, H));
  }
}

// The output projection, its residual, the MLP norm, the MLP and its residual on the rows of ctx
// (the first ctx.dim(0) rows of the layer's tensors), x the layer input's rows, into out.
void ModernBertForSequenceClassification::mlp_forward(int l, const Tensor& ctx, const Tensor& x, const Tensor& out) {
  const Acts::Layer A = m_acts->at(static_cast<size_t>(l));
  const int64_t r = ctx.dim(0), H = m_cfg.hidden_size, I = m_cfg.intermediate_size;
  const LayerParams& P = m_layer_params[static_cast<size_t>(l)];
  auto first = [&](const Tensor& t, int64_t width) { return shaped(t, {r, width}); };
  const Tensor attn_out = first(m_acts->t1, H);
  linear(attn_out, ctx, P.attn_wo);
  norm_forward(P.mlp_norm, first(A.y, H), shaped(A.rstd_m, {r}), attn_out, x, first(A.x1, H));
  linear(first(A.wi, 2 * I), first(A.y, H), P.wi);
  m_be.geglu_forward(first(A.g, I), first(A.wi, 2 * I));
  const Tensor mlp_out = first(m_acts->t2, H);
  linear(mlp_out, first(A.g, I), P.mlp_wo);
  m_be.add(out, first(A.x1, H), mlp_out);
}

// The head's input: the first token (classifier_pooling "cls"), or the mean of the encoder's
// output over the tokens the attention mask keeps ("mean"), on the device in fp32 (Note [empty
// mean pool] in ops/cpu/pool.cpp: a sequence without a token pools to 0).
void ModernBertForSequenceClassification::pool_forward(const DeviceBatch& b) {
  Acts& A = *m_acts;
  const int64_t B = b.batch(), T = b.seq(), H = m_cfg.hidden_size;
  const Tensor pooled = shaped(A.pooled_c, {B, H});
  if (mean_pooling(m_cfg))
    m_be.masked_mean_forward(pooled, shaped(A.enc, {B, T, H}), b.attention_mask);
  else if (!A.first_tokens)  // each sequence's first row (else the final norm wrote them: Note [modernbert first tokens])
    first_token_rows(m_be, pooled, shaped(A.xf, {A.n, H}), b, A.packed);
  if (A.pooled_c.data != A.pooled.data) m_be.cast(shaped(A.pooled, {B, H}), pooled);  // Note [modernbert fp32 pooled head]
}

// Note [modernbert packed tokens]: ModernBERT on the batch's real tokens, as BERT (Note [packed
// training] in bert.cpp) where the backend has the packed attention: the n token rows of
// DeviceBatch::token_rows run every row-wise op (the embeddings' lookup of their ids, gathered
// once into Acts::ids, every LayerNorm, GEMM and gated GELU), rotary embeddings at each row's
// position in its sequence (Backend::rotary_forward's rows), and attention over the sequence
// offsets, with the local window (Note [packed attention] in ops/cpu/attention.cpp). Every
// tensor keeps its padded shape and the packed rows are its first n. The head reads the padded
// layout, as the padded forward's: a per-token head runs on every position of the encoder's
// output scattered into the zeroed [B, T, H] of xl (dead once final_norm has read it; the
// padding rows' logits are never labelled), mean pooling averages the same scatter (no fill:
// it reads the masked rows alone), and the first-token pooling gathers the first rows. Backward
// takes the head's padded gradient back to the token rows (a gather; the first-token head
// scatters into the zeroed rows). The padding rows that round n up (PackedRows' multiple)
// carry a zero gradient, so the gradients are those of the padded step (to rounding: other
// GEMM shapes). Packed training with layer recompute is refused, as BERT's (the options drop
// packing under --gradient-checkpointing layer; that combination has no test).

void ModernBertForSequenceClassification::forward(const DeviceBatch& b, bool training) {
  const int64_t B = b.batch(), T = b.seq(), R = B * T, H = m_cfg.hidden_size, C = head_outputs(m_cfg);
  ANATOMY_CHECK(B >= 1 && B <= m_shape.max_batch, "batch of ", B, " samples exceeds the planned micro-batch of ",
                m_shape.max_batch);
  ANATOMY_CHECK(T >= 1 && T <= m_shape.max_seq, "sequence length ", T, " exceeds the planned --max-seq-length ",
                m_shape.max_seq);
  Acts& A = *m_acts;
  A.packed = packed_attention_applies(m_be, m_shape.compute, m_cfg, b);  // Note [modernbert packed tokens]
  const int64_t n = A.n = A.packed ? b.token_rows.dim(0) : R;
  // Note [modernbert first tokens]: in training where carved, and in the packed evaluation.
  A.first_tokens = training ? A.cls_ctx.defined() : A.packed && first_tokens_apply(m_cfg, m_shape);
  if (A.first_tokens) A.first_ctx = shaped(training ? A.cls_ctx : A.pooled_c, {B, H});
  if (A.packed) {
    m_be.gather_rows(rows(A.ids, 1), shaped(b.input_ids, {R, 1}), b.token_rows);
    m_be.gather_rows(rows(A.emb, H), W(m_tok_embeddings), shaped(A.ids, {n}));
  } else {
    m_be.gather_rows(rows(A.emb, H), W(m_tok_embeddings), shaped(b.input_ids, {R}));
  }
  norm_forward(m_emb_norm, rows(A.layers[0].x, H), shaped(A.rstd_e, {n}), rows(A.emb, H), Tensor(), Tensor());
  for (int l = 0; l < m_cfg.num_hidden_layers; ++l) layer_forward(l, b);
  const int64_t nf = A.first_tokens ? B : n;  // the final norm's rows
  A.final_out = A.first_tokens ? shaped(A.pooled_c, {B, H}) : rows(A.xf, H);
  norm_forward(m_final_norm, A.final_out, shaped(A.rstd_f, {nf}), shaped(A.xl, {nf, H}), Tensor(), Tensor());
  const bool tokens = token_head(m_cfg);
  A.enc = shaped(A.xf, {R, H});
  if (A.packed && (tokens || mean_pooling(m_cfg))) {  // the padded layout, in xl
    A.enc = shaped(A.xl, {R, H});
    if (tokens) m_be.fill(A.enc, 0.0f);
    m_be.scatter_rows(A.enc, rows(A.xf, H), b.token_rows);
  }
  m_hidden = (A.packed && !tokens) || A.first_tokens ? Tensor() : shaped(A.enc, {B, T, H});
  const int64_t N = tokens ? R : B;
  if (!tokens) pool_forward(b);
  const Tensor head_in = tokens ? A.enc : shaped(A.pooled, {B, H});
  linear(shaped(A.hd, {N, H}), head_in, m_head_dense);
  m_be.gelu_forward(shaped(A.ga, {N, H}), shaped(A.hd, {N, H}));
  norm_forward(m_head_norm, shaped(A.hh, {N, H}), shaped(A.rstd_h, {N}), shaped(A.ga, {N, H}), Tensor(), Tensor());
  m_logits = shaped(A.logits, {N, C});
  linear(m_logits, shaped(A.hh, {N, H}), m_head_out);
  m_losses = shaped(A.losses, {B});
}

// A packed batch runs on its token rows where the backend can (Note [modernbert packed tokens]),
// else padded; the logits are the same.
bool ModernBertForSequenceClassification::last_forward_packed() const { return m_acts->packed; }

void ModernBertForSequenceClassification::forward_eval(const DeviceBatch& b) {
  m_be.set_phase(Phase::Forward);
  forward(b, false);
  // The loss too when the labels are the head's (evaluate() passes class ids whatever the
  // problem type, and scores the logits on the host).
  if (b.labels.defined() && b.labels.dtype == label_dtype(m_cfg)) loss(b, Tensor(), 0.0f);
}

// Note [modernbert fp32 pooled head]: in bf16/fp16 the sequence head (pooled -> dense -> GELU ->
// norm -> classifier, forward and backward) runs in fp32 on the master weights: its tensors are
// [B, H] and [B, C], so the cost is nil, and its gradients are sums over the batch's samples
// whose per-sample vectors cancel (their cosines around -0.6 on transformers' bias-mean
// fixture), which magnifies every rounding of the head's chain. An emulation of the bf16 step in
// PyTorch (fp32 math, bf16 at each tensor the step stores) put that chain at ~58% of the bias
// gradients' error on that fixture, and the head in fp32 took the worst cosine from 0.9987 to
// 0.9996 (0.9994 at worst over 40 sub-ulp perturbations of the weights, against 22 of 40 below
// 0.999 before). The pooling still reads and the encoder's gradient still gets the compute
// dtype (one cast each way); the per-token heads ([B*T, .]) stay in it.
// Note [modernbert token head]: transformers' ModernBertForTokenClassification runs the head
// (dense -> GELU -> norm, the sequence head's tensors) on every token's final hidden state
// instead of a pooled one, then the classifier: logits [B*T, num_labels], no pooling.
// ModernBertForMaskedLM runs the same head, then the decoder tied to the token embeddings E
// (no tensor of its own in the file) with its bias decoder.bias: logits [B*T, vocab] = h E^T + b,
// so its weight gradient lands in E's, beside the lookup's (sparse_prediction, which scores only
// the masked rows, gives the same loss and gradients). Either loss is the mean over the
// labelled tokens (labels != -100), as Note [token classification head] in model/heads.h
// spells it: per sequence the sum of its tokens' losses times B / labelled.
void ModernBertForSequenceClassification::loss(const DeviceBatch& b, const Tensor& dlogits, float grad_scale) {
  if (!token_head(m_cfg)) {
    sequence_loss(m_be, problem_type_of(m_cfg), m_losses, dlogits, m_logits, b.labels, grad_scale);
    return;
  }
  const float w = b.masked_tokens > 0 ? static_cast<float>(b.batch()) / static_cast<float>(b.masked_tokens) : 0.0f;
  m_be.token_cross_entropy(m_losses, dlogits, m_logits, b.labels, w, grad_scale * w);
}

// ---- backward --------------------------------------------------------------------------------------
// Note [modernbert selective recompute]: under --gradient-checkpointing selective forward keeps
// every tensor of a layer but its gated-GELU output g = gelu(in) * gate ([B*T, intermediate]:
// in ModernBERT-base an eighth of a layer's saved bytes). Forward writes g into the scratch of
// wi's gradient, where the MLP's output projection reads it at once; backward recomputes it
// there from the saved wi before the projection's weight gradient reads it. That scratch is free
// at both times: backward writes wi's gradient only after the projection's, when g is dead. One
// element-wise op per layer, the same op on the same input as forward's, so the gradients are
// those of the run that keeps everything, bit for bit. (BERT's selective also drops the first
// layers' FFN input, Note [recomputed FFN input] in bert.cpp; ModernBERT keeps every wi.)
// Note [layer recompute]: under --gradient-checkpointing layer forward keeps each layer's input
// alone; backward first re-runs the layer's forward from it into the one set of layer tensors in
// the scratch (Acts::work), the same ops on the same inputs, so the gradients are those of the
// run that keeps everything, for one more forward of the encoder per step.
void ModernBertForSequenceClassification::layer_backward(int l, const DeviceBatch& b, const Tensor& dout,
                                                         const Tensor& din) {
  if (m_acts->recompute) layer_forward(l, b);  // Note [layer recompute]
  const Acts::Layer A = m_acts->at(static_cast<size_t>(l));
  Acts& S = *m_acts;
  const int64_t B = b.batch(), H = m_cfg.hidden_size, I = m_cfg.intermediate_size;
  const bool first = S.first_tokens && static_cast<size_t>(l) + 1 == S.layers.size();  // Note [modernbert first tokens]
  const int64_t r = first ? B : S.n;  // the rows past attention
  if (S.selective)  // Note [modernbert selective recompute]
    m_be.geglu_forward(shaped(A.g, {r, I}), shaped(A.wi, {r, 2 * I}));
  if (!first) {
    mlp_backward(l, dout, rows(A.ctx, H));
    attention_backward_part(l, b, S.t1, rows(S.t3, H), rows(S.t2, H), din);
    return;
  }
  mlp_backward(l, shaped(dout, {B, H}), S.first_ctx);
  first_token_rows_backward(m_be, rows(S.t2, H), shaped(S.t1, {B, H}), b, S.packed);  // d ctx on every row
  first_token_rows_backward(m_be, rows(S.t1, H), shaped(S.t3, {B, H}), b, S.packed);  // d x1 on every row
  attention_backward_part(l, b, S.t2, rows(S.t1, H), rows(S.t3, H), din);
}

// The MLP branch (out = x1 + mlp(mlp_norm(x1))) and the output projection backward on dout's rows:
// d ctx into t1's first rows and d x1 into t3's, with the weight and bias gradients on the way.
void ModernBertForSequenceClassification::mlp_backward(int l, const Tensor& dout, const Tensor& ctx) {
  const Acts::Layer A = m_acts->at(static_cast<size_t>(l));
  Acts& S = *m_acts;
  const int64_t r = dout.dim(0), H = m_cfg.hidden_size, I = m_cfg.intermediate_size;
  const LayerParams& P = m_layer_params[static_cast<size_t>(l)];
  auto first = [&](const Tensor& t, int64_t width) { return shaped(t, {r, width}); };
  // The layer's range holds its four matrices only: with the gradients in freed activations
  // their GEMMs store them, with no zeroing first (Note [layer gradients stored] in bert.cpp).
  const bool store = gradients_in_activations();
  linear_backward(first(S.dg, I), dout, first(A.g, I), P.mlp_wo, true, store);
  m_be.geglu_backward(first(S.dwi, 2 * I), first(S.dg, I), first(A.wi, 2 * I));
  const Tensor t1 = first(S.t1, H), t2 = first(S.t2, H), t3 = first(S.t3, H);
  linear_backward(t1, first(S.dwi, 2 * I), first(A.y, H), P.wi, true, store);
  norm_backward(P.mlp_norm, t2, t1, first(A.y, H), shaped(A.rstd_m, {r}));
  m_be.add(t3, t2, dout);  // d x1
  // Attention branch: x1 = x + Wo attention(rotary(Wqkv h)).
  linear_backward(t1, t3, ctx, P.attn_wo, true, store);
}

// Attention's backward from d ctx (the first rows of the [B*T, H] buffer dctx), then the q|k|v
// projection's and the attention norm's; din = their gradient of the layer input plus dx1 (the
// residual's). `free`: scratch rows.
void ModernBertForSequenceClassification::attention_backward_part(int l, const DeviceBatch& b, const Tensor& dctx,
                                                                  const Tensor& dx1, const Tensor& free,
                                                                  const Tensor& din) {
  const Acts::Layer A = m_acts->at(static_cast<size_t>(l));
  Acts& S = *m_acts;
  const int64_t B = b.batch(), T = b.seq(), n = S.n, H = m_cfg.hidden_size;
  const int heads = static_cast<int>(m_cfg.num_attention_heads);
  const LayerParams& P = m_layer_params[static_cast<size_t>(l)];
  const auto [theta, scope] = attention_of(l);
  const bool store = gradients_in_activations();
  const Tensor dqkv = shaped(S.dqkv, {B, T, 3 * H}), lse = shaped(A.lse, {B, heads, T});
  if (S.packed) {  // Note [modernbert packed tokens]
    m_be.attention_packed_backward(rows(S.dqkv, 3 * H), rows(dctx, H), rows(A.qkv, 3 * H), rows(A.ctx, H), lse,
                                   b.seq_offsets, heads, {}, b.attended_pairs.of(scope.queries), scope);
    m_be.rotary_backward(dqkv, dqkv, heads, theta, b.token_rows);
  } else {
    m_be.attention_backward(dqkv, shaped(dctx, {B, T, H}), shaped(A.qkv, {B, T, 3 * H}), shaped(A.ctx, {B, T, H}), lse,
                            b.attention_mask, heads, {}, scope);
    m_be.rotary_backward(dqkv, dqkv, heads, theta);
  }
  const Tensor h = l > 0 ? rows(A.h, H) : rows(A.x, H);
  linear_backward(free, rows(S.dqkv, 3 * H), h, P.wqkv, true, store);
  if (l > 0) {
    norm_backward(P.attn_norm, rows(dctx, H), free, h, shaped(A.rstd_a, {n}));
    m_be.add(din, rows(dctx, H), dx1);
  } else {
    m_be.add(din, free, dx1);
  }
}

void ModernBertForSequenceClassification::backward(const DeviceBatch& b) {
  Acts& A = *m_acts;
  const int64_t B = b.batch(), T = b.seq(), R = B * T, n = A.n, H = m_cfg.hidden_size, C = head_outputs(m_cfg);
  const bool tokens = token_head(m_cfg);
  const int64_t N = tokens ? R : B;
  const bool mlm = is_masked_lm(m_cfg), overlaid = m_act_block.data() != nullptr;
  // Gradients in freed activations: the tail's and the embeddings' ranges are zeroed just before
  // they are written, the layers' stored by their GEMMs (Note [modernbert gradients in freed
  // activations]); the tail first.
  if (overlaid) zero_grad_range(m_grad_ranges.back());
  const Tensor dlogits = shaped(A.dlogits, {N, C}), hh = shaped(A.hh, {N, H});
  // Masked-LM: the tied decoder's weight gradient goes into the token embeddings', after their
  // backward (Note [modernbert gradients in freed activations]).
  linear_backward(shaped(A.dhh, {N, H}), dlogits, hh, m_head_out, !mlm);
  norm_backward(m_head_norm, shaped(A.dhd, {N, H}), shaped(A.dhh, {N, H}), hh, shaped(A.rstd_h, {N}));
  m_be.gelu_backward(shaped(A.dhd, {N, H}), shaped(A.dhd, {N, H}), shaped(A.hd, {N, H}));
  // The token head's dense writes the (padded) encoder output's gradient itself; the sequence
  // head's goes through the pooling.
  Tensor dpooled = tokens ? shaped(A.dxf, {R, H}) : shaped(A.dpooled, {B, H});
  linear_backward(dpooled, shaped(A.dhd, {N, H}), tokens ? A.enc : shaped(A.pooled, {B, H}), m_head_dense);
  const Tensor dxf = shaped(A.dxf, {B, T, H});
  Tensor dx = shaped(A.dxf, {R, H});  // the encoder output's gradient, on the encoder's rows
  if (!tokens && A.dpooled_c.data != A.dpooled.data) {  // Note [modernbert fp32 pooled head]
    m_be.cast(shaped(A.dpooled_c, {B, H}), dpooled);
    dpooled = shaped(A.dpooled_c, {B, H});
  }
  if (mean_pooling(m_cfg))
    m_be.masked_mean_backward(dxf, dpooled, b.attention_mask);
  if (A.first_tokens) {  // the final norm ran on the first tokens' rows (Note [modernbert first tokens])
    dx = dpooled;
  } else if (!tokens && !mean_pooling(m_cfg)) {  // each sequence's first row, zero elsewhere
    dx = A.packed ? rows(A.t3, H) : dx;
    first_token_rows_backward(m_be, dx, dpooled, b, A.packed);
  } else if (A.packed) {  // Note [modernbert packed tokens]: back to the token rows, in t3
    dx = rows(A.t3, H);
    m_be.gather_rows(dx, shaped(A.dxf, {R, H}), b.token_rows);
  }
  Tensor d = rows(A.da, H), other = rows(A.db, H);
  const int64_t nf = A.first_tokens ? B : n;  // the final norm's rows
  norm_backward(m_final_norm, shaped(A.da, {nf, H}), dx, A.final_out, shaped(A.rstd_f, {nf}));
  for (int l = static_cast<int>(m_cfg.num_hidden_layers) - 1; l >= 0; --l) {
    layer_backward(l, b, d, other);
    std::swap(d, other);
    if (m_on_layer_grads) m_on_layer_grads(m_grad_ranges[static_cast<size_t>(l) + 1].first,
                                           m_grad_ranges[static_cast<size_t>(l) + 1].second);
  }
  const Tensor demb = other;
  if (overlaid) zero_grad_range(m_grad_ranges.front());
  norm_backward(m_emb_norm, demb, d, rows(A.layers[0].x, H), shaped(A.rstd_e, {n}));
  const Tensor ids = A.packed ? shaped(A.ids, {1, n}) : b.input_ids;
  m_be.embedding_backward(G(m_tok_embeddings), Tensor(), Tensor(), demb, ids, Tensor());
  if (mlm) linear_backward(Tensor(), dlogits, hh, Params{m_head_out.weight, nullptr});
  if (overlaid) m_hidden = Tensor();  // its memory now holds gradients
}

void ModernBertForSequenceClassification::forward_backward(const DeviceBatch& b, float grad_scale, uint64_t) {
  ANATOMY_CHECK(m_shape.training, "internal error: backward on an inference-only model");
  m_be.set_phase(Phase::Forward);
  forward(b, true);
  loss(b, shaped(m_acts->dlogits, m_logits.shape), grad_scale);
  m_be.set_phase(Phase::Backward);
  backward(b);
}

// ---- memory plan -----------------------------------------------------------------------------------
CategoryBytes modernbert_bytes(const BertConfig& cfg, int64_t B, int64_t T) {
  CategoryBytes c;
  c[Category::Weights] = c[Category::Gradients] = static_cast<int64_t>(ParamLayout::for_modernbert(cfg).total()) * 4;
  const ArenaBytes a = modernbert_arena_bytes(cfg, ModelShape{B, T});
  c[Category::Activations] = static_cast<int64_t>(a.activations);
  c[Category::Temporary] = static_cast<int64_t>(a.temporary);
  return c;
}

// ---- checkpoints -----------------------------------------------------------------------------------
std::vector<std::string> load_modernbert_weights(const std::string& dir, EncoderModel& model) {
  const std::string path = dir + "/model.safetensors";
  const SafetensorsReader r = SafetensorsReader::open(path);
  std::vector<float> flat(model.layout().total(), 0.0f);
  std::set<std::string> used;
  for (const ParamInfo& p : model.layout().params()) {
    ANATOMY_CHECK(r.contains(p.name), path, ": no tensor '", p.name, "' (", model.config().sequence_classification_class(),
                  " needs it)");
    r.read(p.name, DType::F32, flat.data() + p.offset, std::span<const int64_t>(p.shape.d.data(), p.shape.rank), "config.json");
    used.insert(p.name);
  }
  model.set_master_from_host(flat);
  std::vector<std::string> unused;
  for (const auto& t : r.tensors())
    if (!used.count(t.name)) unused.push_back(t.name);
  return unused;
}

void save_modernbert(const std::string& dir, EncoderModel& model) {
  std::filesystem::create_directories(dir);
  const std::vector<float> flat = model.master_to_host();
  std::vector<SafetensorsEntry> entries;
  for (const ParamInfo& p : model.layout().params()) {
    SafetensorsEntry e;
    e.name = p.name;
    e.shape.assign(p.shape.d.begin(), p.shape.d.begin() + p.shape.rank);
    e.data = flat.data() + p.offset;
    entries.push_back(std::move(e));
  }
  write_safetensors(dir + "/model.safetensors", entries, {{"format", "pt"}});
  model.config().save(dir + "/config.json");
}

}  // namespace anatomy
