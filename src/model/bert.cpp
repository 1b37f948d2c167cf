#include "model/bert.h"

#include <algorithm>
#include <cmath>

#include "core/rng.h"

namespace anatomy {

const char* checkpoint_policy_name(CheckpointPolicy p) {
  switch (p) {
    case CheckpointPolicy::None: return "none";
    case CheckpointPolicy::Layer: return "layer";
    case CheckpointPolicy::Selective: return "selective";
  }
  return "?";
}

CheckpointPolicy parse_checkpoint_policy(const std::string& s) {
  if (s == "none" || s == "false") return CheckpointPolicy::None;
  if (s == "layer" || s == "true") return CheckpointPolicy::Layer;
  if (s == "selective") return CheckpointPolicy::Selective;
  fail("--gradient-checkpointing: unknown policy '", s, "' (expected none, layer or selective)");
}

GradientPlacement resolve_gradient_placement(const std::string& s, int64_t accum, bool reduced_each_micro_batch) {
  const bool fresh = accum == 1 || reduced_each_micro_batch;
  if (s == "own") return GradientPlacement::Own;
  if (s == "auto") return fresh ? GradientPlacement::InActivations : GradientPlacement::Own;
  if (s == "in-activations") {
    ANATOMY_CHECK(fresh, "--gradient-placement in-activations: needs --gradient-accumulation-steps 1 (got ", accum,
                  "; accumulated gradients must outlive the next micro-batch's forward) or --zero-stage 2");
    return GradientPlacement::InActivations;
  }
  fail("--gradient-placement: unknown value '", s, "' (expected auto, own or in-activations)");
}

const char* gradient_placement_name(GradientPlacement p) {
  return p == GradientPlacement::Own ? "own" : "in-activations";
}

// Shapes (R = B*T rows, H hidden, I intermediate, nh heads):
struct BertForSequenceClassification::LayerActs {
  Tensor qkv;                // (R, 3H)  q | k | v per token
  Tensor ctx;                // (R, H)   attention output before the output projection
  Tensor lse;                // (B, nh, T) F32, softmax log-sum-exp
  Tensor rstd1;              // (R) F32: LayerNorm 1 statistics (its backward reads h1)
  Tensor h1;                 // (R, H)   LayerNorm 1 output
  Tensor pre;                // (R, I)   GELU input
  Tensor g;                  // (R, I)   GELU output (a temporary under selective checkpointing)
  Tensor rstd2;              // (R) F32: LayerNorm 2 statistics (its backward reads the layer output)
};

struct BertForSequenceClassification::Acts {
  int64_t B = 0, T = 0;
  bool training = true;
  Tensor emb_sum, emb_rstd, emb_ln;            // (R, H) (scratch in training), (R), (R, H)
  Tensor mean;                                 // (R) F32 scratch: LayerNorm means (backward reads outputs)
  std::vector<Tensor> xs;                      // layer inputs/outputs (R, H): L+1 when training, 2 in eval
  std::vector<LayerActs> layers;               // L, or 1 reused (layer checkpointing, eval)
  Tensor cls, pooled, pooled_d;                // (B, H) each; pooled_d aliases pooled without dropout
  Tensor logits, dlogits;                      // (B, C) compute dtype
  Tensor losses;                               // (B) F32
  // Temporary arena: forward's branch output and backward's gradients.
  Tensor t1, t2, t3;                           // (R, H)
  Tensor big;                                  // (R, max(I, 3H))
  Tensor hd1, hd2;                             // (B, H)
  // Packed inference (Note [packed inference]): xs and layers[0] hold N <= R token rows.
  bool packed = false;
  Tensor qkv_pad, ctx_pad;                     // (R, 3H), (R, H): attention's padded layout
  // Packed training (Note [packed training]): the saved qkv and ctx keep the padded layout;
  // pk (R, 3H) is the packed q|k|v in forward and the packed dq|dk|dv in backward.
  bool packed_train = false;
  Tensor pk;
  const Tensor& x_in(int l) const { return training ? xs[l] : xs[l % 2]; }
  const Tensor& x_out(int l) const { return training ? xs[l + 1] : xs[(l + 1) % 2]; }
};

namespace {

// One layer's saved tensors. The LayerNorm inputs are not among them: backward reads the
// LayerNorm outputs instead (Note [layernorm backward from its output], ops/cpu/layernorm.cpp).
void carve_layer(Arena& ar, DType dt, int64_t R, int64_t B, int64_t T, int64_t H, int64_t I, int64_t nh,
                 bool keep_g, BertForSequenceClassification::LayerActs& la) {
  la.qkv = ar.take(dt, {R, 3 * H});
  la.ctx = ar.take(dt, {R, H});
  la.lse = ar.take(DType::F32, {B, nh, T});
  la.rstd1 = ar.take(DType::F32, {R});
  la.h1 = ar.take(dt, {R, H});
  la.pre = ar.take(dt, {R, I});
  if (keep_g) la.g = ar.take(dt, {R, I});
  la.rstd2 = ar.take(DType::F32, {R});
}

// Stages of backward, in the order it runs: when a saved tensor is read for the last time, and
// when a parameter's gradient is first written (Note [gradients in freed activations]).
constexpr int kStageHead = 0;
int stage_of_layer(int64_t l, int64_t L) { return static_cast<int>(L - l); }
int stage_of_embeddings(int64_t L) { return static_cast<int>(L + 1); }
constexpr int kAfterBackward = 1 << 30;  // read after backward (losses, logits)

}  // namespace

// A byte range of the activation arena and the last stage of backward that reads it.
struct ActRegion {
  size_t begin, end;
  int last_stage;
};

// The one place that lays out activations and temporaries; run dry it is the plan. `regions`
// (training only) receives the arena's byte ranges with their last readers.
static void carve_acts(BertForSequenceClassification::Acts& a, Arena& act, Arena& tmp, const BertConfig& cfg,
                       DType dt, CheckpointPolicy policy, int64_t B, int64_t T, bool training, bool packed_tokens,
                       std::vector<ActRegion>* regions = nullptr);

static void carve_packed(BertForSequenceClassification::Acts& a, Arena& act, Arena& tmp, const BertConfig& cfg,
                         DType dt, int64_t B, int64_t T);

// Note [gradients in freed activations]
// Backward walks the layers from the last to the first, so by the time layer l's gradients are
// written, the activations of layers l+1 .. L-1 have been read for the last time. PyTorch gets
// the benefit of this for free (gradients are allocated during backward, into blocks its
// caching allocator just got back, and freed by zero_grad(set_to_none=True)); here it is
// planned: when a step has one micro-batch, the fp32 gradients live inside the activation
// arena, at the lowest offset where no gradient range overlaps a saved tensor that is still to
// be read when that range is first written. The flat gradient layout (model/params.h) gives
// the ranges: the embedding matrices (written last), each layer's matrices in layer order, and
// a tail of the pooler and classifier matrices with every bias and LayerNorm vector (written
// first, as each layer adds its own vectors). The arena is carved head first, then the
// embeddings, then layer by layer (each layer's output with it), so the memory freed during
// backward is at the top and grows downwards, while the gradients ask for it layer by layer.
// Each range is zeroed just before its stage (the forward wrote activations there), and the
// gradients are then valid until the next forward: enough for clipping, the optimizer step
// and logging. With accumulation the gradients must survive the next micro-batch's forward,
// so they get their own buffer (GradientPlacement::Own). For bert-large at seq 512 this puts
// all but about one layer's worth of gradients (1.2 of 1.25 GiB) into memory that
// activations already hold at the peak.
struct GradRange {
  size_t begin, end;  // elements of the flat buffer
  int stage;          // the stage of backward that first writes it
};

static std::vector<GradRange> gradient_ranges(const BertConfig& cfg, const ParamLayout& lay) {
  const int64_t L = cfg.num_hidden_layers;
  std::vector<GradRange> out;
  auto first = [&](int64_t l) {
    return lay.get(l < L ? layer_prefix(static_cast<int>(l)) + "attention.self.query.weight" : "bert.pooler.dense.weight").offset;
  };
  out.push_back({0, first(0), stage_of_embeddings(L)});
  for (int64_t l = 0; l < L; ++l) out.push_back({first(l), first(l + 1), stage_of_layer(l, L)});
  out.push_back({first(L), lay.total(), kStageHead});
  return out;
}

// The lowest 256-byte aligned offset of the gradients in the activation arena (see the note).
static size_t gradient_offset(const std::vector<ActRegion>& regions, const std::vector<GradRange>& grads) {
  size_t q = 0;
  for (bool moved = true; moved;) {
    moved = false;
    for (const GradRange& g : grads)
      for (const ActRegion& r : regions) {
        const size_t gb = 4 * g.begin, ge = 4 * g.end;
        if (r.last_stage >= g.stage && q + gb < r.end && r.begin < q + ge) {
          q = Arena::round_up(r.end - gb);
          moved = true;
        }
      }
  }
  return q;
}

ArenaBytes model_arena_bytes(const BertConfig& cfg, const ModelShape& s) {
  Arena act = Arena::dry(), tmp = Arena::dry();
  BertForSequenceClassification::Acts a;
  std::vector<ActRegion> regions;
  carve_acts(a, act, tmp, cfg, s.compute, s.checkpointing, s.max_batch, s.max_seq, s.training, s.packed_tokens,
             &regions);
  // forward_eval may run on any model (the trainer evaluates its training model), padded or
  // packed: the arenas hold whichever layout is the largest.
  Arena pact = Arena::dry(), ptmp = Arena::dry();
  BertForSequenceClassification::Acts p;
  carve_packed(p, pact, ptmp, cfg, s.compute, s.max_batch, s.max_seq);
  size_t acts = std::max(act.used(), pact.used()), temps = std::max(tmp.used(), ptmp.used());
  if (s.training) {
    Arena eact = Arena::dry(), etmp = Arena::dry();
    BertForSequenceClassification::Acts e;
    carve_acts(e, eact, etmp, cfg, s.compute, s.checkpointing, s.max_batch, s.max_seq, false, false);
    acts = std::max(acts, eact.used());
    temps = std::max(temps, etmp.used());
  }
  ArenaBytes out{acts, temps, 0, 0};
  if (s.training && s.gradients == GradientPlacement::InActivations) {
    const ParamLayout lay = ParamLayout::for_sequence_classification(cfg);
    const size_t q = gradient_offset(regions, gradient_ranges(cfg, lay));
    if (q < acts) {  // otherwise nothing would be shared: the gradients keep a buffer of their own
      out.gradient_offset = q;
      out.block = std::max(acts, q + 4 * lay.total());
    }
  }
  return out;
}

static void carve_acts(BertForSequenceClassification::Acts& a, Arena& act, Arena& tmp, const BertConfig& cfg,
                       DType dt, CheckpointPolicy policy, int64_t B, int64_t T, bool training, bool packed_tokens,
                       std::vector<ActRegion>* regions) {
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, L = cfg.num_hidden_layers;
  const int64_t nh = cfg.num_attention_heads, C = cfg.num_labels, R = B * T;
  a.B = B;
  a.T = T;
  a.training = training;
  a.packed_train = training && packed_tokens;
  size_t mark = 0;
  auto open = [&] { mark = act.used(); };
  auto close = [&](int last_stage) {
    if (regions) regions->push_back({mark, act.used(), last_stage});
  };
  // The head: what outlives backward, then what the head's backward reads.
  open();
  a.logits = act.take(dt, {B, C});
  a.dlogits = act.take(dt, {B, C});
  a.losses = act.take(DType::F32, {B});
  close(kAfterBackward);
  open();
  a.cls = act.take(dt, {B, H});
  a.pooled = act.take(dt, {B, H});
  const double head_p = cfg.classifier_dropout.value_or(cfg.hidden_dropout_prob);
  a.pooled_d = (training && head_p > 0) ? act.take(dt, {B, H}) : a.pooled;
  close(kStageHead);
  // The embeddings (their sum is scratch: the LayerNorm's backward reads its output).
  open();
  a.emb_rstd = act.take(DType::F32, {R});
  a.emb_ln = act.take(dt, {R, H});
  const bool emb_dropout = training && cfg.hidden_dropout_prob > 0;
  a.xs.assign(training ? L + 1 : 2, Tensor());
  // Packed training gathers the token rows of the embeddings' output into a buffer of their own.
  a.xs[0] = (emb_dropout || a.packed_train) ? act.take(dt, {R, H}) : a.emb_ln;
  close(stage_of_embeddings(L));
  // The layers, each with its output: the input of the next, read by both layers' backward.
  const bool keep_g = !(training && policy != CheckpointPolicy::None);
  if (!training) {  // one layer's tensors; the hidden state ping-pongs between xs[0] and xs[1]
    a.layers.assign(1, {});
    carve_layer(act, dt, R, B, T, H, I, nh, keep_g, a.layers[0]);
    a.xs[1] = act.take(dt, {R, H});
  } else if (policy != CheckpointPolicy::Layer) {
    a.layers.assign(L, {});
    for (int64_t l = 0; l < L; ++l) {
      open();
      carve_layer(act, dt, R, B, T, H, I, nh, keep_g, a.layers[l]);
      a.xs[l + 1] = act.take(dt, {R, H});
      close(stage_of_layer(l, L));
    }
  } else {  // layer checkpointing: one layer's tensors, rebuilt by each layer's recompute
    a.layers.assign(1, {});
    open();
    carve_layer(act, dt, R, B, T, H, I, nh, keep_g, a.layers[0]);
    close(stage_of_layer(0, L));
    for (int64_t l = 0; l < L; ++l) {
      open();
      a.xs[l + 1] = act.take(dt, {R, H});
      close(stage_of_layer(l, L));
    }
  }

  a.t1 = tmp.take(dt, {R, H});
  a.mean = tmp.take(DType::F32, {R});
  a.emb_sum = a.t1;  // dead before the first layer uses t1 for its branch
  if (training) {
    a.t2 = tmp.take(dt, {R, H});
    a.t3 = tmp.take(dt, {R, H});
    a.big = tmp.take(dt, {R, std::max(I, 3 * H)});
    a.hd1 = tmp.take(dt, {B, H});
    a.hd2 = tmp.take(dt, {B, H});
    if (a.packed_train) a.pk = tmp.take(dt, {R, 3 * H});
    // Selective and layer checkpointing: the GELU output lives in backward's scratch, recomputed
    // there (under layer checkpointing the recomputed layer would otherwise hold it).
    if (policy != CheckpointPolicy::None)
      for (auto& la : a.layers) la.g = Tensor(a.big.data, dt, {R, I}, a.big.device);
  }
}

// Note [packed inference]: a batch padded to T wastes (B*T - N) / (B*T) of every row-wise op
// (the GEMMs, bias, GELU, LayerNorm with its residual) on padding tokens whose results nobody
// reads. forward_eval with a packing index (DeviceBatch::token_rows, N rows) runs the
// embeddings on the padded [B*T, H] batch (cheap: a table lookup), gathers the token rows into
// a packed [N, H] hidden state, and runs every row-wise op of the encoder on N rows. Attention
// is the one op that needs the [B, T] structure: the packed q|k|v rows are scattered into the
// padded layout, whose padding rows were zeroed once per forward (scatter never writes them;
// their keys are masked, so any finite value would do, and zero cannot be NaN), the existing
// masked attention runs, and the context rows are gathered back to N. The pooler reads each
// sequence's first token through first_rows. Every token row sees the same arithmetic as in the
// padded forward, so the logits agree (bitwise when nothing is padding and the GEMMs see the
// same shapes).
//
// Memory: carve_packed lays the same arenas out differently, and needs less than the padded
// eval layout (the padded context reuses the embeddings' dead sum, and the packed q|k|v the
// layer's row-wise tensors, dead until after the scatter). The arenas are sized for the larger
// of the two (model_arena_bytes), so the planner's numbers hold for either path.
static void carve_packed(BertForSequenceClassification::Acts& a, Arena& act, Arena& tmp, const BertConfig& cfg,
                         DType dt, int64_t B, int64_t T) {
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, nh = cfg.num_attention_heads;
  const int64_t C = cfg.num_labels, R = B * T;
  a.B = B;
  a.T = T;
  a.training = false;
  a.packed = true;
  a.emb_sum = act.take(dt, {R, H});
  a.emb_rstd = act.take(DType::F32, {R});
  a.emb_ln = act.take(dt, {R, H});
  a.xs = {a.emb_ln, act.take(dt, {R, H})};  // the packed hidden state ping-pongs between them
  a.ctx_pad = a.emb_sum;                    // the embeddings' sum is dead after their LayerNorm
  a.qkv_pad = act.take(dt, {R, 3 * H});
  a.layers.assign(1, {});
  BertForSequenceClassification::LayerActs& la = a.layers[0];
  la.lse = act.take(DType::F32, {B, nh, T});
  // The row-wise tensors lie back to back; the packed q|k|v overlays their start (it dies at the
  // scatter, before any of them is written), and so does the packed context (the output
  // projection reads it before LayerNorm 1 writes h1).
  const size_t start = act.used();
  la.h1 = act.take(dt, {R, H});
  la.pre = act.take(dt, {R, I});
  la.g = act.take(dt, {R, I});
  const size_t need = static_cast<size_t>(R * 3 * H) * dtype_size(dt);
  if (act.used() - start < need) act.take(DType::U8, {static_cast<int64_t>(need - (act.used() - start))});
  la.qkv = Tensor(la.h1.data, dt, {R, 3 * H}, la.h1.device);
  la.ctx = la.h1;
  la.rstd1 = act.take(DType::F32, {R});
  la.rstd2 = act.take(DType::F32, {R});
  a.cls = act.take(dt, {B, H});
  a.pooled = act.take(dt, {B, H});
  a.pooled_d = a.pooled;
  a.logits = act.take(dt, {B, C});
  a.dlogits = act.take(dt, {B, C});
  a.losses = act.take(DType::F32, {B});
  a.t1 = tmp.take(dt, {R, H});
  a.mean = tmp.take(DType::F32, {R});
}

PackedRows pack_token_rows(const int32_t* mask, int64_t B, int64_t T, int64_t multiple) {
  PackedRows p;
  p.first_rows.resize(static_cast<size_t>(B));
  std::vector<bool> taken(static_cast<size_t>(B * T), false);
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* m = mask + b * T;
    const bool any = std::any_of(m, m + T, [](int32_t v) { return v != 0; });
    p.first_rows[b] = static_cast<int32_t>(p.token_rows.size());
    for (int64_t t = 0; t < T; ++t)
      if (t == 0 || !any || m[t] != 0) {
        p.token_rows.push_back(static_cast<int32_t>(b * T + t));
        taken[b * T + t] = true;
      }
  }
  if (multiple > 1) {
    const int64_t n = static_cast<int64_t>(p.token_rows.size());
    const int64_t want = std::min(B * T, (n + multiple - 1) / multiple * multiple);
    for (int64_t r = 0; static_cast<int64_t>(p.token_rows.size()) < want; ++r)
      if (!taken[r]) p.token_rows.push_back(static_cast<int32_t>(r));
  }
  return p;
}

std::vector<LivenessPoint> activation_liveness(const BertConfig& cfg, const ModelShape& s) {
  const int64_t L = cfg.num_hidden_layers;
  // The training layout's regions with their last readers (Note [gradients in freed activations]):
  // forward writes a region at the stage it belongs to, backward is done with it after its last stage.
  Arena act = Arena::dry(), tmp = Arena::dry();
  BertForSequenceClassification::Acts a;
  std::vector<ActRegion> regions;
  carve_acts(a, act, tmp, cfg, s.compute, s.checkpointing, s.max_batch, s.max_seq, true, s.packed_tokens, &regions);
  auto bytes_where = [&](auto keep) {
    int64_t n = 0;
    for (const ActRegion& r : regions)
      if (keep(r.last_stage)) n += static_cast<int64_t>(r.end - r.begin);
    return n;
  };
  const bool in_acts = s.gradients == GradientPlacement::InActivations && model_arena_bytes(cfg, s).block != 0;
  const std::vector<GradRange> grads = gradient_ranges(cfg, ParamLayout::for_sequence_classification(cfg));
  auto grad_bytes_by = [&](int stage) -> int64_t {  // ranges first written at or before `stage`
    if (!in_acts) return -1;
    int64_t n = 0;
    for (const GradRange& g : grads)
      if (g.stage <= stage) n += static_cast<int64_t>(4 * (g.end - g.begin));
    return n;
  };
  std::vector<LivenessPoint> out;
  out.push_back({"step start", 0, grad_bytes_by(-1)});
  const int emb = stage_of_embeddings(L);
  out.push_back({"embeddings forward", bytes_where([&](int st) { return st == emb; }), grad_bytes_by(-1)});
  for (int64_t l = 0; l < L; ++l) {  // layers 0 .. l written: stages L - l .. L (and the embeddings)
    const int lo = stage_of_layer(l, L);
    out.push_back({str_cat("layer ", l, " forward"), bytes_where([&](int st) { return st >= lo && st <= emb; }),
                   grad_bytes_by(-1)});
  }
  out.push_back({"pooler, classifier, loss", bytes_where([](int) { return true; }), grad_bytes_by(kStageHead)});
  for (int64_t l = L - 1; l >= 0; --l) {  // during layer l's backward: what it and earlier stages still read
    const int st = stage_of_layer(l, L);
    out.push_back({str_cat("layer ", l, " backward"), bytes_where([&](int last) { return last >= st; }), grad_bytes_by(st)});
  }
  out.push_back({"embeddings backward", bytes_where([&](int last) { return last >= emb; }), grad_bytes_by(emb)});
  out.push_back({"optimizer step", bytes_where([](int last) { return last == kAfterBackward; }), grad_bytes_by(emb)});
  return out;
}

BertForSequenceClassification::BertForSequenceClassification(Backend& be, const BertConfig& cfg,
                                                             const ModelShape& shape)
    : m_be(be), m_cfg(cfg), m_layout(ParamLayout::for_sequence_classification(cfg)), m_shape(shape) {
  ANATOMY_CHECK(shape.max_batch > 0, "--per-device-train-batch-size must be at least 1");
  ANATOMY_CHECK(shape.max_seq > 0 && shape.max_seq <= cfg.max_position_embeddings, "--seq-len ", shape.max_seq,
                " must be between 1 and max_position_embeddings (", cfg.max_position_embeddings, ")");
  ANATOMY_CHECK(!(shape.packed_tokens && shape.checkpointing == CheckpointPolicy::Layer),
                "training on real tokens does not combine with --gradient-checkpointing layer (use selective or none)");
  Allocator& al = be.allocator();
  const int64_t n = static_cast<int64_t>(m_layout.total());
  m_master = Buffer(al, DType::F32, {n}, Category::Weights);
  if (shape.compute != DType::F32) {
    m_compute = Buffer(al, shape.compute, {n}, Category::Weights);
    m_compute_view = m_compute.tensor();
  } else {
    m_compute_view = m_master.tensor();
  }
  ArenaBytes bytes = model_arena_bytes(cfg, shape);
  if (bytes.block) {  // Note [gradients in freed activations]
    m_act_block = SharedBlock(al, bytes.block, Category::Activations, bytes.activations, Category::Gradients,
                              static_cast<size_t>(n) * 4);
    m_act_arena = Arena::over(m_act_block.data(), bytes.activations, al.device(), Category::Activations);
    m_grads_view = Tensor(m_act_block.data() + bytes.gradient_offset, DType::F32, {n}, al.device());
  } else {
    if (shape.training) {
      m_grads = Buffer(al, DType::F32, {n}, Category::Gradients);
      m_grads_view = m_grads.tensor();
    }
    m_act_arena = Arena(al, bytes.activations, Category::Activations);
  }
  if (shape.training)
    for (const GradRange& g : gradient_ranges(cfg, m_layout)) m_grad_ranges.emplace_back(g.begin, g.end);
  m_tmp_arena = Arena(al, bytes.temporary, Category::Temporary);
  m_acts = std::make_unique<Acts>();
}

BertForSequenceClassification::~BertForSequenceClassification() = default;

void BertForSequenceClassification::carve(int64_t B, int64_t T, bool training, bool packed) {
  ANATOMY_CHECK(B >= 1 && B <= m_shape.max_batch, "batch of ", B, " samples exceeds the planned micro-batch of ",
                m_shape.max_batch);
  ANATOMY_CHECK(T >= 1 && T <= m_shape.max_seq, "sequence length ", T, " exceeds the planned --seq-len ",
                m_shape.max_seq);
  ANATOMY_CHECK(!training || m_shape.training, "internal error: backward on an inference-only model");
  if (m_acts->B == B && m_acts->T == T && m_acts->training == training && m_acts->packed == packed &&
      !m_acts->xs.empty())
    return;
  m_act_arena.reset_to(0);
  m_tmp_arena.reset_to(0);
  *m_acts = Acts();
  if (packed)
    carve_packed(*m_acts, m_act_arena, m_tmp_arena, m_cfg, m_shape.compute, B, T);
  else
    carve_acts(*m_acts, m_act_arena, m_tmp_arena, m_cfg, m_shape.compute, m_shape.checkpointing, B, T, training,
               m_shape.packed_tokens);
}

DropoutSpec BertForSequenceClassification::drop(float p, uint64_t base, int site, bool training) const {
  if (!training || p <= 0) return {};
  return DropoutSpec{p, m_seed, base + static_cast<uint64_t>(site)};
}

void BertForSequenceClassification::init_weights(uint64_t seed) {
  Rng rng(seed);
  std::vector<float> flat(m_layout.total(), 0.0f);
  const double std = m_cfg.initializer_range;
  for (const auto& p : m_layout.params()) {
    float* w = flat.data() + p.offset;
    const bool is_ln = p.name.find("LayerNorm.weight") != std::string::npos;
    if (is_ln) {
      std::fill(w, w + p.numel(), 1.0f);
    } else if (p.decay) {  // every matrix: Linear and Embedding weights
      for (size_t i = 0; i < p.numel(); ++i) w[i] = static_cast<float>(rng.normal() * std);
    }
  }
  // nn.Embedding(padding_idx=pad_token_id) keeps that row at zero.
  const auto& word = m_layout.get("bert.embeddings.word_embeddings.weight");
  if (m_cfg.pad_token_id >= 0 && m_cfg.pad_token_id < m_cfg.vocab_size)
    std::fill_n(flat.data() + word.offset + m_cfg.pad_token_id * m_cfg.hidden_size, m_cfg.hidden_size, 0.0f);
  set_master_from_host(flat);
}

void BertForSequenceClassification::set_master_from_host(const std::vector<float>& flat) {
  ANATOMY_ASSERT(flat.size() == m_layout.total());
  m_be.upload(m_master.tensor(), flat.data());
  sync_compute_copy();
}

std::vector<float> BertForSequenceClassification::master_to_host() {
  std::vector<float> out(m_layout.total());
  m_be.download(out.data(), m_master.tensor());
  return out;
}

std::vector<float> BertForSequenceClassification::grads_to_host() {
  std::vector<float> out(m_layout.total());
  m_be.download(out.data(), m_grads_view);
  return out;
}

void BertForSequenceClassification::sync_compute_copy() {
  if (m_compute.data()) m_be.cast(m_compute.tensor(), m_master.tensor());
}

void BertForSequenceClassification::zero_grads() { m_be.fill(m_grads_view, 0.0f); }

std::vector<std::string> BertForSequenceClassification::layernorm_weights_below(float limit) {
  std::vector<std::string> out;
  for (const ParamInfo& p : m_layout.params()) {
    if (p.name.find("LayerNorm.weight") == std::string::npos) continue;
    std::vector<float> v(p.numel());
    m_be.download(v.data(), m_layout.view(m_master.tensor(), p));
    if (std::any_of(v.begin(), v.end(), [&](float x) { return std::fabs(x) < limit; })) out.push_back(p.name);
  }
  return out;
}

void BertForSequenceClassification::zero_grad_range(size_t begin, size_t end) {
  if (end > begin) m_be.fill(ParamLayout::range(m_grads_view, begin, {static_cast<int64_t>(end - begin)}), 0.0f);
}

// Dropout sites per micro-batch: 0 embeddings, 1 + 3l + {0: attention probs, 1: attention
// output, 2: feed-forward output}, 1 + 3L pooler. Backward and recompute use the same sites.
static float head_dropout(const BertConfig& c) {
  return static_cast<float>(c.classifier_dropout.value_or(c.hidden_dropout_prob));
}
static int site_attn(int l) { return 1 + 3 * l; }
static int site_attn_out(int l) { return 2 + 3 * l; }
static int site_ffn_out(int l) { return 3 + 3 * l; }

void BertForSequenceClassification::layer_forward(int l, const Tensor& x, const Tensor& out, LayerActs& a,
                                                  const DeviceBatch& b, bool training, uint64_t base,
                                                  const Tensor& branch) {
  const std::string p = layer_prefix(l);
  const int64_t H = m_cfg.hidden_size, nh = m_cfg.num_attention_heads;
  const float eps = static_cast<float>(m_cfg.layer_norm_eps);
  const float hp = static_cast<float>(m_cfg.hidden_dropout_prob), ap = static_cast<float>(m_cfg.attention_probs_dropout_prob);
  const ParamInfo& wq = m_layout.get(p + "attention.self.query.weight");
  const ParamInfo& bq = m_layout.get(p + "attention.self.query.bias");
  Tensor wqkv = ParamLayout::range(m_compute_view, wq.offset, {3 * H, H});
  Tensor bqkv = ParamLayout::range(m_compute_view, bq.offset, {3 * H});

  // Packed training (Note [packed training]): q|k|v of the token rows go to scratch, then into
  // the saved padded layout, and the context rows come back through t2 (free in forward).
  const bool pk = m_acts->packed_train;
  const Tensor qkv_rows = pk ? m_acts->pk.slice(0, x.dim(0)) : a.qkv;
  Tensor ctx_rows = a.ctx;
  m_be.matmul(qkv_rows, x, Trans::N, wqkv, Trans::T, {1, 0, Epilogue::Bias, bqkv, {}});
  if (m_acts->packed) {  // Note [packed inference]: attention on the padded layout
    const Tensor& qkv_pad = m_acts->qkv_pad;
    m_be.scatter_rows(qkv_pad, a.qkv, b.token_rows);
    m_be.attention_forward(m_acts->ctx_pad.view({m_acts->B, m_acts->T, H}), a.lse,
                           qkv_pad.view({m_acts->B, m_acts->T, 3 * H}), b.attention_mask, static_cast<int>(nh), {});
    m_be.gather_rows(a.ctx, m_acts->ctx_pad, b.token_rows);
  } else {
    if (pk) {
      m_be.fill(a.qkv, 0.0f);  // padding rows: masked keys, any finite value; zero is never NaN
      m_be.scatter_rows(a.qkv, qkv_rows, b.token_rows);
    }
    m_be.attention_forward(a.ctx.view({m_acts->B, m_acts->T, H}), a.lse, a.qkv.view({m_acts->B, m_acts->T, 3 * H}),
                           b.attention_mask, static_cast<int>(nh), drop(ap, base, site_attn(l), training));
    if (pk) {
      ctx_rows = m_acts->t2.slice(0, x.dim(0));
      m_be.gather_rows(ctx_rows, a.ctx, b.token_rows);
    }
  }
  m_be.matmul(branch, ctx_rows, Trans::N, W(p + "attention.output.dense.weight"), Trans::T,
              {1, 0, Epilogue::Bias, W(p + "attention.output.dense.bias"), {}});
  const Tensor mean = m_acts->mean.slice(0, a.h1.dim(0));  // scratch: backward reads the outputs
  m_be.layernorm_forward(a.h1, Tensor(), mean, a.rstd1, branch, x, W(p + "attention.output.LayerNorm.weight"),
                         W(p + "attention.output.LayerNorm.bias"), eps, drop(hp, base, site_attn_out(l), training));
  m_be.matmul(a.g, a.h1, Trans::N, W(p + "intermediate.dense.weight"), Trans::T,
              {1, 0, Epilogue::BiasGelu, W(p + "intermediate.dense.bias"), a.pre});
  m_be.matmul(branch, a.g, Trans::N, W(p + "output.dense.weight"), Trans::T,
              {1, 0, Epilogue::Bias, W(p + "output.dense.bias"), {}});
  m_be.layernorm_forward(out, Tensor(), mean, a.rstd2, branch, a.h1, W(p + "output.LayerNorm.weight"),
                         W(p + "output.LayerNorm.bias"), eps, drop(hp, base, site_ffn_out(l), training));
}

// dout arrives in t1; returns the tensor holding dx (one of t1, t2, t3).
Tensor BertForSequenceClassification::layer_backward(int l, const Tensor& dout, LayerActs& a, const Tensor& x,
                                                     const Tensor& out, const DeviceBatch& b, uint64_t base, const Tensor& X1,
                                                     const Tensor& X2, const Tensor& X3) {
  const std::string p = layer_prefix(l);
  const int64_t H = m_cfg.hidden_size, I = m_cfg.intermediate_size, nh = m_cfg.num_attention_heads;
  const int64_t R = m_acts->B * m_acts->T;
  const float hp = static_cast<float>(m_cfg.hidden_dropout_prob), ap = static_cast<float>(m_cfg.attention_probs_dropout_prob);
  const MatmulArgs acc{1, 1, Epilogue::None, {}, {}};  // C += A B (gradients and residual sums)
  const MatmulArgs put{1, 0, Epilogue::None, {}, {}};
  // Packed training: the row-wise tensors have n = N token rows (x, out and a's row tensors come
  // sliced); attention reads its saved padded qkv and ctx (Note [packed training]).
  const bool pk = m_acts->packed_train;
  const int64_t n = x.dim(0);
  auto rows = [&](const Tensor& t) { return pk ? t.slice(0, n) : t; };
  const Tensor x1 = rows(X1), x2 = rows(X2), x3 = rows(X3), dy = rows(dout);
  Tensor big = m_acts->big.view({static_cast<int64_t>(m_acts->big.numel())});
  Tensor dI = big.slice(0, n * I).view({n, I});
  Tensor dqkv = big.slice(0, R * 3 * H).view({R, 3 * H});

  if (m_shape.checkpointing != CheckpointPolicy::None) m_be.gelu_forward(a.g, a.pre);
  // LayerNorm 2: ds2 (X2) reaches h1 through the residual; df2 (X3) reaches the FFN output.
  m_be.layernorm_backward(x2, x3, G(p + "output.LayerNorm.weight"), G(p + "output.LayerNorm.bias"), dy, out,
                          a.rstd2, W(p + "output.LayerNorm.weight"), W(p + "output.LayerNorm.bias"),
                          drop(hp, base, site_ffn_out(l), true));
  // FFN out: y = g W2^T + b2, W2 (H, I). dW2 first: under selective checkpointing g shares
  // its memory with dI.
  m_be.matmul(G(p + "output.dense.weight"), x3, Trans::T, a.g, Trans::N, acc);
  m_be.bias_grad(G(p + "output.dense.bias"), x3);
  m_be.matmul(dI, x3, Trans::N, W(p + "output.dense.weight"), Trans::N, put);
  m_be.gelu_backward(dI, dI, a.pre);
  // FFN in: pre = h1 W1^T + b1, W1 (I, H); dh1 = dpre W1 + ds2.
  m_be.matmul(x2, dI, Trans::N, W(p + "intermediate.dense.weight"), Trans::N, acc);
  m_be.matmul(G(p + "intermediate.dense.weight"), dI, Trans::T, a.h1, Trans::N, acc);
  m_be.bias_grad(G(p + "intermediate.dense.bias"), dI);
  // LayerNorm 1: ds1 (X3) reaches x; dao (X1) reaches the attention output projection.
  m_be.layernorm_backward(x3, x1, G(p + "attention.output.LayerNorm.weight"), G(p + "attention.output.LayerNorm.bias"),
                          x2, a.h1, a.rstd1, W(p + "attention.output.LayerNorm.weight"),
                          W(p + "attention.output.LayerNorm.bias"),
                          drop(hp, base, site_attn_out(l), true));
  m_be.matmul(x2, x1, Trans::N, W(p + "attention.output.dense.weight"), Trans::N, put);  // dctx
  Tensor ctx_rows = a.ctx, dctx = x2;
  if (pk) {  // the context's token rows, in dI's dead memory
    ctx_rows = big.slice(0, n * H).view({n, H});
    m_be.gather_rows(ctx_rows, a.ctx, b.token_rows);
  }
  m_be.matmul(G(p + "attention.output.dense.weight"), x1, Trans::T, ctx_rows, Trans::N, acc);
  m_be.bias_grad(G(p + "attention.output.dense.bias"), x1);
  if (pk) {  // dao is consumed: X1's whole buffer takes dctx in the padded layout, zero on padding
    m_be.fill(X1, 0.0f);
    m_be.scatter_rows(X1, x2, b.token_rows);
    dctx = X1;
  }
  m_be.attention_backward(dqkv.view({m_acts->B, m_acts->T, 3 * H}), dctx.view({m_acts->B, m_acts->T, H}),
                          a.qkv.view({m_acts->B, m_acts->T, 3 * H}), a.ctx.view({m_acts->B, m_acts->T, H}), a.lse,
                          b.attention_mask, static_cast<int>(nh), drop(ap, base, site_attn(l), true));
  Tensor dqkv_rows = dqkv;
  if (pk) {
    dqkv_rows = m_acts->pk.slice(0, n);
    m_be.gather_rows(dqkv_rows, dqkv, b.token_rows);
  }
  // QKV: qkv = x Wqkv^T + bqkv; dx = dqkv Wqkv + ds1.
  const ParamInfo& wq = m_layout.get(p + "attention.self.query.weight");
  const ParamInfo& bq = m_layout.get(p + "attention.self.query.bias");
  Tensor wqkv = ParamLayout::range(m_compute_view, wq.offset, {3 * H, H});
  m_be.matmul(x3, dqkv_rows, Trans::N, wqkv, Trans::N, acc);
  m_be.matmul(ParamLayout::range(m_grads_view, wq.offset, {3 * H, H}), dqkv_rows, Trans::T, x, Trans::N, acc);
  m_be.bias_grad(ParamLayout::range(m_grads_view, bq.offset, {3 * H}), dqkv_rows);
  return X3;
}

// Note [packed training]: training on the batch's real tokens. As in packed inference (Note
// [packed inference]), every row-wise op of the encoder (the GEMMs, bias, GELU, dropout,
// LayerNorm with its residual) runs on the N token rows of DeviceBatch::token_rows instead of
// B*T. The embeddings and their LayerNorm run padded (a lookup; their backward scatters the token
// rows' gradient into a zeroed padded buffer), and attention keeps the padded layout: each layer
// saves its q|k|v and context padded (the packed q|k|v is scattered into the zeroed layer buffer,
// the context rows gathered back), and backward scatters dctx into a zeroed padded buffer, runs
// the masked attention backward and gathers dq|dk|dv. Padding rows carry zeros there, and a zero
// output gradient contributes nothing to dK and dV, so every token row sees the padded path's
// arithmetic: losses and gradients agree with it (bitwise when nothing is padding and the GEMMs
// see the same shapes; to rounding otherwise). Hidden-state dropout draws its mask by packed row,
// so with dropout the masks differ from the padded run's (same distribution). The saved tensors
// are carved for B*T rows as before and used for N, so the plan holds for any batch; the one
// extra buffer is pk (B*T x 3H scratch). Layer checkpointing is not supported (its recompute
// uses the scratch this path lends out).
static BertForSequenceClassification::LayerActs token_rows_of(const BertForSequenceClassification::LayerActs& la,
                                                            int64_t n) {
  BertForSequenceClassification::LayerActs v = la;
  for (Tensor* t : {&v.rstd1, &v.h1, &v.pre, &v.g, &v.rstd2})
    if (t->defined()) *t = t->slice(0, n);
  return v;
}

void BertForSequenceClassification::forward(const DeviceBatch& b, bool training, uint64_t base) {
  const int64_t B = b.batch(), T = b.seq(), L = m_cfg.num_hidden_layers, H = m_cfg.hidden_size;
  const bool pk = training && b.packed();
  ANATOMY_CHECK(!pk || m_shape.packed_tokens, "internal error: a packed training batch for a model shaped without packed_tokens");
  carve(B, T, training);
  m_be.set_phase(Phase::Forward);
  Acts& a = *m_acts;
  const int64_t n = pk ? static_cast<int64_t>(b.token_rows.numel()) : B * T;
  auto rows = [&](const Tensor& t) { return pk ? t.slice(0, n) : t; };
  const float eps = static_cast<float>(m_cfg.layer_norm_eps), hp = static_cast<float>(m_cfg.hidden_dropout_prob);
  m_be.embedding_forward(a.emb_sum, b.input_ids, b.token_type_ids, W("bert.embeddings.word_embeddings.weight"),
                         W("bert.embeddings.position_embeddings.weight"), W("bert.embeddings.token_type_embeddings.weight"));
  m_be.layernorm_forward(a.emb_ln, Tensor(), a.mean, a.emb_rstd, a.emb_sum, Tensor(),
                         W("bert.embeddings.LayerNorm.weight"), W("bert.embeddings.LayerNorm.bias"), eps, {});
  if (pk) {
    m_be.gather_rows(rows(a.xs[0]), a.emb_ln, b.token_rows);
    if (training && hp > 0) m_be.dropout_forward(rows(a.xs[0]), rows(a.xs[0]), drop(hp, base, 0, training));
  } else if (a.xs[0].data != a.emb_ln.data) {
    m_be.dropout_forward(a.xs[0], a.emb_ln, drop(hp, base, 0, training));
  }
  for (int l = 0; l < L; ++l) {
    LayerActs& la = a.layers[a.layers.size() == 1 ? 0 : l];
    if (pk) {
      LayerActs v = token_rows_of(la, n);
      layer_forward(l, rows(a.x_in(l)), rows(a.x_out(l)), v, b, training, base, rows(a.t1));
    } else {
      layer_forward(l, a.x_in(l), a.x_out(l), la, b, training, base, a.t1);
    }
  }
  // Pooler on the first token, then the classifier.
  if (pk)
    m_be.gather_rows(a.cls, rows(a.x_in(static_cast<int>(L))), b.first_rows);
  else
    m_be.select_token(a.cls, a.x_in(static_cast<int>(L)).view({B, T, H}), 0);
  m_be.matmul(a.pooled, a.cls, Trans::N, W("bert.pooler.dense.weight"), Trans::T,
              {1, 0, Epilogue::Bias, W("bert.pooler.dense.bias"), {}});
  m_be.tanh_forward(a.pooled, a.pooled);
  if (a.pooled_d.data != a.pooled.data)
    m_be.dropout_forward(a.pooled_d, a.pooled, drop(head_dropout(m_cfg), base, site_attn(static_cast<int>(L)), training));
  m_be.matmul(a.logits, a.pooled_d, Trans::N, W("classifier.weight"), Trans::T,
              {1, 0, Epilogue::Bias, W("classifier.bias"), {}});
  m_losses = a.losses;
  m_logits = a.logits;
  m_hidden = pk ? Tensor() : a.x_in(static_cast<int>(L)).view({B, T, H});
}

void BertForSequenceClassification::forward_backward(const DeviceBatch& b, float grad_scale, uint64_t base) {
  forward(b, true, base);
  Acts& a = *m_acts;
  const int64_t B = a.B, T = a.T, L = m_cfg.num_hidden_layers, H = m_cfg.hidden_size;
  const bool pk = a.packed_train && b.packed();
  const int64_t n = pk ? static_cast<int64_t>(b.token_rows.numel()) : B * T;
  auto rows = [&](const Tensor& t) { return pk ? t.slice(0, n) : t; };
  const float hp = static_cast<float>(m_cfg.hidden_dropout_prob);
  const MatmulArgs acc{1, 1, Epilogue::None, {}, {}};
  const MatmulArgs put{1, 0, Epilogue::None, {}, {}};
  m_be.cross_entropy(a.losses, a.dlogits, a.logits, b.labels, grad_scale);
  m_be.set_phase(Phase::Backward);
  // Gradients in freed activations: each stage's range is zeroed just before it is written.
  const bool overlaid = m_act_block.data() != nullptr;
  const auto& ranges = m_grad_ranges;  // [embeddings, layer 0 .. L-1, tail]
  if (overlaid) zero_grad_range(ranges.back().first, ranges.back().second);

  // Classifier and pooler.
  m_be.matmul(G("classifier.weight"), a.dlogits, Trans::T, a.pooled_d, Trans::N, acc);
  m_be.bias_grad(G("classifier.bias"), a.dlogits);
  m_be.matmul(a.hd1, a.dlogits, Trans::N, W("classifier.weight"), Trans::N, put);
  if (a.pooled_d.data != a.pooled.data)
    m_be.dropout_backward(a.hd1, a.hd1, drop(head_dropout(m_cfg), base, site_attn(static_cast<int>(L)), true));
  m_be.tanh_backward(a.hd1, a.hd1, a.pooled);
  m_be.matmul(G("bert.pooler.dense.weight"), a.hd1, Trans::T, a.cls, Trans::N, acc);
  m_be.bias_grad(G("bert.pooler.dense.bias"), a.hd1);
  m_be.matmul(a.hd2, a.hd1, Trans::N, W("bert.pooler.dense.weight"), Trans::N, put);
  if (pk) {
    m_be.fill(rows(a.t1), 0.0f);
    m_be.scatter_rows(rows(a.t1), a.hd2, b.first_rows);
  } else {
    m_be.select_token_backward(a.t1.view({B, T, H}), a.hd2, 0);
  }

  // Encoder layers in reverse; the gradient rotates through t1, t2, t3.
  Tensor X1 = a.t1, X2 = a.t2, X3 = a.t3;
  for (int l = static_cast<int>(L) - 1; l >= 0; --l) {
    LayerActs& la = a.layers[a.layers.size() == 1 ? 0 : l];
    // Layer checkpointing: recompute this layer's forward from its saved input (X2 is free
    // scratch here). It rewrites xs[l+1] with the values it already holds.
    if (m_shape.checkpointing == CheckpointPolicy::Layer && l != L - 1) layer_forward(l, a.x_in(l), a.x_out(l), la, b, true, base, X2);
    if (overlaid) zero_grad_range(ranges[1 + l].first, ranges[1 + l].second);
    LayerActs v = pk ? token_rows_of(la, n) : la;
    Tensor dx = layer_backward(l, X1, v, rows(a.x_in(l)), rows(a.x_out(l)), b, base, X1, X2, X3);
    if (m_on_layer_grads) m_on_layer_grads(ranges[1 + l].first, ranges[1 + l].second);
    // Rotate so that dx becomes the next layer's incoming gradient.
    Tensor others[2];
    int k = 0;
    for (const Tensor* t : {&X1, &X2, &X3})
      if (t->data != dx.data) others[k++] = *t;
    X1 = dx;
    X2 = others[0];
    X3 = others[1];
  }
  // Embeddings: dropout, LayerNorm (no residual), then the three tables.
  if (pk) {  // the token rows' gradient into a zeroed padded buffer; the rest runs padded
    if (hp > 0) m_be.dropout_backward(rows(X1), rows(X1), drop(hp, base, 0, true));
    m_be.fill(X3, 0.0f);
    m_be.scatter_rows(X3, rows(X1), b.token_rows);
    std::swap(X1, X3);
  } else if (a.xs[0].data != a.emb_ln.data) {
    m_be.dropout_backward(X1, X1, drop(hp, base, 0, true));
  }
  if (overlaid) zero_grad_range(ranges.front().first, ranges.front().second);
  m_be.layernorm_backward(X2, Tensor(), G("bert.embeddings.LayerNorm.weight"), G("bert.embeddings.LayerNorm.bias"), X1,
                          a.emb_ln, a.emb_rstd, W("bert.embeddings.LayerNorm.weight"),
                          W("bert.embeddings.LayerNorm.bias"), {});
  m_be.embedding_backward(G("bert.embeddings.word_embeddings.weight"), G("bert.embeddings.position_embeddings.weight"),
                          G("bert.embeddings.token_type_embeddings.weight"), X2, b.input_ids, b.token_type_ids);
  if (overlaid) m_hidden = Tensor();  // its memory now holds gradients
}

void BertForSequenceClassification::forward_eval(const DeviceBatch& b) {
  if (b.packed())
    forward_packed(b);
  else
    forward(b, false, 0);
}

void BertForSequenceClassification::forward_packed(const DeviceBatch& b) {
  const int64_t B = b.batch(), T = b.seq(), L = m_cfg.num_hidden_layers;
  const int64_t N = static_cast<int64_t>(b.token_rows.numel());
  ANATOMY_CHECK(b.token_rows.dtype == DType::I32 && b.token_rows.shape.rank == 1 && N >= B && N <= B * T,
                "internal error: token_rows ", b.token_rows.shape.str(), " is not I32 [N] with ", B, " <= N <= ", B * T);
  ANATOMY_CHECK(b.first_rows.defined() && b.first_rows.dtype == DType::I32 && b.first_rows.numel() == static_cast<size_t>(B),
                "internal error: first_rows is not I32 [", B, "]");
  carve(B, T, false, true);
  m_be.set_phase(Phase::Forward);
  Acts& a = *m_acts;
  const float eps = static_cast<float>(m_cfg.layer_norm_eps);
  m_be.embedding_forward(a.emb_sum, b.input_ids, b.token_type_ids, W("bert.embeddings.word_embeddings.weight"),
                         W("bert.embeddings.position_embeddings.weight"), W("bert.embeddings.token_type_embeddings.weight"));
  m_be.layernorm_forward(a.emb_ln, Tensor(), a.mean, a.emb_rstd, a.emb_sum, Tensor(),
                         W("bert.embeddings.LayerNorm.weight"), W("bert.embeddings.LayerNorm.bias"), eps, {});
  m_be.fill(a.qkv_pad, 0.0f);  // padding rows stay zero: the scatters write token rows only
  // N-row views of the carved tensors (lse stays [B, heads, T]).
  LayerActs la = a.layers[0];
  for (Tensor* t : {&la.qkv, &la.ctx, &la.rstd1, &la.h1, &la.pre, &la.g, &la.rstd2})
    *t = t->slice(0, N);
  Tensor x = a.xs[1].slice(0, N), y = a.xs[0].slice(0, N);  // xs[0] is the embeddings' output until the gather
  m_be.gather_rows(x, a.emb_ln, b.token_rows);
  for (int l = 0; l < L; ++l) {
    layer_forward(l, x, y, la, b, false, 0, a.t1.slice(0, N));
    std::swap(x, y);
  }
  // Pooler on each sequence's first token, then the classifier (no dropout in eval).
  m_be.gather_rows(a.cls, x, b.first_rows);
  m_be.matmul(a.pooled, a.cls, Trans::N, W("bert.pooler.dense.weight"), Trans::T,
              {1, 0, Epilogue::Bias, W("bert.pooler.dense.bias"), {}});
  m_be.tanh_forward(a.pooled, a.pooled);
  m_be.matmul(a.logits, a.pooled, Trans::N, W("classifier.weight"), Trans::T,
              {1, 0, Epilogue::Bias, W("classifier.bias"), {}});
  m_losses = a.losses;
  m_logits = a.logits;
  m_hidden = Tensor();  // no [B, T, H] encoder output on this path: the hidden state is packed
}

}  // namespace anatomy
