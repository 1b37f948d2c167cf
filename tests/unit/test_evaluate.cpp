// Evaluation: the metric functions against hand-computed values, the padding-skipping forward
// (Note [packed inference]) against the padded one, evaluate() against a manual forward, and
// `anatomy eval` end to end on a saved model (results, predictions, bad input).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../common/cli.h"
#include "../common/compare.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/text_dataset.h"
#include "data/tokenizer.h"
#include "io/checkpoint.h"
#include "memory/planner.h"
#include "model/bert.h"
#include "train/evaluate.h"

using namespace anatomy;
namespace fs = std::filesystem;

namespace {

// ---- fixtures -------------------------------------------------------------------------------

const std::vector<std::string> kWords = {"the", "movie", "was", "good", "bad", "great", "awful", "fine", "ok", "."};

// A small BERT over kWords (ids 0..4 special, 5.. words) with three named classes.
BertConfig small_config() {
  BertConfig c;
  c.vocab_size = 5 + static_cast<int64_t>(kWords.size());
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 48;
  c.max_position_embeddings = 64;
  c.id2label = {{0, "negative"}, {1, "neutral"}, {2, "positive"}};
  c.label2id = {{"negative", 0}, {"neutral", 1}, {"positive", 2}};
  c.num_labels = 3;
  return c;
}

std::string write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
  return p.string();
}

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::path(testing::TempDir()) / ("anatomy_eval_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_vocab(const fs::path& dir) {
  std::string v = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
  for (const auto& w : kWords) v += w + "\n";
  write_file(dir / "vocab.txt", v);
}

// n labelled sentences of varied length (3 to 12 words) as JSONL.
std::string sentences_jsonl(int n, uint64_t seed, bool labels = true) {
  const char* names[] = {"negative", "neutral", "positive"};
  Rng rng(seed);
  std::string out;
  for (int i = 0; i < n; ++i) {
    std::string text;
    const int64_t words = rng.randint(3, 13);
    for (int64_t w = 0; w < words; ++w) text += (w ? " " : "") + kWords[rng.randint(0, static_cast<int64_t>(kWords.size()))];
    nlohmann::json j = {{"text", text}};
    if (labels) j["label"] = names[rng.randint(0, 3)];
    out += j.dump() + "\n";
  }
  return out;
}

// A host batch on the backend's device (the buffers live as long as this object).
struct Uploaded {
  Buffer ids, types, mask, labels, rows, first;
  DeviceBatch db;
  Uploaded(Backend& be, const HostBatch& hb, bool packed) {
    Allocator& al = be.allocator();
    const int64_t B = hb.batch, T = hb.seq;
    ids = Buffer(al, DType::I32, {B, T}, Category::Other);
    types = Buffer(al, DType::I32, {B, T}, Category::Other);
    mask = Buffer(al, DType::I32, {B, T}, Category::Other);
    labels = Buffer(al, DType::I32, {B}, Category::Other);
    be.upload(ids, hb.input_ids.data());
    be.upload(types, hb.token_type_ids.data());
    be.upload(mask, hb.attention_mask.data());
    be.upload(labels, hb.labels.data());
    db = DeviceBatch{ids.tensor(), types.tensor(), mask.tensor(), labels.tensor()};
    if (packed) {
      const PackedRows pr = pack_token_rows(hb.attention_mask.data(), B, T);
      rows = Buffer(al, DType::I32, {static_cast<int64_t>(pr.token_rows.size())}, Category::Other);
      first = Buffer(al, DType::I32, {B}, Category::Other);
      be.upload(rows, pr.token_rows.data());
      be.upload(first, pr.first_rows.data());
      db.token_rows = rows.tensor();
      db.first_rows = first.tensor();
    }
  }
};

std::vector<float> logits_of(BertForSequenceClassification& m, const HostBatch& hb, bool packed) {
  Uploaded up(m.backend(), hb, packed);
  m.forward_eval(up.db);
  std::vector<float> out(m.logits().numel());
  m.backend().download(out.data(), m.logits());
  return out;
}

// A random batch: sequence b has lengths[b] tokens ([CLS] words [SEP]), then padding.
HostBatch random_batch(const std::vector<int64_t>& lengths, int64_t T, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  HostBatch hb;
  hb.resize(static_cast<int64_t>(lengths.size()), T);
  for (size_t b = 0; b < lengths.size(); ++b) {
    for (int64_t t = 0; t < lengths[b]; ++t) {
      hb.input_ids[b * T + t] = t == 0 ? 2 : t == lengths[b] - 1 ? 3 : static_cast<int32_t>(rng.randint(5, vocab));
      hb.token_type_ids[b * T + t] = t >= lengths[b] / 2 ? 1 : 0;
      hb.attention_mask[b * T + t] = 1;
    }
    hb.labels[b] = static_cast<int32_t>(b % 3);
  }
  return hb;
}

}  // namespace

// ---- metrics --------------------------------------------------------------------------------

TEST(EvalMetrics, Accuracy) {
  const std::vector<int32_t> y = {0, 1, 2, 2, 1}, p = {0, 2, 2, 2, 0};
  EXPECT_DOUBLE_EQ(accuracy(p, y), 3.0 / 5.0);
  EXPECT_DOUBLE_EQ(accuracy(y, y), 1.0);
  EXPECT_THROW(accuracy(std::vector<int32_t>{1}, y), Error);
  EXPECT_THROW(accuracy(std::vector<int32_t>{}, std::vector<int32_t>{}), Error);
}

TEST(EvalMetrics, MacroF1ByHand) {
  // sklearn's documentation example: per-class F1 (0.8, 0, 0) -> 0.2667.
  EXPECT_NEAR(macro_f1(std::vector<int32_t>{0, 2, 1, 0, 0, 1}, std::vector<int32_t>{0, 1, 2, 0, 1, 2}), 0.8 / 3, 1e-12);
  // A class only predicted counts (F1 0): class 0 = 2/3, class 1 = 1, class 2 = 0.
  EXPECT_NEAR(macro_f1(std::vector<int32_t>{0, 2, 1, 1}, std::vector<int32_t>{0, 0, 1, 1}), (2.0 / 3 + 1 + 0) / 3, 1e-12);
  // A class neither present nor predicted (say 5 of a 6-class model) does not: all right is 1.
  EXPECT_DOUBLE_EQ(macro_f1(std::vector<int32_t>{1, 3, 3}, std::vector<int32_t>{1, 3, 3}), 1.0);
  // Binary: class 1 has TP 1, FP 1, FN 1 -> 0.5; class 0 has TP 1, FP 1, FN 1 -> 0.5.
  EXPECT_DOUBLE_EQ(macro_f1(std::vector<int32_t>{1, 0, 1, 0}, std::vector<int32_t>{1, 1, 0, 0}), 0.5);
}

TEST(EvalMetrics, CrossEntropySoftmaxArgmax) {
  const std::vector<float> row = {0.0f, std::log(3.0f)};  // softmax (1/4, 3/4)
  EXPECT_NEAR(cross_entropy(row, 1), std::log(4.0 / 3.0), 1e-7);
  EXPECT_NEAR(cross_entropy(row, 0), std::log(4.0), 1e-7);
  const std::vector<float> two = {0.0f, std::log(3.0f), 1.0f, 1.0f};
  EXPECT_NEAR(mean_cross_entropy(two, 2, std::vector<int32_t>{1, 0}), (std::log(4.0 / 3.0) + std::log(2.0)) / 2, 1e-7);
  const std::vector<float> p = softmax(row);
  EXPECT_NEAR(p[0], 0.25f, 1e-7);
  EXPECT_NEAR(p[1], 0.75f, 1e-7);
  // Large logits stay finite (log-sum-exp), and ties go to the first class as numpy's argmax.
  const std::vector<float> big = {1000.0f, 1000.0f, -1000.0f};
  EXPECT_NEAR(cross_entropy(big, 0), std::log(2.0), 1e-9);
  EXPECT_EQ(argmax(big), 0);
  EXPECT_EQ(argmax(std::vector<float>{-1.0f, 2.0f, 2.0f}), 1);
  EXPECT_THROW(cross_entropy(row, 2), Error);
}

// ---- the packed forward ---------------------------------------------------------------------

TEST(PackedInference, GatherAndScatterRows) {
  auto be = make_cpu_backend(1);
  Allocator& al = be->allocator();
  Buffer in(al, DType::F32, {5, 3}, Category::Other), packed(al, DType::F32, {3, 3}, Category::Other),
      back(al, DType::F32, {5, 3}, Category::Other), idx(al, DType::I32, {3}, Category::Other);
  for (int i = 0; i < 15; ++i) in.tensor().ptr<float>()[i] = static_cast<float>(i);
  const int32_t rows[] = {4, 0, 2};
  be->upload(idx, rows);
  be->fill(packed, std::nanf(""));
  be->gather_rows(packed, in, idx);
  const std::vector<float> want = {12, 13, 14, 0, 1, 2, 6, 7, 8};
  EXPECT_EQ(std::vector<float>(packed.tensor().ptr<float>(), packed.tensor().ptr<float>() + 9), want);
  be->fill(back, -1.0f);
  be->scatter_rows(back, packed, idx);
  const float* b = back.tensor().ptr<float>();
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 3; ++c)
      EXPECT_EQ(b[r * 3 + c], (r == 1 || r == 3) ? -1.0f : static_cast<float>(r * 3 + c)) << r;  // rows not named stay
  // Any dtype: I32 rows move bit for bit.
  Buffer ii(al, DType::I32, {5, 2}, Category::Other), io(al, DType::I32, {3, 2}, Category::Other);
  for (int i = 0; i < 10; ++i) ii.tensor().ptr<int32_t>()[i] = 100 + i;
  be->gather_rows(io, ii, idx);
  EXPECT_EQ(io.tensor().ptr<int32_t>()[0], 108);
  // Bad index, width or dtype: one-line errors.
  const int32_t bad[] = {4, 5, 0};
  be->upload(idx, bad);
  EXPECT_THROW(be->gather_rows(packed, in, idx), Error);
  EXPECT_THROW(be->scatter_rows(back, packed, idx), Error);
  be->upload(idx, rows);
  EXPECT_THROW(be->gather_rows(io, in, idx), Error);
  EXPECT_THROW(be->gather_rows(packed, ii, idx), Error);
}

TEST(PackedInference, PackTokenRows) {
  // Row 0: 3 tokens of 4; row 1: left padding (first token masked, kept for the pooler);
  // row 2: no token at all (every row kept, as the padded attention averages over all keys).
  const std::vector<int32_t> mask = {1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0};
  const PackedRows p = pack_token_rows(mask.data(), 3, 4);
  EXPECT_EQ(p.token_rows, (std::vector<int32_t>{0, 1, 2, 4, 5, 6, 8, 9, 10, 11}));
  EXPECT_EQ(p.first_rows, (std::vector<int32_t>{0, 3, 6}));
  // Rounded up to a multiple of 4 rows with padding rows not yet taken (3 and 7), and capped at B*T.
  const PackedRows q = pack_token_rows(mask.data(), 3, 4, 4);
  EXPECT_EQ(q.token_rows, (std::vector<int32_t>{0, 1, 2, 4, 5, 6, 8, 9, 10, 11, 3, 7}));
  EXPECT_EQ(q.first_rows, p.first_rows);
  EXPECT_EQ(pack_token_rows(mask.data(), 3, 4, 64).token_rows.size(), 12u);
}

TEST(PackedInference, LogitsEqualThePaddedForward) {
  const BertConfig cfg = small_config();
  for (DType dt : {DType::F32}) {
    auto be = make_cpu_backend();
    BertForSequenceClassification m(*be, cfg, {4, 16, dt, CheckpointPolicy::None, false});
    m.init_weights(3);
    // Varied lengths, and one sequence with its first token masked.
    HostBatch hb = random_batch({16, 5, 9, 2}, 16, cfg.vocab_size, 7);
    hb.attention_mask[1 * 16 + 0] = 0;
    const std::vector<float> padded = logits_of(m, hb, false), packed = logits_of(m, hb, true);
    ASSERT_EQ(padded.size(), packed.size());
    for (size_t i = 0; i < padded.size(); ++i) EXPECT_NEAR(packed[i], padded[i], 1e-5) << i;
    EXPECT_FALSE(m.hidden_states().defined());  // the packed path has no [B, T, H] output
    // Padding rows filling the packed count to a multiple (as evaluate() does on CUDA) change nothing.
    {
      Uploaded up(*be, hb, true);
      const PackedRows pr = pack_token_rows(hb.attention_mask.data(), 4, 16, 32);
      Buffer rows(be->allocator(), DType::I32, {static_cast<int64_t>(pr.token_rows.size())}, Category::Other);
      be->upload(rows, pr.token_rows.data());
      up.db.token_rows = rows.tensor();
      m.forward_eval(up.db);
      const float* z = m.logits().ptr<float>();
      for (size_t i = 0; i < padded.size(); ++i) EXPECT_NEAR(z[i], padded[i], 1e-5) << i;
    }
    // No padding at all: the same GEMM shapes, so the same bits, but in the last layer, which the
    // packed evaluation runs on the first tokens past attention (Note [last layer on the first
    // tokens]): the same sums over other GEMM shapes.
    const HostBatch full = random_batch({16, 16, 16}, 16, cfg.vocab_size, 8);
    EXPECT_TRUE(testing_compare::same_values<float>(logits_of(m, full, true), logits_of(m, full, false), 1e-7));
    // A shorter batch after a longer one re-carves (and back again).
    const HostBatch shorter = random_batch({6, 3}, 6, cfg.vocab_size, 9);
    const std::vector<float> a = logits_of(m, shorter, true), b = logits_of(m, shorter, false);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << i;
  }
}

// The packed layout fits the arenas the planner sized: planned == allocated after both paths,
// on an inference model and on a training one (the trainer evaluates with its own model).
TEST(PackedInference, PlannedEqualsAllocated) {
  for (const BertConfig& cfg : {small_config(), BertConfig::preset("bert-tiny")}) {
    for (bool training : {false, true}) {
      auto be = make_cpu_backend();
      const ModelShape shape{3, 24, DType::F32, CheckpointPolicy::None, training};
      {
        BertForSequenceClassification m(*be, cfg, shape);
        m.init_weights(1);
        const HostBatch hb = random_batch({24, 10, 3}, 24, std::min<int64_t>(cfg.vocab_size, 15), 2);
        logits_of(m, hb, true);
        logits_of(m, hb, false);
        const MemoryPlan plan = plan_memory({cfg, shape, OptimizerKind::AdamW, Device::CPU});
        const CategoryBytes peak = be->allocator().stats().peak();
        for (Category c : {Category::Weights, Category::Gradients, Category::Activations, Category::Temporary})
          EXPECT_EQ(peak[c], plan.bytes[c]) << category_name(c) << " training " << training;
      }
    }
  }
  // Inference sizes did not grow: packed <= padded, so the arena is the padded eval layout.
  const BertConfig big = BertConfig::preset("bert-base");
  const ArenaBytes eval = model_arena_bytes(big, {8, 128, DType::BF16, CheckpointPolicy::None, false});
  const ArenaBytes train = model_arena_bytes(big, {8, 128, DType::BF16, CheckpointPolicy::None, true});
  EXPECT_LT(eval.activations, train.activations / 4);
  EXPECT_GT(eval.activations, 0u);
}

// ---- evaluate() -----------------------------------------------------------------------------

class EvaluateTest : public testing::Test {
 protected:
  void SetUp() override {
    m_dir = fresh_dir(testing::UnitTest::GetInstance()->current_test_info()->name());
    write_vocab(m_dir);
    m_tok = std::make_unique<WordPieceTokenizer>(WordPieceTokenizer::from_vocab_txt((m_dir / "vocab.txt").string()));
  }
  void TearDown() override { fs::remove_all(m_dir); }
  TextDataset load(const std::string& jsonl, const BertConfig& cfg, bool labelled = true) {
    TextDataOptions o;
    o.cache = CacheMode::Off;
    o.max_length = 16;
    o.labels = LabelSet::from_id2label(cfg.id2label);
    if (!labelled) o.label_column.clear();
    return TextDataset::load(write_file(m_dir / "data.jsonl", jsonl), *m_tok, o);
  }
  fs::path m_dir;
  std::unique_ptr<WordPieceTokenizer> m_tok;
};

TEST_F(EvaluateTest, EqualsAManualForwardSampleBySample) {
  const BertConfig cfg = small_config();
  const TextDataset ds = load(sentences_jsonl(11, 5), cfg);
  auto be = make_cpu_backend();
  BertForSequenceClassification m(*be, cfg, {4, 16, DType::F32, CheckpointPolicy::None, false});
  m.init_weights(11);
  // Each sample alone, unpadded, through the padded path.
  std::vector<double> losses;
  std::vector<int32_t> preds, labels;
  int64_t tokens = 0;
  for (size_t i = 0; i < ds.size(); ++i) {
    HostBatch hb;
    hb.resize(1, ds.length(i));
    ds.get(i, hb, 0);
    const std::vector<float> z = logits_of(m, hb, false);
    losses.push_back(cross_entropy(z, ds.label(i)));
    preds.push_back(argmax(z));
    labels.push_back(ds.label(i));
    tokens += ds.length(i);
  }
  const int64_t other_before = be->allocator().stats().current()[Category::Other];
  for (auto [skip, sort] : {std::pair{true, true}, std::pair{false, true}, std::pair{true, false}}) {
    SCOPED_TRACE(testing::Message() << "skip_padding " << skip << " sort_by_length " << sort);
    EvalOptions o;
    o.batch_size = 3;
    o.skip_padding = skip;
    o.sort_by_length = sort;
    o.skip_padding_min_fraction = 0;  // pack every batch that has padding
    const EvalResult r = evaluate(m, ds, o);
    ASSERT_TRUE(r.labelled);
    EXPECT_EQ(r.samples, 11);
    EXPECT_EQ(r.batches, 4);
    EXPECT_EQ(r.predictions, preds);
    EXPECT_EQ(r.labels, labels);
    double mean = 0;
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_NEAR(r.losses[i], losses[i], 1e-5) << i;
      mean += losses[i] / static_cast<double>(losses.size());
    }
    EXPECT_NEAR(r.loss, mean, 1e-5);
    EXPECT_DOUBLE_EQ(r.accuracy, accuracy(preds, labels));
    EXPECT_DOUBLE_EQ(r.macro_f1, macro_f1(preds, labels));
    ASSERT_EQ(r.probabilities.size(), 33u);
    for (size_t i = 0; i < 11; ++i) {
      EXPECT_NEAR(r.probabilities[3 * i] + r.probabilities[3 * i + 1] + r.probabilities[3 * i + 2], 1.0, 1e-6);
      EXPECT_NEAR(std::log(r.probabilities[3 * i + labels[i]]), -losses[i], 1e-5);
    }
    // Longest first in batches of 3: each batch padded to its longest; packed computes the tokens only.
    EXPECT_EQ(r.tokens, tokens);
    EXPECT_GE(r.padded_tokens, tokens);
    EXPECT_LE(r.padded_tokens, 11 * 16);
    EXPECT_EQ(r.padded_tokens % 8, 0);  // pad_to_multiple_of
    EXPECT_EQ(r.computed_tokens, skip ? tokens : r.padded_tokens);
    // Its batch buffers are freed.
    EXPECT_EQ(be->allocator().stats().current()[Category::Other], other_before);
  }
  // Packing only where it skips enough: a threshold no batch reaches leaves them all padded.
  EvalOptions o;
  o.batch_size = 3;
  o.skip_padding_min_fraction = 1.0;
  const EvalResult r = evaluate(m, ds, o);
  EXPECT_EQ(r.packed_batches, 0);
  EXPECT_EQ(r.computed_tokens, r.padded_tokens);
  EXPECT_EQ(r.predictions, preds);
}

TEST_F(EvaluateTest, UnlabelledFileGivesPredictionsOnly) {
  const BertConfig cfg = small_config();
  const TextDataset ds = load(sentences_jsonl(5, 6, false), cfg, false);
  auto be = make_cpu_backend();
  BertForSequenceClassification m(*be, cfg, {8, 16, DType::F32, CheckpointPolicy::None, false});
  m.init_weights(2);
  const EvalResult r = evaluate(m, ds);
  EXPECT_FALSE(r.labelled);
  EXPECT_TRUE(std::isnan(r.loss));
  EXPECT_EQ(r.predictions.size(), 5u);
  EXPECT_TRUE(r.losses.empty());
  const nlohmann::json j = eval_metrics_json(r);
  EXPECT_FALSE(j.contains("eval_loss"));
  EXPECT_EQ(j["eval_samples"], 5);
}

// The trainer's case: its training model (a larger arena, a smaller micro-batch than asked) on
// a synthetic set whose padding lies inside a fixed length (no lengths known: dataset order).
TEST(Evaluate, OnATrainingModelAndASyntheticSet) {
  BertConfig cfg = BertConfig::preset("bert-tiny");
  auto be = make_cpu_backend();
  BertForSequenceClassification m(*be, cfg, {4, 32, DType::F32, CheckpointPolicy::Layer, true});
  m.init_weights(4);
  SyntheticDataset ds(SyntheticKind::Learnable, 10, 32, cfg.vocab_size, 1);
  EvalOptions o;
  o.batch_size = 8;  // capped at the model's 4
  const EvalResult packed = evaluate(m, ds, o);
  EXPECT_EQ(packed.batch_size, 4);
  EXPECT_EQ(packed.batches, 3);
  EXPECT_EQ(packed.padded_tokens, 10 * 32);
  EXPECT_LT(packed.computed_tokens, packed.padded_tokens);
  o.skip_padding = false;
  const EvalResult padded = evaluate(m, ds, o);
  EXPECT_EQ(packed.predictions, padded.predictions);
  EXPECT_NEAR(packed.loss, padded.loss, 1e-5);
  // Sample 7 in dataset order.
  HostBatch hb;
  hb.resize(1, 32);
  ds.get(7, hb, 0);
  const std::vector<float> z = logits_of(m, hb, false);
  EXPECT_NEAR(padded.losses[7], cross_entropy(z, hb.labels[0]), 1e-5);
  // Training still works after evaluating (the arena is re-carved).
  Uploaded up(*be, hb, false);
  m.zero_grads();
  EXPECT_NO_THROW(m.forward_backward(up.db, 1.0f, 0));
}

TEST_F(EvaluateTest, PredictionsFile) {
  const BertConfig cfg = small_config();
  const TextDataset ds = load(sentences_jsonl(4, 9), cfg);
  auto be = make_cpu_backend();
  BertForSequenceClassification m(*be, cfg, {4, 16, DType::F32, CheckpointPolicy::None, false});
  m.init_weights(5);
  const EvalResult r = evaluate(m, ds);
  const std::string path = (m_dir / "predictions.jsonl").string();
  write_predictions(path, r, cfg.id2label);
  std::ifstream in(path);
  std::string line;
  int64_t i = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j["index"], i);
    EXPECT_EQ(j["prediction_id"], r.predictions[i]);
    EXPECT_EQ(j["prediction"], cfg.id2label.at(r.predictions[i]));
    EXPECT_EQ(j["label"], cfg.id2label.at(ds.label(i)));
    EXPECT_EQ(j["probabilities"].size(), 3u);
    ++i;
  }
  EXPECT_EQ(i, 4);
}

// ---- `anatomy eval` -------------------------------------------------------------------------

namespace {

using Cmd = anatomy::testing_cli::CmdResult;
using anatomy::testing_cli::expect_clean_error;

Cmd run_cli(const std::string& args) { return anatomy::testing_cli::run_anatomy(args); }

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

std::vector<nlohmann::json> read_jsonl(const fs::path& p) {
  std::ifstream in(p);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

class EvalCli : public testing::Test {
 protected:
  void SetUp() override {
    m_dir = fresh_dir(std::string("cli_") + testing::UnitTest::GetInstance()->current_test_info()->name());
    m_model = m_dir / "model";
    auto be = make_cpu_backend(1);
    BertForSequenceClassification m(*be, small_config(), {1, 16, DType::F32, CheckpointPolicy::None, false});
    m.init_weights(21);
    save_pretrained(m_model.string(), m);
    write_vocab(m_model);
    m_data = write_file(m_dir / "eval.jsonl", sentences_jsonl(13, 3));
  }
  void TearDown() override { fs::remove_all(m_dir); }
  std::string base(const std::string& seq = "16") const {
    return "eval --device cpu --threads 1 --model-name-or-path " + m_model.string() + " --max-seq-length " + seq + " ";
  }
  fs::path m_dir, m_model;
  std::string m_data;
};

TEST_F(EvalCli, WritesResultsAndPredictions) {
  const fs::path out = m_dir / "out";
  const Cmd r = run_cli(base() + "--eval-file " + m_data + " --per-device-eval-batch-size 4 --output-dir " + out.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("Memory anatomy of inference"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("eval_accuracy"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Tokens:"), std::string::npos) << r.output;
  const nlohmann::json res = read_json(out / "eval_results.json");
  EXPECT_EQ(res["eval_samples"], 13);
  EXPECT_TRUE(res["eval_skip_padding"].get<bool>());
  EXPECT_LT(res["eval_computed_tokens"].get<int64_t>(), res["eval_padded_tokens"].get<int64_t>());
  EXPECT_GE(res["eval_computed_tokens"].get<int64_t>(), res["eval_tokens"].get<int64_t>());
  EXPECT_GT(res["eval_packed_batches"].get<int64_t>(), 0);
  EXPECT_GT(res["eval_steps_per_second"].get<double>(), 0);  // the Trainer's evaluate() key
  // Inference-only in fp32: 4 bytes/param of weights, no gradients, no optimizer state, and the
  // plan equal to the allocation in every category.
  EXPECT_DOUBLE_EQ(res["weights_bytes_per_param"].get<double>(), 4.0);
  EXPECT_EQ(res["allocator_peak_bytes"]["gradients"], 0);
  EXPECT_EQ(res["allocator_peak_bytes"]["optimizer_state"], 0);
  EXPECT_EQ(res["allocator_peak_bytes"], res["planned_bytes"]);
  // The predictions agree with the metrics.
  const std::vector<nlohmann::json> preds = read_jsonl(out / "predictions.jsonl");
  ASSERT_EQ(preds.size(), 13u);
  int hits = 0;
  double loss = 0;
  for (size_t i = 0; i < preds.size(); ++i) {
    const nlohmann::json& p = preds[i];
    EXPECT_EQ(p["index"], i);
    hits += p["prediction_id"] == p["label_id"];
    const std::vector<float> probs = p["probabilities"].get<std::vector<float>>();
    ASSERT_EQ(probs.size(), 3u);
    EXPECT_NEAR(probs[0] + probs[1] + probs[2], 1.0, 1e-5);
    EXPECT_EQ(p["prediction_id"].get<int>(), argmax(probs));
    loss -= std::log(probs[p["label_id"].get<int>()]) / 13.0;
    const std::string name = p["label"];
    EXPECT_TRUE(name == "negative" || name == "neutral" || name == "positive") << name;
  }
  EXPECT_NEAR(res["eval_accuracy"].get<double>(), hits / 13.0, 1e-12);
  EXPECT_NEAR(res["eval_loss"].get<double>(), loss, 1e-4);
  // The padded forward gives the same answers.
  const fs::path out2 = m_dir / "out_padded";
  const Cmd r2 = run_cli(base() + "--eval-file " + m_data + " --no-skip-padding --output-dir " + out2.string());
  ASSERT_EQ(r2.status, 0) << r2.output;
  const nlohmann::json res2 = read_json(out2 / "eval_results.json");
  EXPECT_FALSE(res2["eval_skip_padding"].get<bool>());
  EXPECT_EQ(res2["eval_computed_tokens"], res2["eval_padded_tokens"]);
  EXPECT_NEAR(res2["eval_loss"].get<double>(), res["eval_loss"].get<double>(), 1e-5);
  EXPECT_DOUBLE_EQ(res2["eval_accuracy"].get<double>(), res["eval_accuracy"].get<double>());
}

TEST_F(EvalCli, UnlabelledFile) {
  const std::string data = write_file(m_dir / "nolabels.jsonl", sentences_jsonl(3, 4, false));
  const fs::path out = m_dir / "out";
  const Cmd r = run_cli(base() + "--eval-file " + data + " --label-column '' --output-dir " + out.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_FALSE(read_json(out / "eval_results.json").contains("eval_loss"));
  const std::vector<nlohmann::json> preds = read_jsonl(out / "predictions.jsonl");
  ASSERT_EQ(preds.size(), 3u);
  EXPECT_FALSE(preds[0].contains("label"));
  EXPECT_TRUE(preds[0].contains("prediction"));
}

TEST_F(EvalCli, BadInputIsAOneLineError) {
  const fs::path out = m_dir / "bad_out";
  expect_clean_error(run_cli("eval --device cpu --eval-file " + m_data), "--model-name-or-path");
  expect_clean_error(run_cli("eval --device cpu --model-name-or-path " + m_model.string()), "--eval-file");
  expect_clean_error(run_cli(base() + "--eval-file " + (m_dir / "nope.jsonl").string()), "nope.jsonl");
  expect_clean_error(run_cli("eval --device cpu --model-name-or-path " + (m_dir / "absent").string() + " --eval-file " + m_data),
                     "absent");
  fs::create_directories(m_dir / "empty_model");
  expect_clean_error(run_cli("eval --device cpu --model-name-or-path " + (m_dir / "empty_model").string() +
                             " --eval-file " + m_data),
                     "config.json");
  // A label the model does not know: the file and its line.
  const std::string odd = write_file(m_dir / "odd.jsonl", "{\"text\": \"good\", \"label\": \"positive\"}\n"
                                                          "{\"text\": \"bad\", \"label\": \"furious\"}\n");
  expect_clean_error(run_cli(base() + "--eval-file " + odd), "odd.jsonl:2");
  expect_clean_error(run_cli(base() + "--eval-file " + m_data + " --precision bf16"), "--precision");
  expect_clean_error(run_cli(base("100") + "--eval-file " + m_data), "--max-seq-length");
  expect_clean_error(run_cli(base() + "--eval-file " + m_data + " --per-device-eval-batch-size 0"),
                     "--per-device-eval-batch-size");
  EXPECT_FALSE(fs::exists(out / "eval_results.json"));
}
