#include "model/bert.h"
#include "model/modernbert.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/rng.h"
#include "model/freed_activations.h"
#include "model/heads.h"
#include "ops/backend_memory.h"

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
  // E = embedding width (hidden size but for ELECTRA's embedding_size).
  Tensor emb_sum, emb_rstd, emb_ln;            // (R, E) (scratch in training), (R), (R, E)
  Tensor emb_d;                                // (R, E) ELECTRA's projection input (may alias emb_ln)
  Tensor zero_type, type_sink;                 // (1, E) DistilBERT: no token types (Note [encoder variants])
  Tensor mean;                                 // (R) F32 scratch: LayerNorm means (backward reads outputs)
  std::vector<Tensor> xs;                      // layer inputs/outputs (R, H): L+1 when training, 2 in eval
  std::vector<LayerActs> layers;               // L, or 1 reused (layer checkpointing, eval)
  Tensor cls, pooled, pooled_d;                // (B, H) each; pooled_d aliases pooled without dropout
  bool first_tokens = false;                   // Note [last layer on the first tokens]: then cls is
  Tensor cls_ctx;                              // the last layer's output and cls_ctx (B, H) its context
  Tensor cls_d, head_pre;                      // (B, H): the head's input after its first dropout
                                               // (aliases cls without one), ELECTRA's GELU input
  Tensor logits, dlogits;                      // (B, C) compute dtype; masked-LM (R, V)
  Tensor lm_pre, lm_h, lm_rstd;                // masked-LM head: (R, H) GELU input, (R, H) output, (R)
  Tensor tok_xd;                               // token classification: (R, H) dropped-out input (training)
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
  // This forward's batch attends on its packed rows (Note [packed attention]): decided once per
  // forward, so that its backward reads the layout the forward wrote.
  bool packed_attention = false;
  const Tensor& x_in(int l) const { return training ? xs[l] : xs[l % 2]; }
  const Tensor& x_out(int l) const { return training ? xs[l + 1] : xs[(l + 1) % 2]; }
};

// Note [encoder variants]
// BERT, RoBERTa (and XLM-R, the same module), DistilBERT and ELECTRA's discriminator share the
// post-LayerNorm encoder layer exactly (the attention, output projection, residual LayerNorm,
// GELU feed-forward, residual LayerNorm); they differ at three points, each an explicit switch
// on BertConfig::architecture here and nowhere else, and in the tensor names (model/params.cpp):
//   embeddings: word + position (+ token type) -> LayerNorm -> dropout. RoBERTa reads the
//     position table from row pad_token_id + 1 (Note [roberta positions]); DistilBERT has no
//     token-type table (the op adds a zeroed row, whose gradient goes to a sink); ELECTRA's
//     tables have width embedding_size E and, when E differs from the hidden size, a Linear
//     embeddings_project maps the dropped-out embeddings to H.
//   layer: DistilBERT has no dropout on the attention output (its sa_layer_norm adds the raw
//     projection), the others drop it with hidden_dropout_prob.
//   head on the first token: BERT pooler (dense, tanh) -> dropout -> classifier; RoBERTa
//     dropout -> dense -> tanh -> dropout -> out_proj; ELECTRA the same with GELU; DistilBERT
//     pre_classifier -> ReLU -> dropout -> classifier. Head dropout is classifier_dropout or
//     hidden_dropout_prob (DistilBERT's seq_classif_dropout is read into classifier_dropout).
//
// Note [roberta positions]
// transformers gives a RoBERTa token the position pad_token_id + (number of non-padding tokens up
// to and including it), and padding tokens the position pad_token_id. anatomy's batches are padded
// on the right with attention mask 0, so every token before the padding sits at position
// pad_token_id + 1 + t: the model reads the position table from row pad_token_id + 1 on, as a
// view, with the ordinary embedding op. The padding rows read other rows than in transformers,
// but their keys are masked and nothing reads their outputs, so logits, losses and every
// gradient are the same. The one difference: a token equal to pad_token_id inside the text
// (attention mask 1) takes position pad_token_id + 1 + t where transformers would give it
// pad_token_id and not count it.
// The token-classification head's dropout: classifier_dropout or hidden_dropout_prob, but for
// DistilBERT its dropout (hidden_dropout_prob here; seq_classif_dropout is the sequence head's).
static float token_head_dropout(const BertConfig& c) {
  if (c.architecture == Architecture::DistilBert) return static_cast<float>(c.hidden_dropout_prob);
  return static_cast<float>(c.classifier_dropout.value_or(c.hidden_dropout_prob));
}

// Note [normalization parameters in fp32]
// In bf16 and fp16 the GEMMs read the compute-dtype copy of the weights, but the LayerNorms'
// gamma and beta and the embedding tables are read from the fp32 master weights, as PyTorch's
// autocast does (it keeps LayerNorm and embedding lookups in fp32). Rounding them to bf16 moves
// every LayerNorm output by a systematic relative error up to 2^-9 per column (the same one in
// every row and every step), which the residual stream carries through all layers: on the
// golden fixtures it was most of the difference between anatomy's bf16 and autocast's: on the
// CPU, autocast with these parameters (and the biases, which autocast rounds anyway) rounded to
// bf16 gave RoBERTa's logits a relative error of 0.0245 against autocast's own 0.0122, and
// anatomy's bf16 measured 0.0255 on the H100; reading them in fp32, every bf16 golden test
// passes there (bench/results/2026-11-25-h100/session7-bf16/).
// The embedding kernel sums the three table rows in fp32 and rounds once; the LayerNorm kernels
// take the statistics of the fp32 sum of branch and residual unless the sum is stored.
// Costs nothing measurable: H floats per LayerNorm, the table rows a step reads.

static bool head_drops_input(const BertConfig& c) {
  return c.is_roberta() || c.architecture == Architecture::Electra;
}

namespace {

// One layer's saved tensors. The LayerNorm inputs are not among them: backward reads the
// LayerNorm outputs instead (Note [layernorm backward from its output], ops/cpu/layernorm.cpp).
// keep_pre false: the GELU input lives elsewhere (Note [recomputed FFN input]); pre_begin, when
// given, receives the byte offset of this layer's GELU input, which then has R rows (the layers
// below write theirs there). N: the rows past attention (R, or B on the first tokens: Note [last
// layer on the first tokens]).
void carve_layer(Arena& ar, DType dt, int64_t R, int64_t N, int64_t B, int64_t T, int64_t H, int64_t I, int64_t nh,
                 bool keep_g, BertForSequenceClassification::LayerActs& la, bool keep_pre = true,
                 size_t* pre_begin = nullptr) {
  la.qkv = ar.take(dt, {R, 3 * H});
  la.ctx = ar.take(dt, {R, H});
  la.lse = ar.take(DType::F32, {B, nh, T});
  la.rstd1 = ar.take(DType::F32, {N});
  la.h1 = ar.take(dt, {N, H});
  if (pre_begin) *pre_begin = ar.used();
  if (keep_pre) la.pre = ar.take(dt, {pre_begin ? R : N, I});
  if (keep_g) la.g = ar.take(dt, {N, I});
  la.rstd2 = ar.take(DType::F32, {N});
}

// Stages of backward, in the order it runs: when a saved tensor is read for the last time, and
// when a parameter's gradient is first written (Note [gradients in freed activations]).
using freed::kAfterBackward;
using freed::kStageHead;
using freed::stage_of_embeddings;
using freed::stage_of_layer;

// Note [recomputed FFN input]
// Selective checkpointing saves, per layer of bert-large at batch 32 x 512 in bf16 (R = 16384
// rows): q|k|v 96 MiB, the context 32, LayerNorm 1's output h1 32, the GELU input `pre` 128, the
// layer output 32 (the next layer's input), the log-sum-exp 1 and two rstd vectors 0.125:
// 321.1 MiB, 7707 of the 7771 MiB of activations. No dropout mask is stored (each is a function
// of seed and position), no LayerNorm input (backward reads the outputs), and the GELU output is
// recomputed from `pre`. Everything left costs a GEMM (or attention) to recompute, and it only
// saves memory if the recomputed tensor goes where nothing else is live: in backward, the saved
// tensors of the layers above l are dead by the time layer l runs. So the first K layers keep no
// `pre`: forward writes it (the GEMM's auxiliary output, read by nobody in forward) into layer
// K's GELU-input slot, not yet written then, and backward re-runs the same FFN-in GEMM with its
// bias and GELU epilogue, writing `pre` into the slot again (dead by then: layer K's backward has
// ended) and the GELU output where selective recomputes it anyway. The same call on the same
// inputs gives the same bits, so these layers see forward's exact `pre` and GELU output. Each
// saves R x I elements (128 MiB above) for one GEMM of 2 R H I = 137 GFLOP (about 0.19 ms at the
// H100's 720 TFLOP/s), less the element-wise GELU it replaces (256 MiB of traffic, about 0.1 ms):
// about 0.1-0.2% of an 85 ms step per layer. K is ceil(L / 12) (2 of bert-large's 24, 1 of
// bert-base's 12), below L so that the slot's owner exists. The slot is a region for the
// gradients in freed activations too: read up to layer 0's stage, so no layer's gradients are
// placed over it (the embeddings', zeroed after layer 0's backward, may be).
int64_t recomputed_pre_layers(const BertConfig& cfg, CheckpointPolicy policy, bool training) {
  if (!training || policy != CheckpointPolicy::Selective) return 0;
  const int64_t L = cfg.num_hidden_layers;
  return std::min(L - 1, (L + 11) / 12);
}

}  // namespace

// A byte range of the activation arena and the last stage of backward that reads it. A slot
// (Note [recomputed FFN input]) overlays another region: it counts as live in backward from
// stage `first_stage` to `last_stage`; in forward its bytes are those of the region it lies in.
struct ActRegion {
  size_t begin, end;
  int last_stage;
  int first_stage = -1;  // >= 0: a slot
};

// Note [last layer on the first tokens]
// A head on the first token (sequence classification, regression, multi-label: every one of
// this class's sequence heads reads token 0, Note [encoder variants]) reads one row of each
// sequence from the last layer's output, and everything in a layer past attention works row by
// row (the output projection, dropout, the residual LayerNorms, the feed-forward). So in
// training the last layer projects q|k|v on every token (K and V come from every row), runs
// attention for each sequence's first query alone (its scope, Note [attention scope] in
// ops/op_args.h: on the GPU the query tile holding it) and then gathers the first tokens' context
// and input rows: the output projection, LayerNorm 1, the feed-forward and LayerNorm 2 run on B rows
// instead of B x T, writing the head's input (cls) directly. Backward starts from the head's
// gradient of cls on those B rows and scatters the first tokens' dctx and ds1 into zeroed B x T
// buffers for attention's backward and the q|k|v projection's. The other rows' gradients are
// exactly zero in the full computation (the head reads nothing else), so the loss and every
// gradient are the full computation's up to the order of the GEMMs' sums; the last layer's
// hidden-state dropout masks are drawn by compact row, so with dropout they differ from the full
// run's (same distribution). bert-large at seq 512 does 2.88% fewer FLOPs a step (9 of a
// layer's 12 H x H-sized GEMM units, in one layer of 24) and keeps 320 MiB less of the last
// layer's activations in bf16 at batch 32 (h1, the GELU input and output, the layer output);
// measured, 2% more samples/s on the H200 (bench/results/2026-11-28-h200/session29/). Attention
// of the first query alone then took that layer's attention from 0.155 + 0.398 to 0.057 + 0.174 ms
// and the step 0.6% more samples/s (bench/results/2026-11-29-h200/session30/). The packed
// evaluation (forward_eval of a packed batch, which keeps no hidden state) does the same; the
// padded one keeps the [B, T, H] hidden state and runs every token. Not for per-token heads.
// ModernBERT: Note [modernbert first tokens] in modernbert.cpp. ModelShape::last_layer_first_tokens
// false: every token (ANATOMY_LAST_LAYER=all for the trainer, to compare).
static bool last_layer_on_first_tokens(const BertConfig& cfg, const ModelShape& s) {
  return s.last_layer_first_tokens && !has_token_labels(cfg);
}

// The one place that lays out activations and temporaries; run dry it is the plan. `regions`
// (training only) receives the arena's byte ranges with their last readers.
static void carve_acts(BertForSequenceClassification::Acts& a, Arena& act, Arena& tmp, const BertConfig& cfg,
                       const ModelShape& s, int64_t B, int64_t T, bool training,
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
// Each range is made whole at its stage (the forward wrote activations there): a layer's range
// holds its four matrices only, each written once by its weight-gradient GEMM, so those GEMMs
// store (beta 0) instead of adding into a zeroed range (Note [layer gradients stored]); the
// embeddings and the tail (scatter-adds, and every vector summed by several passes) are zeroed
// just before their stages. The gradients are then valid until the next forward: enough for
// clipping, the optimizer step and logging. With accumulation the gradients must survive the
// next micro-batch's forward, so they get their own buffer (GradientPlacement::Own). For
// bert-large at seq 512 this puts all but about one layer's worth of gradients (1.2 of 1.25 GiB)
// into memory that activations already hold at the peak.
using freed::GradRange;

static std::vector<GradRange> gradient_ranges(const BertConfig& cfg, const ParamLayout& lay) {
  const int64_t L = cfg.num_hidden_layers;
  std::vector<GradRange> out;
  auto first = [&](int64_t l) {
    const ParamNames n = param_names(cfg);  // the head's first matrix (token classification has one)
    return lay.get(l < L ? layer_names(cfg, static_cast<int>(l)).q_w : n.head_dense_w.empty() ? n.head_out_w : n.head_dense_w)
        .offset;
  };
  out.push_back({0, first(0), stage_of_embeddings(L)});
  for (int64_t l = 0; l < L; ++l) out.push_back({first(l), first(l + 1), stage_of_layer(l, L)});
  out.push_back({first(L), lay.total(), kStageHead});
  return out;
}

size_t fp8_meta_bytes(const BertConfig& cfg, const ModelShape& s) {
  if (!s.fp8 || !s.training) return 0;
  return static_cast<size_t>(cfg.num_hidden_layers) * kFp8Sites * kFp8Roles * kFp8MetaWidth * sizeof(float);
}

// The largest operand pair of a layer's fp8 GEMMs (the forward and the data gradient of each
// Linear [in -> out] over all of the batch's rows; weight gradients run in bf16, Note [fp8
// training]): what the backend's scratch grows to.
size_t fp8_layer_scratch_bytes(const BertConfig& cfg, const ModelShape& s) {
  if (!s.fp8 || !s.training) return 0;
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, rows = s.max_batch * s.max_seq;
  size_t most = 0;
  for (auto [in, out] : {std::pair{H, 3 * H}, std::pair{H, H}, std::pair{H, I}, std::pair{I, H}})
    most = std::max({most, fp8_scratch_bytes(rows, out, in), fp8_scratch_bytes(rows, in, out)});
  return most;
}

ArenaBytes model_arena_bytes(const BertConfig& cfg, const ModelShape& s) {
  if (cfg.is_modernbert()) return modernbert_arena_bytes(cfg, s);
  Arena act = Arena::dry(), tmp = Arena::dry();
  BertForSequenceClassification::Acts a;
  std::vector<ActRegion> regions;
  carve_acts(a, act, tmp, cfg, s, s.max_batch, s.max_seq, s.training, &regions);
  // forward_eval may run on any model (the trainer evaluates its training model), padded or
  // packed: the arenas hold whichever layout is the largest.
  Arena pact = Arena::dry(), ptmp = Arena::dry();
  BertForSequenceClassification::Acts p;
  carve_packed(p, pact, ptmp, cfg, s.compute, s.max_batch, s.max_seq);
  size_t acts = std::max(act.used(), pact.used()), temps = std::max(tmp.used(), ptmp.used());
  if (s.training) {
    Arena eact = Arena::dry(), etmp = Arena::dry();
    BertForSequenceClassification::Acts e;
    carve_acts(e, eact, etmp, cfg, s, s.max_batch, s.max_seq, false);
    acts = std::max(acts, eact.used());
    temps = std::max(temps, etmp.used());
  }
  ArenaBytes out{acts, temps, 0, 0};
  if (s.training && s.gradients == GradientPlacement::InActivations) {
    const ParamLayout lay = ParamLayout::for_sequence_classification(cfg);
    const size_t q = freed::gradient_offset(regions, gradient_ranges(cfg, lay));
    if (q < acts) {  // otherwise nothing would be shared: the gradients keep a buffer of their own
      out.gradient_offset = q;
      out.block = std::max(acts, q + 4 * lay.total());
    }
  }
  return out;
}

// The masked-LM head's tensors (Note [masked LM head] in model/heads.h): the logits and losses
// outlive backward; dlogits and the transformed hidden state h are read by the decoder's
// gradient after the embeddings' backward; the GELU input and LayerNorm statistics by the head's.
template <class Open, class Close>
static void carve_masked_lm_head(BertForSequenceClassification::Acts& a, Arena& act, DType dt, int64_t B, int64_t R,
                                 int64_t H, int64_t V, bool training, Open open, Close close, int embeddings_stage) {
  open();
  a.logits = act.take(dt, {R, V});
  a.losses = act.take(DType::F32, {B});
  close(kAfterBackward);
  open();
  if (training) a.dlogits = act.take(dt, {R, V});
  a.lm_h = act.take(dt, {R, H});
  close(embeddings_stage);
  open();
  a.lm_pre = act.take(dt, {R, H});
  a.lm_rstd = act.take(DType::F32, {R});
  close(kStageHead);
}

static void carve_acts(BertForSequenceClassification::Acts& a, Arena& act, Arena& tmp, const BertConfig& cfg,
                       const ModelShape& s, int64_t B, int64_t T, bool training,
                       std::vector<ActRegion>* regions) {
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, L = cfg.num_hidden_layers;
  const int64_t nh = cfg.num_attention_heads, C = cfg.num_labels, R = B * T;
  const DType dt = s.compute;
  const CheckpointPolicy policy = s.checkpointing;
  a.B = B;
  a.T = T;
  a.training = training;
  a.packed_train = training && s.packed_tokens;
  // Note [last layer on the first tokens]: its rows past attention, its output (the head's input
  // cls) and the first tokens' context are B rows, carved with the layer (read by its backward).
  a.first_tokens = training && last_layer_on_first_tokens(cfg, s);
  size_t mark = 0;
  auto open = [&] { mark = act.used(); };
  auto close = [&](int last_stage) {
    if (regions) regions->push_back({mark, act.used(), last_stage});
  };
  // The head: what outlives backward, then what the head's backward reads.
  if (is_masked_lm(cfg)) {
    carve_masked_lm_head(a, act, dt, B, R, H, cfg.vocab_size, training, open, close, stage_of_embeddings(L));
  } else if (is_token_classification(cfg)) {  // Note [token classification head]
    open();
    a.logits = act.take(dt, {R, C});
    a.losses = act.take(DType::F32, {B});
    close(kAfterBackward);
    open();
    if (training) a.dlogits = act.take(dt, {R, C});
    if (training && token_head_dropout(cfg) > 0) a.tok_xd = act.take(dt, {R, H});
    close(kStageHead);
  } else {
  open();
  a.logits = act.take(dt, {B, C});
  a.dlogits = act.take(dt, {B, C});
  a.losses = act.take(DType::F32, {B});
  close(kAfterBackward);
  open();
  if (!a.first_tokens) a.cls = act.take(dt, {B, H});
  const double head_p = cfg.classifier_dropout.value_or(cfg.hidden_dropout_prob);
  const bool head_drop = training && head_p > 0;
  if (head_drop && head_drops_input(cfg)) a.cls_d = act.take(dt, {B, H});
  if (cfg.architecture == Architecture::Electra) a.head_pre = act.take(dt, {B, H});
  a.pooled = act.take(dt, {B, H});
  a.pooled_d = head_drop ? act.take(dt, {B, H}) : a.pooled;
  close(kStageHead);
  }
  // The embeddings (their sum is scratch: the LayerNorm's backward reads its output).
  const int64_t E = cfg.embedding_width();
  open();
  a.emb_rstd = act.take(DType::F32, {R});
  a.emb_ln = act.take(dt, {R, E});
  const bool emb_dropout = training && cfg.hidden_dropout_prob > 0;
  a.xs.assign(training ? L + 1 : 2, Tensor());
  // Packed training gathers the token rows of the embeddings' output into a buffer of their own.
  const bool own = emb_dropout || a.packed_train;
  if (cfg.projects_embeddings()) {  // the projection reads the dropped-out embeddings in backward
    a.emb_d = own ? act.take(dt, {R, E}) : a.emb_ln;
    a.xs[0] = act.take(dt, {R, H});
  } else {
    a.xs[0] = own ? act.take(dt, {R, H}) : a.emb_ln;
  }
  close(stage_of_embeddings(L));
  // The layers, each with its output: the input of the next, read by both layers' backward.
  const bool keep_g = !(training && policy != CheckpointPolicy::None);
  // Layer l's output; the last one's is the head's input when only the first tokens go on.
  auto take_output = [&](int64_t l) {
    if (a.first_tokens && l == L - 1) {
      a.cls_ctx = act.take(dt, {B, H});
      a.cls = act.take(dt, {B, H});
      a.xs[L] = a.cls;
    } else {
      a.xs[l + 1] = act.take(dt, {R, H});
    }
  };
  if (!training) {  // one layer's tensors; the hidden state ping-pongs between xs[0] and xs[1]
    a.layers.assign(1, {});
    carve_layer(act, dt, R, R, B, T, H, I, nh, keep_g, a.layers[0]);
    a.xs[1] = act.take(dt, {R, H});
  } else if (policy != CheckpointPolicy::Layer) {
    a.layers.assign(L, {});
    const int64_t K = recomputed_pre_layers(cfg, policy, training);  // Note [recomputed FFN input]
    size_t slot = 0;
    for (int64_t l = 0; l < L; ++l) {
      open();
      const int64_t N = a.first_tokens && l == L - 1 ? B : R;
      carve_layer(act, dt, R, N, B, T, H, I, nh, keep_g, a.layers[l], l >= K, l == K ? &slot : nullptr);
      take_output(l);
      close(stage_of_layer(l, L));
    }
    for (int64_t l = 0; l < K; ++l) a.layers[l].pre = a.layers[K].pre;
    if (K > 0 && regions)
      regions->push_back({slot, slot + a.layers[K].pre.bytes(), stage_of_layer(0, L), stage_of_layer(K - 1, L)});
  } else {  // layer checkpointing: one layer's tensors, rebuilt by each layer's recompute
    a.layers.assign(1, {});
    open();
    carve_layer(act, dt, R, R, B, T, H, I, nh, keep_g, a.layers[0]);
    close(stage_of_layer(0, L));
    for (int64_t l = 0; l < L; ++l) {
      open();
      take_output(l);
      close(stage_of_layer(l, L));
    }
  }
  if (!is_masked_lm(cfg) && !is_token_classification(cfg) && !a.cls_d.defined()) a.cls_d = a.cls;

  a.t1 = tmp.take(dt, {R, H});
  a.mean = tmp.take(DType::F32, {R});
  a.emb_sum = Tensor(a.t1.data, dt, {R, E}, a.t1.device);  // dead before the first layer uses t1 for its branch
  if (!cfg.has_token_types()) {
    a.zero_type = tmp.take(DType::F32, {1, E});
    if (training) a.type_sink = tmp.take(DType::F32, {1, E});
  }
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
  const int64_t E = cfg.embedding_width();
  a.emb_sum = act.take(dt, {R, H});
  a.emb_rstd = act.take(DType::F32, {R});
  a.xs = {act.take(dt, {R, H}), act.take(dt, {R, H})};  // the packed hidden state ping-pongs between them
  a.emb_ln = Tensor(a.xs[0].data, dt, {R, E}, a.xs[0].device);  // until the gather (E <= H)
  a.ctx_pad = a.emb_sum;                    // the embeddings' sum is dead after their LayerNorm
  a.emb_sum = Tensor(a.emb_sum.data, dt, {R, E}, a.emb_sum.device);
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
  a.t1 = tmp.take(dt, {R, H});  // also the gathered embedding rows that ELECTRA projects
  a.mean = tmp.take(DType::F32, {R});
  if (!cfg.has_token_types()) a.zero_type = tmp.take(DType::F32, {1, E});
  // A per-token head reads the padded layout (padded_head_input, in qkv_pad: Note [packed training]).
  if (is_masked_lm(cfg)) {
    auto none = [] {};
    auto none_stage = [](int) {};
    carve_masked_lm_head(a, act, dt, B, R, H, cfg.vocab_size, false, none, none_stage, 0);
    return;
  }
  if (is_token_classification(cfg)) {
    a.logits = act.take(dt, {R, C});
    a.losses = act.take(DType::F32, {B});
    return;
  }
  a.cls = act.take(dt, {B, H});
  a.cls_d = a.cls;
  if (cfg.architecture == Architecture::Electra) a.head_pre = act.take(dt, {B, H});
  a.pooled = act.take(dt, {B, H});
  a.pooled_d = a.pooled;
  a.logits = act.take(dt, {B, C});
  a.dlogits = act.take(dt, {B, C});
  a.losses = act.take(DType::F32, {B});
}

int64_t AttendedPairs::of(int queries) const {
  ANATOMY_CHECK(queries == 0 || queries == 1, "internal error: attended pairs of ", queries, " queries");
  return queries == 0 ? every : first;
}

PackedRows pack_token_rows(const int32_t* mask, int64_t B, int64_t T, int64_t multiple) {
  PackedRows p;
  p.first_rows.resize(static_cast<size_t>(B));
  std::vector<bool> taken(static_cast<size_t>(B * T), false);
  bool prefixes = true;  // every sequence right-padded with a valid first token
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* m = mask + b * T;
    const bool any = std::any_of(m, m + T, [](int32_t v) { return v != 0; });
    p.first_rows[b] = static_cast<int32_t>(p.token_rows.size());
    int64_t len = 0;
    for (int64_t t = 0; t < T; ++t)
      if (t == 0 || !any || m[t] != 0) {
        p.token_rows.push_back(static_cast<int32_t>(b * T + t));
        taken[b * T + t] = true;
        prefixes = prefixes && m[t] != 0 && t == len++;
      }
    p.attended_pairs.every += len * len;
    p.attended_pairs.first += len;
  }
  if (prefixes)
    p.sequence_rows = static_cast<int32_t>(p.token_rows.size());
  else
    p.attended_pairs = {};
  if (multiple > 1) {
    const int64_t n = static_cast<int64_t>(p.token_rows.size());
    const int64_t want = std::min(B * T, (n + multiple - 1) / multiple * multiple);
    for (int64_t r = 0; static_cast<int64_t>(p.token_rows.size()) < want; ++r)
      if (!taken[r]) p.token_rows.push_back(static_cast<int32_t>(r));
  }
  return p;
}

std::vector<LivenessPoint> activation_liveness(const BertConfig& cfg, const ModelShape& s) {
  if (cfg.is_modernbert()) return modernbert_liveness(cfg, s);
  const int64_t L = cfg.num_hidden_layers;
  // The training layout's regions with their last readers (Note [gradients in freed activations]):
  // forward writes a region at the stage it belongs to, backward is done with it after its last stage.
  Arena act = Arena::dry(), tmp = Arena::dry();
  BertForSequenceClassification::Acts a;
  std::vector<ActRegion> regions;
  carve_acts(a, act, tmp, cfg, s, s.max_batch, s.max_seq, true, &regions);
  // In backward at stage `st`, a slot adds its bytes while it is in use (it overlays dead regions).
  auto bytes_where = [&](auto keep, int st = -1) {
    int64_t n = 0;
    for (const ActRegion& r : regions)
      if (r.first_stage >= 0 ? st >= r.first_stage && st <= r.last_stage : keep(r.last_stage))
        n += static_cast<int64_t>(r.end - r.begin);
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
    out.push_back({str_cat("layer ", l, " backward"), bytes_where([&](int last) { return last >= st; }, st),
                   grad_bytes_by(st)});
  }
  out.push_back({"embeddings backward", bytes_where([&](int last) { return last >= emb; }), grad_bytes_by(emb)});
  out.push_back({"optimizer step", bytes_where([](int last) { return last == kAfterBackward; }), grad_bytes_by(emb)});
  return out;
}

BertForSequenceClassification::BertForSequenceClassification(Backend& be, const BertConfig& cfg,
                                                             const ModelShape& shape)
    : m_be(be), m_cfg(cfg), m_layout(ParamLayout::for_sequence_classification(cfg)), m_names(param_names(cfg)),
      m_shape(shape) {
  ANATOMY_CHECK(!cfg.is_modernbert(), "model_type modernbert: ModernBERT has its own model class "
                "(model/modernbert.h; make_model picks it)");
  for (int l = 0; l < cfg.num_hidden_layers; ++l) m_layer_names.push_back(layer_names(cfg, l));
  ANATOMY_CHECK(shape.max_batch > 0, "--per-device-train-batch-size must be at least 1");
  ANATOMY_CHECK(shape.max_seq > 0 && shape.max_seq <= cfg.max_sequence_length(), "--max-seq-length ", shape.max_seq,
                " must be between 1 and ", cfg.max_sequence_length(), " (the positions of max_position_embeddings ",
                cfg.max_position_embeddings, cfg.position_offset() ? " after pad_token_id + 1" : "", ")");
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
  const ArenaBytes bytes = model_arena_bytes(cfg, shape);  // Note [gradients in freed activations]
  freed::place_activations(al, bytes, n, shape.training, m_act_block, m_grads, m_act_arena, m_grads_view);
  if (shape.training)
    for (const GradRange& g : gradient_ranges(cfg, m_layout)) m_grad_ranges.emplace_back(g.begin, g.end);
  m_tmp_arena = Arena(al, bytes.temporary, Category::Temporary);
  m_acts = std::make_unique<Acts>();
  if (const size_t fp8_bytes = fp8_meta_bytes(cfg, shape)) {  // Note [fp8 training]: scale 1 to start
    ANATOMY_CHECK(shape.compute == DType::BF16 || be.device() == Device::CPU,
                  "--precision fp8 computes in BF16 around its fp8 GEMMs; this shape asks for ", dtype_name(shape.compute));
    const int64_t rows = static_cast<int64_t>(fp8_bytes / sizeof(float)) / kFp8MetaWidth;
    m_fp8 = Buffer(al, DType::F32, {rows, kFp8MetaWidth}, Category::OptimizerState);
    std::vector<float> init(static_cast<size_t>(rows) * kFp8MetaWidth);
    for (int64_t r = 0; r < rows; ++r)
      fp8_meta_init(init.data() + r * kFp8MetaWidth, 1.0f, fp8_format(static_cast<Fp8Role>(r % kFp8Roles), shape.fp8_grads));
    m_be.upload(m_fp8.tensor(), init.data());
  }
}

MatmulArgs BertForSequenceClassification::fp8(MatmulArgs args, int l, Fp8Site site, Fp8Role ra, Fp8Role rb,
                                              bool training) const {
  if (!m_fp8.data() || !training) return args;
  const int64_t first = (static_cast<int64_t>(l) * kFp8Sites + site) * kFp8Roles;
  auto operand = [&](Fp8Role r) {
    return Fp8Operand{m_fp8.tensor().slice(first + r, first + r + 1).view({kFp8MetaWidth}), fp8_format(r, m_shape.fp8_grads)};
  };
  args.fp8_a = operand(ra);
  args.fp8_b = operand(rb);
  return args;
}

void BertForSequenceClassification::fp8_scale_update() {
  if (m_fp8.data()) m_be.fp8_scale_update(m_fp8.tensor());
}

BertForSequenceClassification::~BertForSequenceClassification() = default;

void BertForSequenceClassification::carve(int64_t B, int64_t T, bool training, bool packed) {
  ANATOMY_CHECK(B >= 1 && B <= m_shape.max_batch, "batch of ", B, " samples exceeds the planned micro-batch of ",
                m_shape.max_batch);
  ANATOMY_CHECK(T >= 1 && T <= m_shape.max_seq, "sequence length ", T, " exceeds the planned --max-seq-length ",
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
    carve_acts(*m_acts, m_act_arena, m_tmp_arena, m_cfg, m_shape, B, T, training);
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
    const bool is_ln = is_layernorm_weight(p.name);
    if (is_ln) {
      std::fill(w, w + p.numel(), 1.0f);
    } else if (p.decay) {  // every matrix: Linear and Embedding weights
      for (size_t i = 0; i < p.numel(); ++i) w[i] = static_cast<float>(rng.normal() * std);
    }
  }
  // nn.Embedding(padding_idx=pad_token_id) keeps that row at zero: the word table's, and
  // RoBERTa's position table's too.
  const int64_t E = m_cfg.embedding_width();
  const auto& word = m_layout.get(m_names.word);
  if (m_cfg.pad_token_id >= 0 && m_cfg.pad_token_id < m_cfg.vocab_size)
    std::fill_n(flat.data() + word.offset + m_cfg.pad_token_id * E, E, 0.0f);
  if (m_cfg.is_roberta())
    std::fill_n(flat.data() + m_layout.get(m_names.position).offset + m_cfg.pad_token_id * E, E, 0.0f);
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
    if (!is_layernorm_weight(p.name)) continue;
    std::vector<float> v(p.numel());
    m_be.download(v.data(), m_layout.view(m_master.tensor(), p));
    if (std::any_of(v.begin(), v.end(), [&](float x) { return std::fabs(x) < limit; })) out.push_back(p.name);
  }
  return out;
}

// Note [layer gradients stored]
// A layer's weight gradients are each written by one GEMM per micro-batch. With one micro-batch
// (the gradients in freed activations) the GEMM stores them (beta 0), so the layer's range needs
// no zeroing first: 50 MB of fills a layer in bert-large (0.40 ms of a 70 ms bf16 step on the
// H200) and the GEMMs' reads of C are gone. 0 + x is x, so the gradients are the same bits as
// with a zeroed range (and as the own-buffer placement, which accumulates into zeros).
// Accumulating micro-batches keep beta 1.
MatmulArgs BertForSequenceClassification::weight_gradient_args() const {
  return {1, gradients_in_activations() ? 0.0f : 1.0f, Epilogue::None, {}, {}};
}

void BertForSequenceClassification::zero_grad_range(size_t begin, size_t end) {
  if (end > begin) m_be.fill(ParamLayout::range(m_grads_view, begin, {static_cast<int64_t>(end - begin)}), 0.0f);
}

// Dropout sites per micro-batch: 0 embeddings, 1 + 3l + {0: attention probs, 1: attention
// output, 2: feed-forward output}, 1 + 3L the head's dropout before its output layer, 2 + 3L
// the one on its input (RoBERTa, ELECTRA). Backward and recompute use the same sites.
static float head_dropout(const BertConfig& c) {
  return static_cast<float>(c.classifier_dropout.value_or(c.hidden_dropout_prob));
}
static int site_attn(int l) { return 1 + 3 * l; }
static int site_attn_out(int l) { return 2 + 3 * l; }
static int site_ffn_out(int l) { return 3 + 3 * l; }
// The attention output's dropout probability (none in DistilBERT, Note [encoder variants]).
static float attn_out_dropout(const BertConfig& c) {
  return c.architecture == Architecture::DistilBert ? 0.0f : static_cast<float>(c.hidden_dropout_prob);
}

void BertForSequenceClassification::layer_forward(int l, const Tensor& x, const Tensor& out, LayerActs& a,
                                                  const DeviceBatch& b, bool training, uint64_t base,
                                                  const Tensor& branch) {
  rows_forward(l, attention_forward_rows(l, x, a, b, training, base), x, out, a, training, base, branch);
}

// q|k|v and attention of layer l on its input rows x; returns the context rows (x's rows).
Tensor BertForSequenceClassification::attention_forward_rows(int l, const Tensor& x, LayerActs& a, const DeviceBatch& b,
                                                             bool training, uint64_t base, int queries) {
  const LayerNames& p = m_layer_names[static_cast<size_t>(l)];
  const int64_t H = m_cfg.hidden_size, nh = m_cfg.num_attention_heads;
  const float ap = static_cast<float>(m_cfg.attention_probs_dropout_prob);
  const AttentionScope scope{0, queries};
  const ParamInfo& wq = m_layout.get(p.q_w);
  const ParamInfo& bq = m_layout.get(p.q_b);
  Tensor wqkv = ParamLayout::range(m_compute_view, wq.offset, {3 * H, H});
  Tensor bqkv = ParamLayout::range(m_compute_view, bq.offset, {3 * H});

  // Packed training (Note [packed training]): q|k|v of the token rows go to scratch, then into
  // the saved padded layout, and the context rows come back through t2 (free in forward). With
  // packed attention the saved q|k|v and context are the layer buffers' first N rows instead.
  const bool pk = m_acts->packed_train, pa = m_acts->packed_attention;
  const int64_t n = x.dim(0);
  auto leading = [&](const Tensor& t, int64_t w) {
    return t.view({static_cast<int64_t>(t.numel()) / w, w}).slice(0, n);
  };
  const Tensor qkv_rows = pa ? leading(a.qkv, 3 * H) : pk ? m_acts->pk.slice(0, n) : a.qkv;
  Tensor ctx_rows = pa && !m_acts->packed ? leading(a.ctx, H) : a.ctx;
  m_be.matmul(qkv_rows, x, Trans::N, wqkv, Trans::T,
              fp8({1, 0, Epilogue::Bias, bqkv, {}}, l, kFp8Qkv, kFp8Input, kFp8Weight, training));
  if (pa) {  // the packed inference layout's context overlays its q|k|v: it goes to ctx_pad's rows
    if (m_acts->packed) ctx_rows = m_acts->ctx_pad.slice(0, n);
    m_be.attention_packed_forward(ctx_rows, a.lse, qkv_rows, b.seq_offsets, static_cast<int>(nh),
                                  drop(ap, base, site_attn(l), training), b.attended_pairs.of(queries), scope);
  } else if (m_acts->packed) {  // Note [packed inference]: attention on the padded layout
    const Tensor& qkv_pad = m_acts->qkv_pad;
    m_be.scatter_rows(qkv_pad, a.qkv, b.token_rows);
    m_be.attention_forward(m_acts->ctx_pad.view({m_acts->B, m_acts->T, H}), a.lse,
                           qkv_pad.view({m_acts->B, m_acts->T, 3 * H}), b.attention_mask, static_cast<int>(nh), {},
                           scope);
    m_be.gather_rows(a.ctx, m_acts->ctx_pad, b.token_rows);
  } else {
    if (pk) {
      m_be.fill(a.qkv, 0.0f);  // padding rows: masked keys, any finite value; zero is never NaN
      m_be.scatter_rows(a.qkv, qkv_rows, b.token_rows);
    }
    m_be.attention_forward(a.ctx.view({m_acts->B, m_acts->T, H}), a.lse, a.qkv.view({m_acts->B, m_acts->T, 3 * H}),
                           b.attention_mask, static_cast<int>(nh), drop(ap, base, site_attn(l), training), scope);
    if (pk) {
      ctx_rows = m_acts->t2.slice(0, x.dim(0));
      m_be.gather_rows(ctx_rows, a.ctx, b.token_rows);
    }
  }
  return ctx_rows;
}

// The output projection, LayerNorm 1, the feed-forward and LayerNorm 2 on matching rows of the
// context, the layer input x and the output (a's row tensors have as many rows).
void BertForSequenceClassification::rows_forward(int l, const Tensor& ctx_rows, const Tensor& x, const Tensor& out,
                                                 LayerActs& a, bool training, uint64_t base, const Tensor& branch) {
  const LayerNames& p = m_layer_names[static_cast<size_t>(l)];
  const float eps = static_cast<float>(m_cfg.layer_norm_eps);
  const float hp = static_cast<float>(m_cfg.hidden_dropout_prob);
  m_be.matmul(branch, ctx_rows, Trans::N, W(p.ao_w), Trans::T,
              fp8({1, 0, Epilogue::Bias, W(p.ao_b), {}}, l, kFp8AttnOut, kFp8Input, kFp8Weight, training));
  const Tensor mean = m_acts->mean.slice(0, a.h1.dim(0));  // scratch: backward reads the outputs
  m_be.layernorm_forward(a.h1, Tensor(), mean, a.rstd1, branch, x, M(p.ln1_w),
                         M(p.ln1_b), eps, drop(attn_out_dropout(m_cfg), base, site_attn_out(l), training));
  m_be.matmul(a.g, a.h1, Trans::N, W(p.ff1_w), Trans::T,
              fp8({1, 0, Epilogue::BiasGelu, W(p.ff1_b), a.pre}, l, kFp8FfnIn, kFp8Input, kFp8Weight, training));
  m_be.matmul(branch, a.g, Trans::N, W(p.ff2_w), Trans::T,
              fp8({1, 0, Epilogue::Bias, W(p.ff2_b), {}}, l, kFp8FfnOut, kFp8Input, kFp8Weight, training));
  m_be.layernorm_forward(out, Tensor(), mean, a.rstd2, branch, a.h1, M(p.ln2_w),
                         M(p.ln2_b), eps, drop(hp, base, site_ffn_out(l), training));
}

// dout arrives in t1; returns the tensor holding dx (one of t1, t2, t3).
Tensor BertForSequenceClassification::layer_backward(int l, const Tensor& dout, LayerActs& a, const Tensor& x,
                                                     const Tensor& out, const DeviceBatch& b, uint64_t base, const Tensor& X1,
                                                     const Tensor& X2, const Tensor& X3) {
  // Packed training: the row-wise tensors have n = N token rows (x, out and a's row tensors come
  // sliced); attention reads its saved padded qkv and ctx (Note [packed training]).
  const int64_t n = x.dim(0);
  auto rows = [&](const Tensor& t) { return m_acts->packed_train ? t.slice(0, n) : t; };
  const Tensor x1 = rows(X1), x2 = rows(X2);
  rows_backward(l, rows(dout), a, rows(out), base, x1, x2, rows(X3));
  return attention_backward_rows(l, a, x, b, base, x1, X1, x2, X3);
}

// The backward of rows_forward on its rows: from dy, the layer output's gradient (which may share
// x1's memory), to dao (x1: the output projection's output gradient), dctx (x2) and ds1 (x3: the
// residual's share of the layer input's gradient); every weight and bias gradient but the output
// projection's weight gradient, which needs the context rows.
void BertForSequenceClassification::rows_backward(int l, const Tensor& dy, LayerActs& a, const Tensor& out,
                                                  uint64_t base, const Tensor& x1, const Tensor& x2, const Tensor& x3) {
  const LayerNames& p = m_layer_names[static_cast<size_t>(l)];
  const int64_t I = m_cfg.intermediate_size, n = out.dim(0);
  const float hp = static_cast<float>(m_cfg.hidden_dropout_prob);
  const MatmulArgs acc{1, 1, Epilogue::None, {}, {}};  // C += A B (residual sums)
  const MatmulArgs put{1, 0, Epilogue::None, {}, {}};
  const MatmulArgs wgrad = weight_gradient_args();
  // The four bias gradients of a layer's dense outputs come with the ops that write their dY:
  // the LayerNorm backwards (ff2, ao: the column sums of dbranch), the GELU backward (ff1) and
  // the attention backward (q|k|v, attention_backward_rows).
  const Tensor dI = m_acts->big.view({static_cast<int64_t>(m_acts->big.numel())}).slice(0, n * I).view({n, I});
  if (l < recomputed_pre_layers(m_cfg, m_shape.checkpointing, true))  // Note [recomputed FFN input]
    m_be.matmul(a.g, a.h1, Trans::N, W(p.ff1_w), Trans::T,
                fp8({1, 0, Epilogue::BiasGelu, W(p.ff1_b), a.pre}, l, kFp8FfnIn, kFp8Input, kFp8Weight));
  else if (m_shape.checkpointing != CheckpointPolicy::None)
    m_be.gelu_forward(a.g, a.pre);
  // LayerNorm 2: ds2 (x2) reaches h1 through the residual; df2 (x3) reaches the FFN output.
  m_be.layernorm_backward(x2, x3, G(p.ln2_w), G(p.ln2_b), dy, out,
                          a.rstd2, M(p.ln2_w), M(p.ln2_b),
                          drop(hp, base, site_ffn_out(l), true), G(p.ff2_b));
  // FFN out: y = g W2^T + b2, W2 (H, I). dW2 first: under selective checkpointing g shares
  // its memory with dI.
  m_be.matmul(G(p.ff2_w), x3, Trans::T, a.g, Trans::N, wgrad);
  m_be.matmul(dI, x3, Trans::N, W(p.ff2_w), Trans::N, fp8(put, l, kFp8FfnOut, kFp8Grad, kFp8Weight));
  m_be.gelu_backward(dI, dI, a.pre, G(p.ff1_b));
  // FFN in: pre = h1 W1^T + b1, W1 (I, H); dh1 = dpre W1 + ds2.
  m_be.matmul(x2, dI, Trans::N, W(p.ff1_w), Trans::N, fp8(acc, l, kFp8FfnIn, kFp8Grad, kFp8Weight));
  m_be.matmul(G(p.ff1_w), dI, Trans::T, a.h1, Trans::N, wgrad);
  // LayerNorm 1: ds1 (x3) reaches x; dao (x1) reaches the attention output projection.
  m_be.layernorm_backward(x3, x1, G(p.ln1_w), G(p.ln1_b),
                          x2, a.h1, a.rstd1, M(p.ln1_w),
                          M(p.ln1_b),
                          drop(attn_out_dropout(m_cfg), base, site_attn_out(l), true), G(p.ao_b));
  m_be.matmul(x2, x1, Trans::N, W(p.ao_w), Trans::N, fp8(put, l, kFp8AttnOut, kFp8Grad, kFp8Weight));  // dctx
}

// The output projection's weight gradient (from dao, when defined, and the saved context rows),
// attention's backward from dctx (rows of x) and the q|k|v projection's, which adds dx into X3's
// first rows (holding ds1); returns X3. X1 is a whole temporary free for the padded dctx.
Tensor BertForSequenceClassification::attention_backward_rows(int l, LayerActs& a, const Tensor& x,
                                                              const DeviceBatch& b, uint64_t base, const Tensor& dao,
                                                              const Tensor& X1, const Tensor& dctx_rows,
                                                              const Tensor& X3, int queries) {
  const LayerNames& p = m_layer_names[static_cast<size_t>(l)];
  const int64_t H = m_cfg.hidden_size, nh = m_cfg.num_attention_heads;
  const int64_t R = m_acts->B * m_acts->T, n = x.dim(0);
  const float ap = static_cast<float>(m_cfg.attention_probs_dropout_prob);
  const AttentionScope scope{0, queries};
  const MatmulArgs wgrad = weight_gradient_args();
  const bool pk = m_acts->packed_train;
  const Tensor big = m_acts->big.view({static_cast<int64_t>(m_acts->big.numel())});
  const Tensor dqkv = big.slice(0, R * 3 * H).view({R, 3 * H});
  // The q|k|v bias gradient comes from the attention backward, which writes dqkv (Note
  // [fused bias gradient] in ops/op_args.h); qkv_backward's weight gradient is a plain GEMM.
  const Tensor dqkv_bias = ParamLayout::range(m_grads_view, m_layout.get(p.q_b).offset, {3 * H});
  if (m_acts->packed_attention) {  // Note [packed attention]: the saved q|k|v and context are packed rows
    const Tensor qkv_rows = a.qkv.view({R, 3 * H}).slice(0, n), ctx_rows = a.ctx.view({R, H}).slice(0, n);
    const Tensor dqkv_rows = dqkv.slice(0, n);
    if (dao.defined()) m_be.matmul(G(p.ao_w), dao, Trans::T, ctx_rows, Trans::N, wgrad);
    m_be.attention_packed_backward(dqkv_rows, dctx_rows, qkv_rows, ctx_rows, a.lse, b.seq_offsets,
                                   static_cast<int>(nh), drop(ap, base, site_attn(l), true), b.attended_pairs.of(queries),
                                   scope, dqkv_bias);
    return qkv_backward(l, dqkv_rows, x, X3);
  }
  Tensor ctx_rows = a.ctx, dctx = dctx_rows;
  if (pk && dao.defined()) {  // the context's token rows, in dI's dead memory
    ctx_rows = big.slice(0, n * H).view({n, H});
    m_be.gather_rows(ctx_rows, a.ctx, b.token_rows);
  }
  if (dao.defined()) m_be.matmul(G(p.ao_w), dao, Trans::T, ctx_rows, Trans::N, wgrad);
  if (pk) {  // dao is consumed: X1's whole buffer takes dctx in the padded layout, zero on padding
    m_be.fill(X1, 0.0f);
    m_be.scatter_rows(X1, dctx_rows, b.token_rows);
    dctx = X1;
  }
  m_be.attention_backward(dqkv.view({m_acts->B, m_acts->T, 3 * H}), dctx.view({m_acts->B, m_acts->T, H}),
                          a.qkv.view({m_acts->B, m_acts->T, 3 * H}), a.ctx.view({m_acts->B, m_acts->T, H}), a.lse,
                          b.attention_mask, static_cast<int>(nh), drop(ap, base, site_attn(l), true), scope, dqkv_bias);
  Tensor dqkv_rows = dqkv;
  if (pk) {
    dqkv_rows = m_acts->pk.slice(0, n);
    m_be.gather_rows(dqkv_rows, dqkv, b.token_rows);
  }
  return qkv_backward(l, dqkv_rows, x, X3);
}

// QKV: qkv = x Wqkv^T + bqkv; dx (+= into dx, which holds ds1) = dqkv Wqkv; returns dx.
Tensor BertForSequenceClassification::qkv_backward(int l, const Tensor& dqkv, const Tensor& x, const Tensor& dx) {
  const LayerNames& p = m_layer_names[static_cast<size_t>(l)];
  const int64_t H = m_cfg.hidden_size;
  const ParamInfo& wq = m_layout.get(p.q_w);
  Tensor wqkv = ParamLayout::range(m_compute_view, wq.offset, {3 * H, H});
  m_be.matmul(dx.slice(0, x.dim(0)), dqkv, Trans::N, wqkv, Trans::N,
              fp8({1, 1, Epilogue::None, {}, {}}, l, kFp8Qkv, kFp8Grad, kFp8Weight));
  m_be.matmul(ParamLayout::range(m_grads_view, wq.offset, {3 * H, H}), dqkv, Trans::T, x, Trans::N,
              weight_gradient_args());  // its bias gradient: the attention backward's
  return dx;
}

// A per-token head on a packed batch (Note [packed training]): the encoder's N output rows
// scattered into the padded [B*T, H] layout the head and its loss read, zero on padding rows. In
// training the buffer is the packed q|k|v scratch pk (free from the last layer's forward until
// the head's backward is done: the layers use it, the heads do not), in packed inference the
// padded q|k|v qkv_pad (the layers are done with it). With no batch, the tensor alone
// (backward); `out` is the encoder's output rows (default: training's last hidden state).
Tensor BertForSequenceClassification::padded_head_input(const DeviceBatch* b, Tensor out) {
  Acts& a = *m_acts;
  const int64_t R = a.B * a.T, H = m_cfg.hidden_size;
  const Tensor& buf = a.packed ? a.qkv_pad : a.pk;
  const Tensor x = buf.view({static_cast<int64_t>(buf.numel())}).slice(0, R * H).view({R, H});
  if (b) {
    const int64_t n = static_cast<int64_t>(b->token_rows.numel());
    if (!out.defined()) out = a.x_in(static_cast<int>(m_cfg.num_hidden_layers)).slice(0, n);
    m_be.fill(x, 0.0f);
    m_be.scatter_rows(x, out, b->token_rows);
  }
  return x;
}

bool packed_attention_applies(const Backend& be, DType compute, const BertConfig& cfg, const DeviceBatch& b) {
  return b.seq_offsets.defined() && b.packed() &&
         be.packed_attention_supported(compute, b.seq(), cfg.hidden_size / cfg.num_attention_heads);
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
// When every sequence of the batch is right-padded (DeviceBatch::seq_offsets) and the backend
// has the kernels, attention runs on the packed rows themselves (Note [packed attention] in
// ops/cpu/attention.cpp): the layer saves q|k|v and the context as the first N rows of its
// buffers, and none of the scatters, gathers and fills above happen, in forward or backward;
// packed inference does the same, its context in ctx_pad's rows. The dropout masks of attention
// are the padded run's, so the two attention layouts give the same step.
// The per-token heads (token classification, masked LM) read the padded layout: the encoder's N
// output rows are scattered into a zeroed [B*T, H] buffer (padded_head_input, in pk's memory),
// the head, its loss over the labelled tokens and its backward run padded as in the padded step,
// and the token rows of the head's input gradient are gathered back for the last layer. The
// encoder, where the FLOPs are, computes on real tokens; the head's padding rows carry no label
// and get no gradient.
static BertForSequenceClassification::LayerActs token_rows_of(const BertForSequenceClassification::LayerActs& la,
                                                            int64_t n) {
  BertForSequenceClassification::LayerActs v = la;
  for (Tensor* t : {&v.rstd1, &v.h1, &v.pre, &v.g, &v.rstd2})
    if (t->defined()) *t = t->slice(0, n);
  return v;
}

// Note [last layer on the first tokens]: attention on every row of x, what follows it on the
// first tokens, into a.cls; ctx0 and x0 [B, H] receive the first tokens' context and input rows
// (training: cls_ctx, which backward reads, and t3; the packed evaluation: dead memory).
void BertForSequenceClassification::last_layer_forward(const Tensor& x, LayerActs& la, const DeviceBatch& b,
                                                       bool training, uint64_t base, const Tensor& ctx0,
                                                       const Tensor& x0) {
  Acts& a = *m_acts;
  const int l = static_cast<int>(m_cfg.num_hidden_layers) - 1;
  const bool pk = b.packed();  // the packed training step, or the packed evaluation
  first_token_rows(m_be, ctx0, attention_forward_rows(l, x, la, b, training, base, 1), b, pk);
  first_token_rows(m_be, x0, x, b, pk);
  LayerActs v = token_rows_of(la, a.B);
  rows_forward(l, ctx0, x0, a.cls, v, training, base, a.t1.slice(0, a.B));
}

// From the head's gradient of cls (hd2): the first tokens' rows, then ds1 into t1 and dctx into
// t3 on every row (zero elsewhere) for attention's backward; returns t1, holding dx.
Tensor BertForSequenceClassification::last_layer_backward(LayerActs& la, const Tensor& x, const DeviceBatch& b,
                                                          uint64_t base, const Tensor& X1, const Tensor& X2,
                                                          const Tensor& X3) {
  Acts& a = *m_acts;
  const int l = static_cast<int>(m_cfg.num_hidden_layers) - 1;
  const bool pk = a.packed_train && b.packed();
  const int64_t B = a.B, n = x.dim(0);
  const Tensor x1 = X1.slice(0, B), x2 = X2.slice(0, B), x3 = X3.slice(0, B);
  LayerActs v = token_rows_of(la, B);
  rows_backward(l, a.hd2, v, a.cls, base, x1, x2, x3);  // dao, dctx, ds1 of the first tokens
  m_be.matmul(G(m_layer_names[static_cast<size_t>(l)].ao_w), x1, Trans::T, a.cls_ctx, Trans::N,
              weight_gradient_args());
  first_token_rows_backward(m_be, X1.slice(0, n), x3, b, pk);
  first_token_rows_backward(m_be, X3.slice(0, n), x2, b, pk);
  return attention_backward_rows(l, la, x, b, base, Tensor(), X2, X3.slice(0, n), X1, 1);
}

void BertForSequenceClassification::forward(const DeviceBatch& b, bool training, uint64_t base) {
  const int64_t B = b.batch(), T = b.seq(), L = m_cfg.num_hidden_layers, H = m_cfg.hidden_size;
  const bool pk = training && b.packed();
  ANATOMY_CHECK(!pk || m_shape.packed_tokens, "internal error: a packed training batch for a model shaped without packed_tokens");
  carve(B, T, training);
  m_acts->packed_attention = pk && packed_attention_applies(m_be, m_shape.compute, m_cfg, b);
  m_be.set_phase(Phase::Forward);
  Acts& a = *m_acts;
  const int64_t n = pk ? static_cast<int64_t>(b.token_rows.numel()) : B * T;
  auto rows = [&](const Tensor& t) { return pk ? t.slice(0, n) : t; };
  embeddings_forward(b, training, base, pk ? n : -1);
  for (int l = 0; l < L; ++l) {
    LayerActs& la = a.layers[a.layers.size() == 1 ? 0 : l];
    if (a.first_tokens && l == L - 1) {  // Note [last layer on the first tokens]: it writes a.cls
      last_layer_forward(rows(a.x_in(l)), la, b, true, base, a.cls_ctx, a.t3.slice(0, B));  // t3: free in forward
    } else if (pk) {
      LayerActs v = token_rows_of(la, n);
      layer_forward(l, rows(a.x_in(l)), rows(a.x_out(l)), v, b, training, base, rows(a.t1));
    } else {
      layer_forward(l, a.x_in(l), a.x_out(l), la, b, training, base, a.t1);
    }
  }
  // The head on the first token, or a per-token head on every token (padded: Note [packed
  // training] for the per-token heads).
  const Tensor head_in = pk && has_token_labels(m_cfg) ? padded_head_input(&b) : a.x_in(static_cast<int>(L));
  if (is_masked_lm(m_cfg)) {
    masked_lm_head_forward(head_in);
  } else if (is_token_classification(m_cfg)) {
    token_head_forward(head_in, training, base);
  } else {
    if (!a.first_tokens) first_token_rows(m_be, a.cls, rows(a.x_in(static_cast<int>(L))), b, pk);
    head_forward(training, base);
  }
  m_losses = a.losses;
  m_logits = a.logits;
  m_hidden = pk || a.first_tokens ? Tensor() : a.x_in(static_cast<int>(L)).view({B, T, H});
}

void BertForSequenceClassification::forward_backward(const DeviceBatch& b, float grad_scale, uint64_t base) {
  forward(b, true, base);
  Acts& a = *m_acts;
  const int64_t B = a.B, T = a.T, L = m_cfg.num_hidden_layers;
  const bool pk = a.packed_train && b.packed();
  const int64_t n = pk ? static_cast<int64_t>(b.token_rows.numel()) : B * T;
  auto rows = [&](const Tensor& t) { return pk ? t.slice(0, n) : t; };
  const bool mlm = is_masked_lm(m_cfg), tokens = has_token_labels(m_cfg);
  if (tokens) {  // Note [masked LM head]: the mean over the masked (labelled) tokens
    const float w = b.masked_tokens > 0 ? static_cast<float>(B) / static_cast<float>(b.masked_tokens) : 0.0f;
    m_be.token_cross_entropy(a.losses, a.dlogits, a.logits, b.labels, w, grad_scale * w);
  } else {
    sequence_loss(m_be, problem_type_of(m_cfg), a.losses, a.dlogits, a.logits, b.labels, grad_scale);
  }
  m_be.set_phase(Phase::Backward);
  // Gradients in freed activations: the tail and the embeddings' ranges are zeroed just before
  // they are written; the layers' matrices are stored by their GEMMs (Note [layer gradients stored]).
  const bool overlaid = m_act_block.data() != nullptr;
  const auto& ranges = m_grad_ranges;  // [embeddings, layer 0 .. L-1, tail]
  if (overlaid) zero_grad_range(ranges.back().first, ranges.back().second);

  // The encoder output's gradient in t1 (padded under a per-token head, else as the encoder ran).
  const Tensor head_in = pk && tokens ? padded_head_input() : a.x_in(static_cast<int>(L));
  if (mlm) {
    masked_lm_head_backward(head_in, a.t1, a.t2, a.t3);
  } else if (tokens) {
    token_head_backward(head_in, a.t1, base);
  } else {
    head_backward(base);  // the last layer on the first tokens starts from hd2 itself
    if (!a.first_tokens) first_token_rows_backward(m_be, rows(a.t1), a.hd2, b, pk);
  }

  // Encoder layers in reverse; the gradient rotates through t1, t2, t3.
  Tensor X1 = a.t1, X2 = a.t2, X3 = a.t3;
  if (pk && tokens) {  // the token rows of the per-token head's padded gradient
    m_be.gather_rows(rows(a.t2), a.t1, b.token_rows);
    std::swap(X1, X2);
  }
  for (int l = static_cast<int>(L) - 1; l >= 0; --l) {
    LayerActs& la = a.layers[a.layers.size() == 1 ? 0 : l];
    // Layer checkpointing: recompute this layer's forward from its saved input (X2 is free
    // scratch here). It rewrites xs[l+1] with the values it already holds.
    if (m_shape.checkpointing == CheckpointPolicy::Layer && l != L - 1) layer_forward(l, a.x_in(l), a.x_out(l), la, b, true, base, X2);
    Tensor dx;
    if (a.first_tokens && l == L - 1) {
      dx = last_layer_backward(la, rows(a.x_in(l)), b, base, X1, X2, X3);
    } else {
      LayerActs v = pk ? token_rows_of(la, n) : la;
      dx = layer_backward(l, X1, v, rows(a.x_in(l)), rows(a.x_out(l)), b, base, X1, X2, X3);
    }
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
  if (overlaid) zero_grad_range(ranges.front().first, ranges.front().second);
  embeddings_backward(b, base, pk ? n : -1, X1, X2, X3);
  if (mlm)  // the tied decoder's gradient: E += dlogits^T h (after the embeddings' range was zeroed), b += sum dlogits
    m_be.matmul(G(m_names.word), a.dlogits, Trans::T, a.lm_h, Trans::N,
                {1, 1, Epilogue::BiasGrad, G(m_names.head_out_b), {}});
  if (overlaid) m_hidden = Tensor();  // its memory now holds gradients
}

// Both packed layouts compute on the token rows (Note [packed inference]); carve_packed marks them.
bool BertForSequenceClassification::last_forward_packed() const { return m_acts->packed; }

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
  embeddings_forward(b, false, 0, N);
  a.packed_attention = packed_attention_applies(m_be, m_shape.compute, m_cfg, b);
  if (!a.packed_attention) m_be.fill(a.qkv_pad, 0.0f);  // padding rows stay zero: the scatters write token rows only
  // N-row views of the carved tensors (lse stays [B, heads, T]).
  LayerActs la = a.layers[0];
  for (Tensor* t : {&la.qkv, &la.ctx, &la.rstd1, &la.h1, &la.pre, &la.g, &la.rstd2})
    *t = t->slice(0, N);
  Tensor x = a.xs[1].slice(0, N), y = a.xs[0].slice(0, N);  // embeddings_forward wrote x
  const bool first = last_layer_on_first_tokens(m_cfg, m_shape);  // Note [last layer on the first tokens]
  for (int l = 0; l < L; ++l) {
    if (first && l == L - 1) {  // the first tokens' context in qkv_pad (dead once attention has
      // run), their input rows in y (the layer writes a.cls instead)
      last_layer_forward(x, la, b, false, 0, ParamLayout::range(a.qkv_pad, 0, {B, m_cfg.hidden_size}), y.slice(0, B));
      break;
    }
    layer_forward(l, x, y, la, b, false, 0, a.t1.slice(0, N));
    std::swap(x, y);
  }
  // The head on each sequence's first token (no dropout in eval), or a per-token head on the
  // padded layout.
  if (has_token_labels(m_cfg)) {
    const Tensor in = padded_head_input(&b, x);
    if (is_masked_lm(m_cfg))
      masked_lm_head_forward(in);
    else
      token_head_forward(in, false, 0);
  } else {
    if (!first) first_token_rows(m_be, a.cls, x, b, true);
    head_forward(false, 0);
  }
  m_losses = a.losses;
  m_logits = a.logits;
  m_hidden = Tensor();  // no [B, T, H] encoder output on this path: the hidden state is packed
}

}  // namespace anatomy

namespace anatomy {

Tensor BertForSequenceClassification::position_table(const Tensor& flat) const {
  const ParamInfo& p = m_layout.get(m_names.position);
  const int64_t off = m_cfg.position_offset(), E = m_cfg.embedding_width();
  return ParamLayout::range(flat, p.offset + static_cast<size_t>(off * E), {m_cfg.max_position_embeddings - off, E});
}

// Writes the encoder's input: xs[0] (R rows), or with n >= 0 its first n rows, the token rows
// of DeviceBatch::token_rows (packed training and packed inference; packed inference puts them
// in xs[1], the layers' first input there).
void BertForSequenceClassification::embeddings_forward(const DeviceBatch& b, bool training, uint64_t base, int64_t n) {
  Acts& a = *m_acts;
  const float eps = static_cast<float>(m_cfg.layer_norm_eps), hp = static_cast<float>(m_cfg.hidden_dropout_prob);
  Tensor type = m_names.token_type.empty() ? a.zero_type : M(m_names.token_type);
  if (m_names.token_type.empty()) m_be.fill(a.zero_type, 0.0f);
  m_be.embedding_forward(a.emb_sum, b.input_ids, m_cfg.has_token_types() ? b.token_type_ids : Tensor(), M(m_names.word),
                         position_table(m_master.tensor()), type);
  m_be.layernorm_forward(a.emb_ln, Tensor(), a.mean, a.emb_rstd, a.emb_sum, Tensor(), M(m_names.emb_ln_w),
                         M(m_names.emb_ln_b), eps, {});
  const bool proj = m_cfg.projects_embeddings();
  if (a.packed) {  // packed inference: gather (into t1 when a projection follows), project
    Tensor x = a.xs[1].slice(0, n);
    Tensor g = proj ? Tensor(a.t1.data, a.t1.dtype, {n, m_cfg.embedding_width()}, a.t1.device) : x;
    m_be.gather_rows(g, a.emb_ln, b.token_rows);
    if (proj)
      m_be.matmul(x, g, Trans::N, W(m_names.project_w), Trans::T, {1, 0, Epilogue::Bias, W(m_names.project_b), {}});
    return;
  }
  // The dropped-out embeddings: the projection's input, or the encoder's input itself.
  const Tensor d = proj ? a.emb_d : a.xs[0];
  auto rows = [&](const Tensor& t) { return n >= 0 ? t.slice(0, n) : t; };
  if (n >= 0) {
    m_be.gather_rows(rows(d), a.emb_ln, b.token_rows);
    if (training && hp > 0) m_be.dropout_forward(rows(d), rows(d), drop(hp, base, 0, training));
  } else if (d.data != a.emb_ln.data) {
    m_be.dropout_forward(d, a.emb_ln, drop(hp, base, 0, training));
  }
  if (proj)
    m_be.matmul(rows(a.xs[0]), rows(d), Trans::N, W(m_names.project_w), Trans::T,
                {1, 0, Epilogue::Bias, W(m_names.project_b), {}});
}

// From the gradient of the encoder's input in X1 (its first n rows when n >= 0), through the
// projection, dropout and LayerNorm into the tables. X1..X3 are [R, H] scratch (E <= H).
void BertForSequenceClassification::embeddings_backward(const DeviceBatch& b, uint64_t base, int64_t n, Tensor& X1,
                                                        Tensor& X2, Tensor& X3) {
  Acts& a = *m_acts;
  const int64_t R = a.B * a.T, E = m_cfg.embedding_width();
  const float hp = static_cast<float>(m_cfg.hidden_dropout_prob);
  auto rows = [&](const Tensor& t) { return n >= 0 ? t.slice(0, n) : t; };
  auto wide = [&](const Tensor& t) { return Tensor(t.data, t.dtype, {R, E}, t.device); };  // the first R*E elements
  const bool proj = m_cfg.projects_embeddings();
  if (proj) {  // x0 = d P^T + p: dP += dx0^T d, dp += sum dx0, dd = dx0 P
    m_be.matmul(G(m_names.project_w), rows(X1), Trans::T, rows(a.emb_d), Trans::N,
                {1, 1, Epilogue::BiasGrad, G(m_names.project_b), {}});
    m_be.matmul(rows(wide(X2)), rows(X1), Trans::N, W(m_names.project_w), Trans::N, {1, 0, Epilogue::None, {}, {}});
    std::swap(X1, X2);
  }
  const Tensor d = proj ? a.emb_d : a.xs[0];
  if (n >= 0) {  // the token rows' gradient into a zeroed padded buffer; the rest runs padded
    if (hp > 0) m_be.dropout_backward(rows(wide(X1)), rows(wide(X1)), drop(hp, base, 0, true));
    m_be.fill(wide(X3), 0.0f);
    m_be.scatter_rows(wide(X3), rows(wide(X1)), b.token_rows);
    std::swap(X1, X3);
  } else if (d.data != a.emb_ln.data) {
    m_be.dropout_backward(wide(X1), wide(X1), drop(hp, base, 0, true));
  }
  m_be.layernorm_backward(wide(X2), Tensor(), G(m_names.emb_ln_w), G(m_names.emb_ln_b), wide(X1), a.emb_ln, a.emb_rstd,
                          M(m_names.emb_ln_w), M(m_names.emb_ln_b), {});
  Tensor dtype = a.type_sink;
  if (!m_names.token_type.empty()) dtype = G(m_names.token_type);
  m_be.embedding_backward(G(m_names.word), position_table(m_grads_view), dtype, wide(X2), b.input_ids,
                          m_cfg.has_token_types() ? b.token_type_ids : Tensor());
}

// From a.cls (the first token's final hidden state) to the logits (Note [encoder variants]).
void BertForSequenceClassification::head_forward(bool training, uint64_t base) {
  Acts& a = *m_acts;
  const int L = static_cast<int>(m_cfg.num_hidden_layers);
  const float p = head_dropout(m_cfg);
  if (a.cls_d.data != a.cls.data) m_be.dropout_forward(a.cls_d, a.cls, drop(p, base, site_attn_out(L), training));
  const Tensor wd = W(m_names.head_dense_w), bd = W(m_names.head_dense_b);
  if (m_cfg.architecture == Architecture::Electra) {
    m_be.matmul(a.pooled, a.cls_d, Trans::N, wd, Trans::T, {1, 0, Epilogue::BiasGelu, bd, a.head_pre});
  } else {
    m_be.matmul(a.pooled, a.cls_d, Trans::N, wd, Trans::T, {1, 0, Epilogue::Bias, bd, {}});
    if (m_cfg.architecture == Architecture::DistilBert)
      m_be.relu_forward(a.pooled, a.pooled);
    else
      m_be.tanh_forward(a.pooled, a.pooled);
  }
  if (a.pooled_d.data != a.pooled.data) m_be.dropout_forward(a.pooled_d, a.pooled, drop(p, base, site_attn(L), training));
  m_be.matmul(a.logits, a.pooled_d, Trans::N, W(m_names.head_out_w), Trans::T,
              {1, 0, Epilogue::Bias, W(m_names.head_out_b), {}});
}

// From a.dlogits to the first token's gradient in a.hd2.
void BertForSequenceClassification::head_backward(uint64_t base) {
  Acts& a = *m_acts;
  const int L = static_cast<int>(m_cfg.num_hidden_layers);
  const float p = head_dropout(m_cfg);
  const MatmulArgs put{1, 0, Epilogue::None, {}, {}};
  // dW += dY^T X with db += the column sums of dY in the same call (Note [fused bias gradient]).
  auto acc_bias = [](const Tensor& db) { return MatmulArgs{1, 1, Epilogue::BiasGrad, db, {}}; };
  m_be.matmul(G(m_names.head_out_w), a.dlogits, Trans::T, a.pooled_d, Trans::N, acc_bias(G(m_names.head_out_b)));
  m_be.matmul(a.hd1, a.dlogits, Trans::N, W(m_names.head_out_w), Trans::N, put);
  if (a.pooled_d.data != a.pooled.data) m_be.dropout_backward(a.hd1, a.hd1, drop(p, base, site_attn(L), true));
  switch (m_cfg.architecture) {
    case Architecture::Electra: m_be.gelu_backward(a.hd1, a.hd1, a.head_pre); break;
    case Architecture::DistilBert: m_be.relu_backward(a.hd1, a.hd1, a.pooled); break;
    default: m_be.tanh_backward(a.hd1, a.hd1, a.pooled); break;
  }
  m_be.matmul(G(m_names.head_dense_w), a.hd1, Trans::T, a.cls_d, Trans::N, acc_bias(G(m_names.head_dense_b)));
  m_be.matmul(a.hd2, a.hd1, Trans::N, W(m_names.head_dense_w), Trans::N, put);
  if (a.cls_d.data != a.cls.data) m_be.dropout_backward(a.hd2, a.hd2, drop(p, base, site_attn_out(L), true));
}

// Note [token classification head] (model/heads.h): logits = dropout(x) W^T + b on every token.
void BertForSequenceClassification::token_head_forward(const Tensor& x, bool training, uint64_t base) {
  Acts& a = *m_acts;
  const int L = static_cast<int>(m_cfg.num_hidden_layers);
  Tensor in = x;
  if (training && a.tok_xd.defined()) {
    m_be.dropout_forward(a.tok_xd, x, drop(token_head_dropout(m_cfg), base, site_attn_out(L), true));
    in = a.tok_xd;
  }
  m_be.matmul(a.logits, in, Trans::N, W(m_names.head_out_w), Trans::T, {1, 0, Epilogue::Bias, W(m_names.head_out_b), {}});
}

void BertForSequenceClassification::token_head_backward(const Tensor& x, const Tensor& dx, uint64_t base) {
  Acts& a = *m_acts;
  const int L = static_cast<int>(m_cfg.num_hidden_layers);
  const Tensor in = a.tok_xd.defined() ? a.tok_xd : x;
  m_be.matmul(G(m_names.head_out_w), a.dlogits, Trans::T, in, Trans::N,
              {1, 1, Epilogue::BiasGrad, G(m_names.head_out_b), {}});
  m_be.matmul(dx, a.dlogits, Trans::N, W(m_names.head_out_w), Trans::N, {1, 0, Epilogue::None, {}, {}});
  if (a.tok_xd.defined()) m_be.dropout_backward(dx, dx, drop(token_head_dropout(m_cfg), base, site_attn_out(L), true));
}

// Note [masked LM head] (model/heads.h): h = LayerNorm(gelu(x Wd^T + bd)), logits = h E^T + b,
// the GELU output in t1 (scratch: the layers are done with it).
void BertForSequenceClassification::masked_lm_head_forward(const Tensor& x) {
  Acts& a = *m_acts;
  m_be.matmul(a.t1, x, Trans::N, W(m_names.head_dense_w), Trans::T,
              {1, 0, Epilogue::BiasGelu, W(m_names.head_dense_b), a.lm_pre});
  m_be.layernorm_forward(a.lm_h, Tensor(), a.mean, a.lm_rstd, a.t1, Tensor(), M(m_names.head_ln_w),
                         M(m_names.head_ln_b), static_cast<float>(m_cfg.layer_norm_eps), {});
  m_be.matmul(a.logits, a.lm_h, Trans::N, W(m_names.word), Trans::T,
              {1, 0, Epilogue::Bias, W(m_names.head_out_b), {}});
}

// From a.dlogits to the encoder output's gradient in dx (d1, d2 scratch [R, H]); the decoder's
// gradient into the word embeddings comes after the embeddings' backward (forward_backward).
void BertForSequenceClassification::masked_lm_head_backward(const Tensor& x, const Tensor& dx, const Tensor& d1,
                                                            const Tensor& d2) {
  Acts& a = *m_acts;
  const MatmulArgs put{1, 0, Epilogue::None, {}, {}};
  // The decoder's bias gradient comes with its weight's, the word embeddings' (forward_backward).
  m_be.matmul(d1, a.dlogits, Trans::N, W(m_names.word), Trans::N, put);  // dh = dlogits E
  m_be.layernorm_backward(d2, Tensor(), G(m_names.head_ln_w), G(m_names.head_ln_b), d1, a.lm_h, a.lm_rstd,
                          M(m_names.head_ln_w), M(m_names.head_ln_b), {});
  m_be.gelu_backward(d2, d2, a.lm_pre);
  m_be.matmul(G(m_names.head_dense_w), d2, Trans::T, x, Trans::N,
              {1, 1, Epilogue::BiasGrad, G(m_names.head_dense_b), {}});
  m_be.matmul(dx, d2, Trans::N, W(m_names.head_dense_w), Trans::N, put);
}

}  // namespace anatomy
