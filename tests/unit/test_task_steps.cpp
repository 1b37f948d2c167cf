// The per-token tasks as transformers' Trainer runs them: masked-LM masks drawn afresh each epoch
// and reproduced by a resumed run (Note [masking] in data/masked_lm.h); the loss of a step
// normalized by the labelled tokens of the whole step over every micro-batch and rank (Note
// [labelled tokens per step] in train/step.cpp), so that gradient accumulation and data
// parallelism train like one big batch; evaluation over several ranks equal to one.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "../common/cli.h"
#include "../common/data_parallel.h"
#include "../common/dirs.h"
#include "data/masked_lm.h"
#include "data/tokenizer.h"
#include "data/unicode.h"
#include "io/read_file.h"
#include "train/train_data.h"
#include "train/trainer.h"

using namespace anatomy;
using namespace anatomy::testing_dp;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kSentiment = std::string(ANATOMY_SOURCE_DIR) + "/tests/data/text/sentiment.jsonl";

// The RoBERTa fixture without dropout, so that a batch cut into micro-batches or ranks computes
// the same gradient as the whole batch.
std::string dropout_free_roberta(const std::string& name) {
  const std::string src = std::string(ANATOMY_SOURCE_DIR) + "/tests/fixtures/models/roberta";
  const std::string dir = fresh_dir(name);
  for (const char* f : {"model.safetensors", "tokenizer.json"}) fs::copy_file(src + "/" + f, dir + "/" + f);
  json cfg = json::parse(read_regular_file(src + "/config.json"));
  cfg["hidden_dropout_prob"] = 0.0;
  cfg["attention_probs_dropout_prob"] = 0.0;
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  return dir;
}

// A tiny ModernBERT (a golden fixture's config: hidden 24, 3 heads, a local layer, no dropout;
// `fixture` names the head) with the RoBERTa fixture's tokenizer and its 400 tokens, weights from
// init (every run draws the same from the seed).
std::string tiny_modernbert(const std::string& name, const std::string& fixture) {
  const std::string dir = fresh_dir(name);
  json cfg = json::parse(read_regular_file(std::string(ANATOMY_SOURCE_DIR) + "/tests/data/golden_family/" + fixture +
                                           "/config.json"));
  cfg["vocab_size"] = 400;
  cfg["pad_token_id"] = 1;
  cfg["initializer_range"] = 0.02;
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  fs::copy_file(std::string(ANATOMY_SOURCE_DIR) + "/tests/fixtures/models/roberta/tokenizer.json", dir + "/tokenizer.json");
  return dir;
}

// Tagged sentences of varied length (so that micro-batches hold different counts of labelled
// tokens): a name, a verb, a place, and a tail of plain words.
std::string write_tagged(const std::string& path, int n, int offset) {
  const std::vector<std::string> names{"John", "Mary", "Alice", "Bob", "Anna"}, places{"Paris", "Rome", "Oslo", "Madrid"};
  const std::vector<std::string> filler{"and", "then", "went", "home", "early", "today", "with", "friends"};
  std::ofstream out(path);
  for (int i = 0; i < n; ++i) {
    const int k = i + offset;
    std::vector<std::string> words{names[static_cast<size_t>(k) % names.size()], "visited",
                                   places[static_cast<size_t>(k * 3) % places.size()]};
    std::vector<std::string> tags{"B-PER", "O", "B-LOC"};
    for (int w = 0; w < (k * 5) % 7; ++w) {
      words.push_back(filler[static_cast<size_t>(w + k) % filler.size()]);
      tags.push_back("O");
    }
    out << json{{"tokens", words}, {"ner_tags", tags}}.dump() << "\n";
  }
  return path;
}

using testing_cli::loss_curve;

TrainOptions task_options(const std::string& task, const std::string& model, const std::string& data,
                          const std::string& out) {
  TrainOptions o;
  o.task = task;
  o.model_name_or_path = model;
  o.train_file = data;
  o.dataset_cache_dir = fresh_dir(out + "_cache");
  o.device = DeviceChoice::Cpu;
  o.threads = 1;
  o.seq_len = 32;
  o.line_by_line = true;  // a sample per text: the per-token losses vary in count (Note [grouped texts] aside)
  o.logging_steps = 1;
  o.learning_rate = 1e-4f;
  o.disable_progress_bar = true;
  o.output_dir = fresh_dir(out);
  return o;
}

}  // namespace

// A training sample's masks change with the epoch and are a pure function of (seed, epoch,
// sample); evaluation batches (epoch 0) keep the masks they always had.
TEST(MaskedLmEpochs, MasksAreDrawnAfreshEachEpochAndReproducibly) {
  const auto tok = Tokenizer::from_directory(std::string(ANATOMY_SOURCE_DIR) + "/tests/fixtures/models/roberta");
  TextDataOptions to;
  to.max_length = 32;
  to.label_column = "";
  to.cache_dir = fresh_dir("mlm_epochs_cache");
  auto text = std::make_shared<TextDataset>(TextDataset::load(kSentiment, tok, to));
  const MaskedLMDataset ds(text, masking_for(tok, "roberta", 0.15, 42));
  auto draw = [&](int64_t epoch) {
    HostBatch hb;
    hb.epoch = epoch;
    hb.resize(16, 32);
    for (int64_t i = 0; i < 16; ++i) ds.get(static_cast<size_t>(i), hb, i);
    return hb.token_labels;
  };
  const auto e0 = draw(0), e1 = draw(1), e2 = draw(2);
  EXPECT_EQ(draw(1), e1);
  EXPECT_NE(e0, e1);
  EXPECT_NE(e1, e2);
  // Epoch 0 is the draw of mask_tokens without an epoch (what evaluation and `anatomy eval` see).
  HostBatch hb;
  hb.resize(1, 32);
  text->get(3, hb, 0);
  std::vector<int32_t> labels(32);
  mask_tokens(hb.input_ids.data(), hb.attention_mask.data(), labels.data(), 32, 3, masking_for(tok, "roberta", 0.15, 42));
  EXPECT_EQ(labels, std::vector<int32_t>(e0.begin() + 3 * 32, e0.begin() + 4 * 32));
}

// Note [grouped texts]: run_mlm.py's group_texts over datasets.map's batches of 1000 texts. 1001
// texts of 5 tokens in blocks of 4: the first 1000 make 5000 tokens, 1250 blocks; the last text's
// 5 tokens make one block and drop 1. Every token in the order of the texts, every position real.
TEST(MaskedLmGroupedTexts, BlocksAreTheJoinedTextsCutPerThousand) {
  std::vector<std::vector<int32_t>> texts(1001);
  for (size_t i = 0; i < texts.size(); ++i)
    for (int32_t t = 0; t < 5; ++t) texts[i].push_back(static_cast<int32_t>(i) * 10 + t);
  const GroupedTextsDataset ds(texts.size(), [&](size_t i) { return std::span<const int32_t>(texts[i]); }, 4, "t.txt");
  ASSERT_EQ(ds.size(), 1251u);
  EXPECT_EQ(ds.lengths(), std::vector<int64_t>(1251, 4));
  HostBatch hb;
  hb.resize(3, 4);
  for (int64_t row = 0; row < 3; ++row) ds.get(std::vector<size_t>{0, 1249, 1250}[static_cast<size_t>(row)], hb, row);
  // Block 1249 is the first group's last: text 999's tokens 1..4; block 1250 text 1000's first four.
  EXPECT_EQ(hb.input_ids, (std::vector<int32_t>{0, 1, 2, 3, 9991, 9992, 9993, 9994, 10000, 10001, 10002, 10003}));
  EXPECT_EQ(hb.attention_mask, std::vector<int32_t>(12, 1));
  EXPECT_EQ(hb.token_type_ids, std::vector<int32_t>(12, 0));
  // Texts too short for one block are refused, naming the file and the way out.
  const std::vector<int32_t> two{1, 2};
  try {
    GroupedTextsDataset(1, [&](size_t) { return std::span<const int32_t>(two); }, 4, "short.txt");
    ADD_FAILURE() << "no block was refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("short.txt: its texts hold fewer tokens than one block of --max-seq-length 4"),
              std::string::npos) << e.what();
  }
}

// A .txt file for --task mlm, grouped: every line is a text (a blank one too: its [CLS] [SEP], as
// the datasets text loader and the tokenizer give it), joined and cut; --line-by-line keeps a
// sample per non-empty line. Through the trainer's data loading, counted from the tokenizer.
TEST(MaskedLmGroupedTexts, ATextFilesLinesAreJoinedAsRunMlmJoinsThem) {
  const auto tok = Tokenizer::from_directory(std::string(ANATOMY_SOURCE_DIR) + "/tests/fixtures/models/roberta");
  const std::string dir = fresh_dir("mlm_grouped_lines");
  const std::vector<std::string> lines = {"the film was good", "", "a very long and boring film indeed", "   ", "ok"};
  {
    std::ofstream out(dir + "/t.txt");
    for (const std::string& l : lines) out << l << "\n";
  }
  size_t tokens = 0;
  for (const std::string& l : lines) tokens += tok.encode(l, std::nullopt, 0, Truncation::None, Padding::None).input_ids.size();
  for (bool line_by_line : {false, true}) {
    TrainOptions o = task_options("mlm", std::string(ANATOMY_SOURCE_DIR) + "/tests/fixtures/models/roberta", dir + "/t.txt",
                                  line_by_line ? "mlm_lines_on" : "mlm_lines_off");
    o.seq_len = 8;
    o.line_by_line = line_by_line;
    BertConfig cfg = model_config(o);
    const TrainData d = load_train_data(o, cfg);
    EXPECT_EQ(d.train->size(), line_by_line ? 3u : tokens / 8) << tokens;
    if (!line_by_line) {
      EXPECT_EQ(d.train_lengths, std::vector<int64_t>(tokens / 8, 8));
    }
  }
  // --validation-split splits the texts and groups each side (a block never mixes the two).
  {
    std::ofstream out(dir + "/many.txt");
    for (int i = 0; i < 40; ++i) out << "text number " << i << " of the film was good\n";
  }
  TrainOptions s = task_options("mlm", std::string(ANATOMY_SOURCE_DIR) + "/tests/fixtures/models/roberta", dir + "/many.txt",
                                "mlm_grouped_split");
  s.seq_len = 8;
  s.line_by_line = false;
  s.validation_split = 0.25;
  BertConfig scfg = model_config(s);
  const TrainData sd = load_train_data(s, scfg);
  std::vector<size_t> per_text;
  {
    std::ifstream in(dir + "/many.txt");
    for (std::string l; std::getline(in, l);)
      per_text.push_back(tok.encode(l, std::nullopt, 0, Truncation::None, Padding::None).input_ids.size());
  }
  const TrainValSplit sp = split(per_text.size(), 0.25, s.seed);
  size_t train_tokens = 0, val_tokens = 0;
  for (size_t i : sp.train) train_tokens += per_text[i];
  for (size_t i : sp.val) val_tokens += per_text[i];
  EXPECT_EQ(sd.train->size(), train_tokens / 8);
  ASSERT_TRUE(sd.validation);
  EXPECT_EQ(sd.validation->size(), val_tokens / 8);
  // --line-by-line drops empty and blank records as run_mlm.py does (not line.isspace(): an
  // ideographic space too), from JSON Lines as from a .txt file.
  {
    std::ofstream out(dir + "/t.jsonl");
    for (const char* t : {"the film was good", "", "   ", "\\u3000", "ok", "a very long and boring film"})
      out << "{\"text\": \"" << t << "\"}\n";
  }
  TrainOptions o = task_options("mlm", std::string(ANATOMY_SOURCE_DIR) + "/tests/fixtures/models/roberta", dir + "/t.jsonl",
                                "mlm_lines_json");
  o.line_by_line = true;
  BertConfig cfg = model_config(o);
  const TrainData d = load_train_data(o, cfg);
  EXPECT_EQ(d.train->size(), 3u);
  EXPECT_EQ(d.train_lengths.size(), 3u);
}

// Note [run_mlm.py's validation head]: without a validation file the first N% of the rows
// validate, the rest train, as the datasets library (5.2, tests/fixtures/make_run_mlm_split.py)
// reads and splits a .txt file (its lines end at \n, \r\n, \r only) and a JSON Lines file:
// 59 rows at 5% validate 3 (2.95 rounded), 50 rows at 5% validate 2 (2.5 rounded to even).
// --line-by-line drops each side's blank rows after the split; grouped, each side is grouped alone.
TEST(MaskedLmValidationHead, TheFirstRowsValidateAsTheDatasetsLibrarySplitsThem) {
  const std::string roberta = std::string(ANATOMY_SOURCE_DIR) + "/tests/fixtures/models/roberta";
  const std::string dir = std::string(ANATOMY_SOURCE_DIR) + "/tests/data/run_mlm_split";
  const auto tok = Tokenizer::from_directory(roberta);
  const json want = json::parse(read_regular_file(dir + "/expected.json"));
  ASSERT_EQ(want["cases"].size(), 6u);
  const std::string cache = fresh_dir("mlm_head_cache");
  for (const json& c : want["cases"]) {
    for (bool line_by_line : {true, false}) {
      const int64_t len = line_by_line ? 16 : 8;
      // What the texts of one side make: a sample per non-blank text, or blocks of the joined texts.
      const auto side = [&](const json& texts) {
        std::vector<int64_t> lengths;
        size_t tokens = 0;
        for (const std::string t : texts) {
          const size_t n = tok.encode(t, std::nullopt, line_by_line ? static_cast<size_t>(len) : 0,
                                      line_by_line ? Truncation::LongestFirst : Truncation::None, Padding::None)
                               .input_ids.size();
          tokens += n;
          if (!unicode::is_blank_text(t)) lengths.push_back(static_cast<int64_t>(n));
        }
        return line_by_line ? lengths : std::vector<int64_t>(tokens / static_cast<size_t>(len), len);
      };
      const std::string name = c["file"].get<std::string>() + " " + std::to_string(c["percentage"].get<int>()) +
                               (line_by_line ? " line by line" : " grouped");
      TrainOptions o = task_options("mlm", roberta, dir + "/" + c["file"].get<std::string>(), "mlm_head");
      o.validation_split_percentage = c["percentage"].get<int>();
      o.line_by_line = line_by_line;
      o.seq_len = len;
      o.dataset_cache_dir = cache;
      BertConfig cfg = model_config(o);
      const TrainData d = load_train_data(o, cfg);
      const std::vector<int64_t> val = side(c["validation"]), train = side(c["train"]);
      EXPECT_EQ(d.train_lengths, train) << name;
      EXPECT_EQ(d.train->size(), train.size()) << name;
      if (val.empty()) {
        EXPECT_FALSE(d.validation) << name;
        EXPECT_NE(d.description.find("no validation (the first"), std::string::npos) << d.description;
        continue;
      }
      ASSERT_TRUE(d.validation) << name;
      EXPECT_EQ(d.validation->size(), val.size()) << name;
      EXPECT_EQ(d.validation_lengths, val) << name;
      EXPECT_NE(d.description.find(str_cat("the first ", c["percentage"].get<int>(), "% of its rows")), std::string::npos)
          << d.description;
    }
  }
  // A head that takes every row leaves nothing to train on: refused naming the flag (99% of 50
  // rows is 49.5, rounded to 50).
  TrainOptions all = task_options("mlm", roberta, dir + "/records.jsonl", "mlm_head_all");
  all.validation_split_percentage = 99;
  all.line_by_line = false;
  all.seq_len = 8;
  all.dataset_cache_dir = cache;
  BertConfig cfg = model_config(all);
  try {
    load_train_data(all, cfg);
    ADD_FAILURE() << "a validation head of every row was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--validation-split-percentage 99: the first 50 of --train-file"),
              std::string::npos) << e.what();
  }
}

// Note [prefix space for words]: RoBERTa's tagged words are tokenized with a space before each,
// as run_ner.py loads its tokenizer (add_prefix_space=True), not as the start of a text.
TEST(TokenTagWords, RobertaWordsAreTokenizedAsRunNerTokenizesThem) {
  const std::string roberta = std::string(ANATOMY_SOURCE_DIR) + "/tests/fixtures/models/roberta";
  const std::string data = write_tagged(fresh_dir("ner_prefix_data") + "/train.jsonl", 4, 0);
  TrainOptions o = task_options("token-classification", roberta, data, "ner_prefix");
  BertConfig cfg = model_config(o);
  const TrainData d = load_train_data(o, cfg);
  const Tokenizer tok = Tokenizer::from_directory(roberta);
  const std::vector<std::string> words{"John", "visited", "Paris"};  // write_tagged's first sentence
  const std::vector<int32_t> want = tok.with_prefix_space().encode_split_words(words, 32, Truncation::LongestFirst,
                                                                              Padding::None).encoding.input_ids;
  ASSERT_NE(want, tok.encode_split_words(words, 32, Truncation::LongestFirst, Padding::None).encoding.input_ids);
  HostBatch hb;
  hb.resize(1, 32);
  d.train->get(0, hb, 0);
  EXPECT_EQ(std::vector<int32_t>(hb.input_ids.begin(), hb.input_ids.begin() + static_cast<std::ptrdiff_t>(want.size())), want);
}

// Three epochs of --task mlm with a checkpoint inside the second; resumed from it, the run logs
// the same losses and ends with the same weights, bit for bit, as the uninterrupted run: the
// masks of the epochs after the checkpoint are those the uninterrupted run drew.
TEST(MaskedLmEpochs, ResumeReproducesTheUninterruptedRun) {
  const std::string model = dropout_free_roberta("mlm_resume_model");
  const std::string data = fresh_dir("mlm_resume_data") + "/text.jsonl";
  {
    std::ifstream in(kSentiment);
    std::ofstream out(data);
    std::string line;
    for (int i = 0; i < 40 && std::getline(in, line); ++i) out << line << "\n";
  }
  auto opts = [&](const std::string& out) {
    TrainOptions o = task_options("mlm", model, data, out);
    o.per_device_train_batch_size = 8;  // 5 steps an epoch
    o.num_train_epochs = 3;
    o.learning_rate = 1e-3f;
    o.checkpoint_strategy = Cadence::Steps;
    o.save_steps = 7;
    return o;
  };
  const TrainOptions full = opts("mlm_resume_full");
  train(full);
  const auto ref = loss_curve(full.output_dir);
  ASSERT_EQ(ref.size(), 15u);
  ASSERT_TRUE(fs::is_directory(full.output_dir + "/checkpoint-7"));

  TrainOptions resumed = opts("mlm_resume_second");
  resumed.resume_from_checkpoint = full.output_dir + "/checkpoint-7";
  train(resumed);
  const auto got = loss_curve(resumed.output_dir);
  for (int64_t s = 8; s <= 15; ++s) {
    ASSERT_TRUE(got.count(s)) << "step " << s;
    EXPECT_EQ(got.at(s), ref.at(s)) << "step " << s;
  }
  EXPECT_EQ(max_abs_diff(saved_weights(full.output_dir), saved_weights(resumed.output_dir)), 0.0);
}

namespace {

struct Case {
  const char* what;
  int64_t batch, accum;
  int world;
};
const std::vector<Case> kBigBatchCases{
    {"one rank, batch 8", 8, 1, 1}, {"batch 4, accumulation 2", 4, 2, 1}, {"two ranks of 4", 4, 1, 2}};

// One rank with batch 2B, one rank with B and 2 accumulation steps, two ranks with B: the same
// logged losses and the same weights after `steps` steps, up to the order of fp32 sums.
// `model`: the directory to train from (default: dropout_free_roberta).
void expect_big_batch_equivalence(const std::string& task, const std::string& data, const std::string& name,
                                  const std::vector<Case>& cases = kBigBatchCases, int64_t steps = 3,
                                  std::string model = "") {
  if (model.empty()) model = dropout_free_roberta(name + "_model");
  std::vector<std::string> dirs;
  for (const Case& c : cases) {
    TrainOptions o = task_options(task, model, data, name + "_" + std::to_string(dirs.size()));
    o.per_device_train_batch_size = c.batch;
    o.gradient_accumulation_steps = c.accum;
    o.nproc_per_node = c.world;
    o.max_steps = steps;
    train(o);
    dirs.push_back(o.output_dir);
  }
  const auto ref = loss_curve(dirs[0]);
  ASSERT_EQ(ref.size(), static_cast<size_t>(steps));
  for (size_t k = 1; k < dirs.size(); ++k) {
    SCOPED_TRACE(cases[k].what);
    const auto got = loss_curve(dirs[k]);
    ASSERT_EQ(got.size(), ref.size());
    for (const auto& [step, loss] : ref) EXPECT_NEAR(got.at(step), loss, 2e-6 * loss) << "step " << step;
    EXPECT_LT(max_abs_diff(saved_weights(dirs[0]), saved_weights(dirs[k])), 2e-6);
  }
}

}  // namespace

TEST(TokenLossPerStep, MaskedLmAccumulationAndRanksEqualOneBigBatch) {
  expect_big_batch_equivalence("mlm", kSentiment, "mlm_norm");
}

TEST(TokenLossPerStep, TokenClassificationAccumulationAndRanksEqualOneBigBatch) {
  const std::string data = write_tagged(fresh_dir("ner_norm_data") + "/train.jsonl", 48, 0);
  expect_big_batch_equivalence("token-classification", data, "ner_norm");
}

// ModernBERT's per-token heads (Note [modernbert token head] in model/modernbert.cpp) alike.
TEST(TokenLossPerStep, ModernBertAccumulationAndRanksEqualOneBigBatch) {
  expect_big_batch_equivalence("mlm", kSentiment, "mb_mlm_norm", kBigBatchCases, 3,
                               tiny_modernbert("mb_mlm_norm_model", "modernbert-mlm"));
  const std::string data = write_tagged(fresh_dir("mb_ner_norm_data") + "/train.jsonl", 48, 0);
  expect_big_batch_equivalence("token-classification", data, "mb_ner_norm", kBigBatchCases, 3,
                               tiny_modernbert("mb_ner_norm_model", "modernbert-ner"));
}

// 44 sentences: the epoch's sixth batch holds 4, all on rank 0 (rank 1 runs a row of weight 0
// and counts no token of it).
TEST(TokenLossPerStep, TokenClassificationPartialLastBatchOverRanks) {
  const std::string data = write_tagged(fresh_dir("ner_norm_tail_data") + "/train.jsonl", 44, 1);
  expect_big_batch_equivalence("token-classification", data, "ner_norm_tail", {kBigBatchCases[0], kBigBatchCases[2]}, 6);
}

namespace {

// One rank with batch 6 and two ranks of 3 train alike (above); evaluated on 25 validation
// samples (13 on rank 0, 12 on rank 1), the whole set's metrics come out the same.
void expect_two_rank_evaluation_like_one(const std::string& task, const std::string& train_file,
                                         const std::string& validation_file, const std::string& name,
                                         const std::vector<std::string>& keys) {
  const std::string model = dropout_free_roberta(name + "_model");
  std::vector<json> results;
  for (int world : {1, 2, 3}) {
    TrainOptions o = task_options(task, model, train_file, name + "_w" + std::to_string(world));
    o.validation_file = validation_file;
    o.per_device_train_batch_size = 6 / world;
    o.per_device_eval_batch_size = 4;
    o.nproc_per_node = world;
    o.max_steps = 2;
    train(o);
    // The last evaluation as metrics.jsonl logs it (with the token counts), which must carry the
    // metrics as eval_results.json does.
    json logged;
    std::ifstream metrics(o.output_dir + "/metrics.jsonl");
    for (std::string line; std::getline(metrics, line);)
      if (json j = json::parse(line); j.contains("eval_samples")) logged = j;
    const json file = json::parse(read_regular_file(o.output_dir + "/eval_results.json"));
    for (const std::string& k : keys) EXPECT_EQ(logged.value(k, json()), file.value(k, json())) << k << " at " << world;
    results.push_back(logged);
  }
  for (size_t w = 1; w < results.size(); ++w) {
    SCOPED_TRACE(results[0].dump() + "\n" + results[w].dump());
    EXPECT_EQ(results[w].at("eval_samples"), results[0].at("eval_samples"));
    // The whole set's counts, not rank 0's share (a rank may hold no sample at all).
    EXPECT_EQ(results[w].at("eval_tokens"), results[0].at("eval_tokens"));
    EXPECT_EQ(results[w].at("eval_skip_padding"), results[0].at("eval_skip_padding"));
    for (const std::string& k : keys) {
      ASSERT_TRUE(results[0].contains(k) && results[w].contains(k)) << k;
      const double a = results[0].at(k).get<double>(), b = results[w].at(k).get<double>();
      EXPECT_NEAR(b, a, 1e-5 * std::max(1.0, std::abs(a))) << k;
    }
  }
}

// {dir}/train.jsonl: the sentiment file's first `train` lines; {dir}/val.jsonl: the next `val`.
std::string split_sentiment(const std::string& name, int train, int val) {
  const std::string dir = fresh_dir(name);
  std::ifstream in(kSentiment);
  std::ofstream train_out(dir + "/train.jsonl"), val_out(dir + "/val.jsonl");
  std::string line;
  for (int i = 0; i < train + val && std::getline(in, line); ++i) (i < train ? train_out : val_out) << line << "\n";
  return dir;
}

}  // namespace

TEST(TokenEvaluationRanks, MaskedLmOverTwoRanksEqualsOne) {
  const std::string dir = split_sentiment("mlm_eval_ranks_data", 24, 25);
  expect_two_rank_evaluation_like_one("mlm", dir + "/train.jsonl", dir + "/val.jsonl", "mlm_eval_ranks",
                                      {"eval_loss", "perplexity"});
}

// Fewer validation samples than ranks (one, at two and three ranks): rank 0 evaluates none, and
// the metrics are still the whole set's (they were left out of the log and the results).
TEST(TokenEvaluationRanks, OneValidationSampleOverThreeRanksEqualsOne) {
  const std::string dir = split_sentiment("one_eval_ranks_data", 24, 1);
  expect_two_rank_evaluation_like_one("text-classification", dir + "/train.jsonl", dir + "/val.jsonl", "one_eval_ranks",
                                      {"eval_loss", "eval_accuracy", "eval_macro_f1"});
  expect_two_rank_evaluation_like_one("token-classification", write_tagged(dir + "/ner_train.jsonl", 24, 0),
                                      write_tagged(dir + "/ner_dev.jsonl", 1, 3), "one_eval_ranks_ner",
                                      {"eval_loss", "eval_f1", "eval_accuracy"});
}

TEST(TokenEvaluationRanks, TokenClassificationOverTwoRanksEqualsOne) {
  const std::string dir = fresh_dir("ner_eval_ranks_data");
  const std::string train = write_tagged(dir + "/train.jsonl", 24, 0), dev = write_tagged(dir + "/dev.jsonl", 25, 3);
  expect_two_rank_evaluation_like_one("token-classification", train, dev, "ner_eval_ranks",
                                      {"eval_loss", "eval_precision", "eval_recall", "eval_f1", "eval_accuracy"});
}
