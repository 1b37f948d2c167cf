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
// then dense (+b) -> GELU -> norm -> classifier. Every LayerNorm has a bias only with
// norm_bias; without one the kernels get a zero beta and its gradient goes to scratch.
#include "model/modernbert.h"

#include <cmath>

#include "core/error.h"
#include "core/rng.h"
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
  lay.add("classifier.weight", {cfg.num_labels, H}, true);
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
  lay.add("classifier.bias", {cfg.num_labels}, false);
  return lay;
}

struct ModernBertForSequenceClassification::Acts {
  struct Layer {
    Buffer x, h, rstd_a, qkv, ctx, lse, x1, y, rstd_m, wi, g;
  };
  std::vector<Layer> layers;
  Buffer emb, rstd_e, xl, xf, rstd_f, pooled, hd, ga, hh, rstd_h, logits, dlogits, losses;
  Buffer pool_w, mean_scratch, zero_beta, dbeta_scratch;
  // Backward scratch.
  Buffer da, db, t1, t2, t3, dqkv, dg, dwi, dxf, dpooled, dhd, dhh;
  std::vector<float> pool_host;
};

ModernBertForSequenceClassification::ModernBertForSequenceClassification(Backend& be, const BertConfig& cfg,
                                                                         int64_t max_batch, int64_t max_seq)
    : m_be(be), m_cfg(cfg), m_layout(ParamLayout::for_modernbert(cfg)), m_max_batch(max_batch), m_max_seq(max_seq) {
  ANATOMY_CHECK(cfg.is_modernbert(), "ModernBertForSequenceClassification: model_type is ", cfg.model_type());
  cfg.validate("config");
  Allocator& a = be.allocator();
  const auto n = static_cast<int64_t>(m_layout.total());
  m_master = Buffer(a, DType::F32, {n}, Category::Weights);
  m_grads = Buffer(a, DType::F32, {n}, Category::Gradients);
  be.fill(m_master, 0.0f);
  be.fill(m_grads, 0.0f);
  const int64_t B = max_batch, R = max_batch * max_seq, H = cfg.hidden_size, I = cfg.intermediate_size;
  const int64_t heads = cfg.num_attention_heads, C = cfg.num_labels;
  auto act = [&](Shape s, DType dt = DType::F32) { return Buffer(a, dt, s, Category::Activations); };
  auto tmp = [&](Shape s) { return Buffer(a, DType::F32, s, Category::Temporary); };
  m_acts = std::make_unique<Acts>();
  Acts& A = *m_acts;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    Acts::Layer L;
    L.x = act({R, H});
    if (l > 0) L.h = act({R, H}), L.rstd_a = act({R});
    L.qkv = act({B, max_seq, 3 * H});
    L.ctx = act({B, max_seq, H});
    L.lse = act({B, heads, max_seq});
    L.x1 = act({R, H});
    L.y = act({R, H});
    L.rstd_m = act({R});
    L.wi = act({R, 2 * I});
    L.g = act({R, I});
    A.layers.push_back(std::move(L));
  }
  A.emb = act({R, H}), A.rstd_e = act({R}), A.xl = act({R, H}), A.xf = act({B, max_seq, H});
  A.rstd_f = act({R}), A.pooled = act({B, H}), A.hd = act({B, H}), A.ga = act({B, H}), A.hh = act({B, H});
  A.rstd_h = act({B}), A.logits = act({B, C}), A.dlogits = act({B, C}), A.losses = act({B});
  A.pool_w = act({B, R}), A.mean_scratch = tmp({R}), A.zero_beta = tmp({H}), A.dbeta_scratch = tmp({H});
  be.fill(A.zero_beta, 0.0f);
  A.da = tmp({R, H}), A.db = tmp({R, H}), A.t1 = tmp({R, H}), A.t2 = tmp({R, H}), A.t3 = tmp({R, H});
  A.dqkv = tmp({B, max_seq, 3 * H}), A.dg = tmp({R, I}), A.dwi = tmp({R, 2 * I});
  A.dxf = tmp({B, max_seq, H}), A.dpooled = tmp({B, H}), A.dhd = tmp({B, H}), A.dhh = tmp({B, H});
}

ModernBertForSequenceClassification::~ModernBertForSequenceClassification() = default;

void ModernBertForSequenceClassification::set_master_from_host(const std::vector<float>& flat) {
  ANATOMY_CHECK(flat.size() == m_layout.total(), "set_master_from_host: ", flat.size(), " values for ",
                m_layout.total());
  m_be.upload(m_master, flat.data());
}
std::vector<float> ModernBertForSequenceClassification::master_to_host() {
  std::vector<float> v(m_layout.total());
  m_be.download(v.data(), m_master);
  return v;
}
std::vector<float> ModernBertForSequenceClassification::grads_to_host() {
  std::vector<float> v(m_layout.total());
  m_be.download(v.data(), m_grads);
  return v;
}
void ModernBertForSequenceClassification::zero_grads() { m_be.fill(m_grads, 0.0f); }

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
void ModernBertForSequenceClassification::linear(const Tensor& y, const Tensor& x, const std::string& w,
                                                 const std::string& b) {
  if (has(b))
    m_be.matmul(y, x, Trans::N, W(w), Trans::T, {1, 0, Epilogue::Bias, W(b), {}});
  else
    m_be.matmul(y, x, Trans::N, W(w), Trans::T, {1, 0, Epilogue::None, {}, {}});
}

void ModernBertForSequenceClassification::linear_backward(const Tensor& dx, const Tensor& dy, const Tensor& x,
                                                          const std::string& w, const std::string& b) {
  m_be.matmul(G(w), dy, Trans::T, x, Trans::N, {1, 1, Epilogue::None, {}, {}});
  if (has(b)) m_be.bias_grad(G(b), dy);
  if (dx.defined()) m_be.matmul(dx, dy, Trans::N, W(w), Trans::N, {1, 0, Epilogue::None, {}, {}});
}

void ModernBertForSequenceClassification::norm_forward(const std::string& name, const Tensor& y, const Tensor& rstd,
                                                       const Tensor& branch, const Tensor& residual,
                                                       const Tensor& sum) {
  const Tensor beta = has(name + ".bias") ? W(name + ".bias") : m_acts->zero_beta.tensor();
  const Tensor mean = ParamLayout::range(m_acts->mean_scratch, 0, rstd.shape);
  m_be.layernorm_forward(y, sum, mean, rstd, branch, residual, W(name + ".weight"), beta,
                         static_cast<float>(m_cfg.layer_norm_eps), {});
}

void ModernBertForSequenceClassification::norm_backward(const std::string& name, const Tensor& dsum, const Tensor& dy,
                                                        const Tensor& y, const Tensor& rstd) {
  const bool bias = has(name + ".bias");
  const Tensor beta = bias ? W(name + ".bias") : m_acts->zero_beta.tensor();
  const Tensor dbeta = bias ? G(name + ".bias") : m_acts->dbeta_scratch.tensor();
  m_be.layernorm_backward(dsum, Tensor(), G(name + ".weight"), dbeta, dy, y, rstd, W(name + ".weight"), beta, {});
}

// ---- forward ---------------------------------------------------------------------------------------
namespace {
Tensor shaped(const Tensor& t, Shape s) { return ParamLayout::range(t, 0, s); }
}  // namespace

void ModernBertForSequenceClassification::layer_forward(int l, const DeviceBatch& b) {
  Acts::Layer& A = m_acts->layers[static_cast<size_t>(l)];
  const int64_t B = b.batch(), T = b.seq(), R = B * T, H = m_cfg.hidden_size, I = m_cfg.intermediate_size;
  const int heads = static_cast<int>(m_cfg.num_attention_heads);
  const std::string p = layer_prefix(l);
  const Tensor x = shaped(A.x, {R, H});
  Tensor h = x;
  if (l > 0) {
    h = shaped(A.h, {R, H});
    norm_forward(p + "attn_norm", h, shaped(A.rstd_a, {R}), x, Tensor(), Tensor());
  }
  const Tensor qkv = shaped(A.qkv, {B, T, 3 * H});
  linear(shaped(A.qkv, {R, 3 * H}), h, p + "attn.Wqkv.weight", p + "attn.Wqkv.bias");
  const bool global = m_cfg.is_global_layer(l);
  const ModernBertFields& m = m_cfg.modern;
  m_be.rotary_forward(qkv, qkv, heads, static_cast<float>(global ? m.global_rope_theta : m.local_rope_theta));
  m_be.attention_forward(shaped(A.ctx, {B, T, H}), shaped(A.lse, {B, heads, T}), qkv, b.attention_mask, heads, {},
                         global ? 0 : static_cast<int>(m.local_attention / 2));
  const Tensor attn_out = shaped(m_acts->t1, {R, H});
  linear(attn_out, shaped(A.ctx, {R, H}), p + "attn.Wo.weight", p + "attn.Wo.bias");
  norm_forward(p + "mlp_norm", shaped(A.y, {R, H}), shaped(A.rstd_m, {R}), attn_out, x, shaped(A.x1, {R, H}));
  linear(shaped(A.wi, {R, 2 * I}), shaped(A.y, {R, H}), p + "mlp.Wi.weight", p + "mlp.Wi.bias");
  m_be.geglu_forward(shaped(A.g, {R, I}), shaped(A.wi, {R, 2 * I}));
  const Tensor mlp_out = shaped(m_acts->t2, {R, H});
  linear(mlp_out, shaped(A.g, {R, I}), p + "mlp.Wo.weight", p + "mlp.Wo.bias");
  const size_t next = static_cast<size_t>(l) + 1;
  const Tensor out = next < m_acts->layers.size() ? shaped(m_acts->layers[next].x, {R, H}) : shaped(m_acts->xl, {R, H});
  m_be.add(out, shaped(A.x1, {R, H}), mlp_out);
}

void ModernBertForSequenceClassification::forward(const DeviceBatch& b) {
  const int64_t B = b.batch(), T = b.seq(), R = B * T, H = m_cfg.hidden_size, C = m_cfg.num_labels;
  ANATOMY_CHECK(B <= m_max_batch && T <= m_max_seq, "ModernBERT: batch [", B, ", ", T, "] exceeds the model's [",
                m_max_batch, ", ", m_max_seq, "]");
  Acts& A = *m_acts;
  const Tensor ids = ParamLayout::range(b.input_ids, 0, {R});
  m_be.gather_rows(shaped(A.emb, {R, H}), W("model.embeddings.tok_embeddings.weight"), ids);
  norm_forward("model.embeddings.norm", shaped(A.layers[0].x, {R, H}), shaped(A.rstd_e, {R}), shaped(A.emb, {R, H}),
               Tensor(), Tensor());
  for (int l = 0; l < m_cfg.num_hidden_layers; ++l) layer_forward(l, b);
  norm_forward("model.final_norm", shaped(A.xf, {R, H}), shaped(A.rstd_f, {R}), shaped(A.xl, {R, H}), Tensor(),
               Tensor());
  const Tensor pooled = shaped(A.pooled, {B, H});
  if (m_cfg.modern.classifier_pooling == "cls") {
    m_be.select_token(pooled, shaped(A.xf, {B, T, H}), 0);
  } else {  // pooled = P xf with P[b, b*T + t] = mask[b, t] / sum_t mask[b, t]
    std::vector<int32_t> mask(static_cast<size_t>(R), 1);
    if (b.attention_mask.defined()) m_be.download(mask.data(), b.attention_mask);
    A.pool_host.assign(static_cast<size_t>(B * R), 0.0f);
    for (int64_t s = 0; s < B; ++s) {
      double n = 0;
      for (int64_t t = 0; t < T; ++t) n += mask[s * T + t] != 0;
      for (int64_t t = 0; t < T; ++t)
        A.pool_host[s * R + s * T + t] = mask[s * T + t] != 0 ? static_cast<float>(1.0 / n) : 0.0f;
    }
    m_be.upload(shaped(A.pool_w, {B, R}), A.pool_host.data());
    m_be.matmul(pooled, shaped(A.pool_w, {B, R}), Trans::N, shaped(A.xf, {R, H}), Trans::N,
                {1, 0, Epilogue::None, {}, {}});
  }
  linear(shaped(A.hd, {B, H}), pooled, "head.dense.weight", "head.dense.bias");
  m_be.gelu_forward(shaped(A.ga, {B, H}), shaped(A.hd, {B, H}));
  norm_forward("head.norm", shaped(A.hh, {B, H}), shaped(A.rstd_h, {B}), shaped(A.ga, {B, H}), Tensor(), Tensor());
  m_logits = shaped(A.logits, {B, C});
  linear(m_logits, shaped(A.hh, {B, H}), "classifier.weight", "classifier.bias");
  m_losses = shaped(A.losses, {B});
}

void ModernBertForSequenceClassification::forward_eval(const DeviceBatch& b) {
  m_be.set_phase(Phase::Forward);
  forward(b);
  m_be.cross_entropy(m_losses, Tensor(), m_logits, b.labels, 0.0f);
}

// ---- backward --------------------------------------------------------------------------------------
void ModernBertForSequenceClassification::layer_backward(int l, const DeviceBatch& b, const Tensor& dout,
                                                         const Tensor& din) {
  Acts::Layer& A = m_acts->layers[static_cast<size_t>(l)];
  Acts& S = *m_acts;
  const int64_t B = b.batch(), T = b.seq(), R = B * T, H = m_cfg.hidden_size, I = m_cfg.intermediate_size;
  const int heads = static_cast<int>(m_cfg.num_attention_heads);
  const std::string p = layer_prefix(l);
  const bool global = m_cfg.is_global_layer(l);
  const ModernBertFields& m = m_cfg.modern;
  // MLP branch: out = x1 + mlp(mlp_norm(x1)).
  linear_backward(shaped(S.dg, {R, I}), dout, shaped(A.g, {R, I}), p + "mlp.Wo.weight", p + "mlp.Wo.bias");
  m_be.geglu_backward(shaped(S.dwi, {R, 2 * I}), shaped(S.dg, {R, I}), shaped(A.wi, {R, 2 * I}));
  const Tensor t1 = shaped(S.t1, {R, H}), t2 = shaped(S.t2, {R, H}), t3 = shaped(S.t3, {R, H});
  linear_backward(t1, shaped(S.dwi, {R, 2 * I}), shaped(A.y, {R, H}), p + "mlp.Wi.weight", p + "mlp.Wi.bias");
  norm_backward(p + "mlp_norm", t2, t1, shaped(A.y, {R, H}), shaped(A.rstd_m, {R}));
  m_be.add(t3, t2, dout);  // d x1
  // Attention branch: x1 = x + Wo attention(rotary(Wqkv h)).
  linear_backward(t1, t3, shaped(A.ctx, {R, H}), p + "attn.Wo.weight", p + "attn.Wo.bias");
  const Tensor dqkv = shaped(S.dqkv, {B, T, 3 * H});
  m_be.attention_backward(dqkv, shaped(t1, {B, T, H}), shaped(A.qkv, {B, T, 3 * H}), shaped(A.ctx, {B, T, H}),
                          shaped(A.lse, {B, heads, T}), b.attention_mask, heads, {},
                          global ? 0 : static_cast<int>(m.local_attention / 2));
  m_be.rotary_backward(dqkv, dqkv, heads, static_cast<float>(global ? m.global_rope_theta : m.local_rope_theta));
  const Tensor h = l > 0 ? shaped(A.h, {R, H}) : shaped(A.x, {R, H});
  linear_backward(t2, shaped(S.dqkv, {R, 3 * H}), h, p + "attn.Wqkv.weight", p + "attn.Wqkv.bias");
  if (l > 0) {
    norm_backward(p + "attn_norm", t1, t2, h, shaped(A.rstd_a, {R}));
    m_be.add(din, t1, t3);
  } else {
    m_be.add(din, t2, t3);
  }
}

void ModernBertForSequenceClassification::backward(const DeviceBatch& b) {
  Acts& A = *m_acts;
  const int64_t B = b.batch(), T = b.seq(), R = B * T, H = m_cfg.hidden_size, C = m_cfg.num_labels;
  const Tensor dlogits = shaped(A.dlogits, {B, C});
  linear_backward(shaped(A.dhh, {B, H}), dlogits, shaped(A.hh, {B, H}), "classifier.weight", "classifier.bias");
  norm_backward("head.norm", shaped(A.dhd, {B, H}), shaped(A.dhh, {B, H}), shaped(A.hh, {B, H}), shaped(A.rstd_h, {B}));
  m_be.gelu_backward(shaped(A.dhd, {B, H}), shaped(A.dhd, {B, H}), shaped(A.hd, {B, H}));
  const Tensor dpooled = shaped(A.dpooled, {B, H});
  linear_backward(dpooled, shaped(A.dhd, {B, H}), shaped(A.pooled, {B, H}), "head.dense.weight", "head.dense.bias");
  const Tensor dxf = shaped(A.dxf, {B, T, H});
  if (m_cfg.modern.classifier_pooling == "cls")
    m_be.select_token_backward(dxf, dpooled, 0);
  else
    m_be.matmul(shaped(A.dxf, {R, H}), shaped(A.pool_w, {B, R}), Trans::T, dpooled, Trans::N,
                {1, 0, Epilogue::None, {}, {}});
  Tensor d = shaped(A.da, {R, H}), other = shaped(A.db, {R, H});
  norm_backward("model.final_norm", d, shaped(A.dxf, {R, H}), shaped(A.xf, {R, H}), shaped(A.rstd_f, {R}));
  for (int l = static_cast<int>(m_cfg.num_hidden_layers) - 1; l >= 0; --l) {
    layer_backward(l, b, d, other);
    std::swap(d, other);
  }
  const Tensor demb = other;
  norm_backward("model.embeddings.norm", demb, d, shaped(A.layers[0].x, {R, H}), shaped(A.rstd_e, {R}));
  m_be.embedding_backward(G("model.embeddings.tok_embeddings.weight"), Tensor(), Tensor(), demb, b.input_ids,
                          Tensor());
}

void ModernBertForSequenceClassification::forward_backward(const DeviceBatch& b, float grad_scale) {
  m_be.set_phase(Phase::Forward);
  forward(b);
  m_be.cross_entropy(m_losses, shaped(m_acts->dlogits, {b.batch(), m_cfg.num_labels}), m_logits, b.labels,
                     grad_scale);
  m_be.set_phase(Phase::Backward);
  backward(b);
}

// ---- memory plan -----------------------------------------------------------------------------------
CategoryBytes modernbert_bytes(const BertConfig& cfg, int64_t B, int64_t T) {
  const int64_t R = B * T, H = cfg.hidden_size, I = cfg.intermediate_size, L = cfg.num_hidden_layers;
  const int64_t heads = cfg.num_attention_heads, C = cfg.num_labels, f = 4;  // F32
  CategoryBytes c;
  c[Category::Weights] = c[Category::Gradients] = static_cast<int64_t>(ParamLayout::for_modernbert(cfg).total()) * f;
  // Per layer: input, q|k|v, ctx, lse, x1, mlp_norm's output and rstd, Wi's output, the gated
  // product; from layer 1 on also attn_norm's output and rstd.
  const int64_t layer = R * H + 3 * R * H + R * H + B * heads * T + R * H + R * H + R + 2 * R * I + R * I;
  const int64_t tail = R * H + R + R * H + R * H + R     // embeddings + norm rstd, last output, final_norm
                       + 4 * B * H + B + 2 * B * C + B  // head, its norm's rstd, logits, dlogits, losses
                       + B * R;                         // mean pooling's weights
  c[Category::Activations] = (L * layer + (L - 1) * (R * H + R) + tail) * f;
  c[Category::Temporary] = (R + 2 * H + 5 * R * H + 3 * R * H + R * I + 2 * R * I + R * H + 3 * B * H) * f;
  return c;
}

// ---- checkpoints -----------------------------------------------------------------------------------
std::vector<std::string> load_modernbert_weights(const std::string& dir, ModernBertForSequenceClassification& model) {
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

void save_modernbert(const std::string& dir, ModernBertForSequenceClassification& model) {
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
