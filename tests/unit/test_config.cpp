#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "model/config.h"
#include "model/heads.h"
#include "model/params.h"

using namespace anatomy;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

class ConfigTest : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    // "bert" in the path: the configs written here without model_type are BERT's (see
    // ModelTypeComesFromThePathOrIsRefused).
    m_dir = fs::path(testing::TempDir()) /
            ("anatomy_bert_cfg_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(m_dir);
    fs::create_directories(m_dir);
  }
  void TearDown() override { fs::remove_all(m_dir); }

  std::string write(const std::string& name, const std::string& text) {
    std::string p = (m_dir / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

  // Loading `text` must fail with a one-line error naming the file and containing `needle`.
  void expect_bad(const std::string& text, const std::string& needle) {
    std::string p = write("config.json", text);
    try {
      BertConfig::from_json_file(p);
      ADD_FAILURE() << "expected an error for " << text;
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_EQ(m.rfind(p + ": ", 0), 0u) << m;
      EXPECT_NE(m.find(needle), std::string::npos) << "wanted '" << needle << "' in: " << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
  }

  fs::path m_dir;
};

// bert-base-uncased's config.json from the Hugging Face hub.
const char* kBertBaseUncased = R"({
  "architectures": ["BertForMaskedLM"],
  "attention_probs_dropout_prob": 0.1,
  "gradient_checkpointing": false,
  "hidden_act": "gelu",
  "hidden_dropout_prob": 0.1,
  "hidden_size": 768,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "layer_norm_eps": 1e-12,
  "max_position_embeddings": 512,
  "model_type": "bert",
  "num_attention_heads": 12,
  "num_hidden_layers": 12,
  "pad_token_id": 0,
  "position_embedding_type": "absolute",
  "transformers_version": "4.6.0.dev0",
  "type_vocab_size": 2,
  "use_cache": true,
  "vocab_size": 30522
})";

}  // namespace

TEST_F(ConfigTest, DefaultsAreHuggingFaceDefaults) {
  BertConfig c;
  EXPECT_EQ(c.vocab_size, 30522);
  EXPECT_EQ(c.hidden_size, 768);
  EXPECT_EQ(c.num_hidden_layers, 12);
  EXPECT_EQ(c.num_attention_heads, 12);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.hidden_act, "gelu");
  EXPECT_EQ(c.hidden_dropout_prob, 0.1);
  EXPECT_EQ(c.attention_probs_dropout_prob, 0.1);
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_EQ(c.type_vocab_size, 2);
  EXPECT_EQ(c.initializer_range, 0.02);
  EXPECT_EQ(c.layer_norm_eps, 1e-12);
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_EQ(c.num_labels, 2);
  EXPECT_EQ(c.id2label.at(1), "LABEL_1");
  EXPECT_EQ(c.label2id.at("LABEL_0"), 0);
  EXPECT_FALSE(c.problem_type);
  EXPECT_EQ(c.head_dim(), 64);
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(BertConfig::preset("bert-base"), c);
}

TEST_F(ConfigTest, PresetsAndParameterCounts) {
  BertConfig tiny = BertConfig::preset("bert-tiny");
  EXPECT_EQ(tiny.num_hidden_layers, 2);
  EXPECT_EQ(tiny.hidden_size, 128);
  EXPECT_EQ(tiny.num_attention_heads, 2);
  EXPECT_EQ(tiny.intermediate_size, 512);
  EXPECT_EQ(tiny.vocab_size, 30522);
  EXPECT_EQ(tiny.max_position_embeddings, 512);
  BertConfig mini = BertConfig::preset("bert-mini");
  EXPECT_EQ(mini.num_hidden_layers, 4);
  EXPECT_EQ(mini.hidden_size, 256);
  EXPECT_EQ(mini.num_attention_heads, 4);
  EXPECT_EQ(mini.intermediate_size, 1024);
  BertConfig large = BertConfig::preset("bert-large");
  EXPECT_EQ(large.num_hidden_layers, 24);
  EXPECT_EQ(large.hidden_size, 1024);
  EXPECT_EQ(large.num_attention_heads, 16);
  EXPECT_EQ(large.intermediate_size, 4096);
  EXPECT_EQ(large.head_dim(), 64);

  // By hand, bert-base with 2 labels:
  //   embeddings (30522 + 512 + 2) * 768 + 2*768            = 23,837,184
  //   per layer  4*(768*768+768) + 2*768                     =  2,363,904
  //            + (768*3072+3072) + (3072*768+768) + 2*768    =  4,723,968  -> 7,087,872 x 12 = 85,054,464
  //   pooler 768*768+768 = 590,592; classifier 768*2+2 = 1,538
  //   total 109,483,778 (transformers' BertForSequenceClassification("bert-base-uncased")).
  EXPECT_EQ(BertConfig::preset("bert-base").num_parameters(), 109483778);
  // bert-large: 31,782,912 + 24 * 12,596,224 + 1,049,600 + 2,050 = 335,143,938.
  EXPECT_EQ(large.num_parameters(), 335143938);
  // bert-tiny: 3,972,864 + 2 * 198,272 + 16,512 + 258 = 4,386,178.
  EXPECT_EQ(tiny.num_parameters(), 4386178);
  BertConfig three = tiny;
  three.set_num_labels(3);
  EXPECT_EQ(three.num_parameters(), tiny.num_parameters() + 128 + 1);

  for (const auto& n : BertConfig::preset_names()) EXPECT_NO_THROW(BertConfig::preset(n).validate(n));
  try {
    BertConfig::preset("bert-huge");
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("bert-huge"), std::string::npos) << m;
    EXPECT_NE(m.find("bert-tiny, bert-mini, bert-base, bert-large"), std::string::npos) << m;
  }
}

TEST_F(ConfigTest, LoadsTheHubConfigOfBertBaseUncased) {
  BertConfig c = BertConfig::from_json_file(write("config.json", kBertBaseUncased));
  BertConfig expect;
  expect.architectures = {"BertForMaskedLM"};
  EXPECT_EQ(c, expect);
}

TEST_F(ConfigTest, ToJsonIsWhatTransformersExpects) {
  BertConfig c = BertConfig::preset("bert-tiny");
  json j = c.to_json();
  EXPECT_EQ(j["model_type"], "bert");
  EXPECT_EQ(j["architectures"], json::array({"BertForSequenceClassification"}));
  EXPECT_EQ(j["id2label"], json({{"0", "LABEL_0"}, {"1", "LABEL_1"}}));
  EXPECT_EQ(j["label2id"], json({{"LABEL_0", 0}, {"LABEL_1", 1}}));
  EXPECT_EQ(j["torch_dtype"], "float32");
  EXPECT_EQ(j["hidden_size"], 128);
  EXPECT_EQ(j["layer_norm_eps"], 1e-12);
  EXPECT_TRUE(j["hidden_size"].is_number_integer());
  EXPECT_TRUE(j["classifier_dropout"].is_null());
  EXPECT_FALSE(j.contains("problem_type"));
  EXPECT_FALSE(j.contains("num_labels"));  // transformers derives it from id2label
}

TEST_F(ConfigTest, SaveLoadRoundTrip) {
  BertConfig c = BertConfig::preset("bert-mini");
  c.id2label = {{0, "negative"}, {1, "neutral"}, {2, "positive"}};
  c.label2id = {{"negative", 0}, {"neutral", 1}, {"positive", 2}};
  c.num_labels = 3;
  c.problem_type = "single_label_classification";
  c.classifier_dropout = 0.25;
  c.hidden_dropout_prob = 0.05;
  c.vocab_size = 1000;
  c.pad_token_id = 1;
  const std::string p = (m_dir / "config.json").string();
  c.save(p);
  BertConfig back = BertConfig::from_json_file(p);
  EXPECT_EQ(back, c);
  EXPECT_EQ(back.to_json(), c.to_json());
  // Saving over an existing file replaces it, leaving no temporary behind.
  BertConfig::preset("bert-tiny").save(p);
  EXPECT_EQ(BertConfig::from_json_file(p), BertConfig::preset("bert-tiny"));
  EXPECT_EQ(std::distance(fs::directory_iterator(m_dir), fs::directory_iterator()), 1);
}

TEST_F(ConfigTest, LabelsFollowTransformers) {
  // num_labels alone: LABEL_i names.
  BertConfig a = BertConfig::from_json(json{{"num_labels", 5}}, "a.json");
  EXPECT_EQ(a.num_labels, 5);
  EXPECT_EQ(a.id2label.at(4), "LABEL_4");
  EXPECT_EQ(a.label2id.at("LABEL_4"), 4);
  // id2label decides num_labels, even against a disagreeing num_labels; label2id is derived.
  BertConfig b = BertConfig::from_json(json{{"num_labels", 7}, {"id2label", {{"0", "neg"}, {"1", "pos"}, {"2", "mid"}}}},
                                       "b.json");
  EXPECT_EQ(b.num_labels, 3);
  EXPECT_EQ(b.label2id.at("mid"), 2);
  // run_glue.py writes boolean labels' id2label values as booleans: named as Python prints them.
  BertConfig bools = BertConfig::from_json(json{{"id2label", {{"0", false}, {"1", true}}}}, "bools.json");
  EXPECT_EQ(bools.id2label.at(1), "True");
  // Regression with one label.
  BertConfig r = BertConfig::from_json(json{{"num_labels", 1}, {"problem_type", "regression"}}, "r.json");
  EXPECT_EQ(r.num_labels, 1);
  EXPECT_EQ(*r.problem_type, "regression");
  EXPECT_FALSE(BertConfig::from_json(json{{"problem_type", nullptr}}, "n.json").problem_type);
  // run_glue.py on integer labels 1..3 writes them as numbers: their text names the classes.
  BertConfig g = BertConfig::from_json(json{{"id2label", {{"0", 1}, {"1", 2}, {"2", 3}}}, {"label2id", {{"1", 0}, {"2", 1}, {"3", 2}}}},
                                       "g.json");
  EXPECT_EQ(g.num_labels, 3);
  EXPECT_EQ(g.id2label.at(0), "1");
  EXPECT_EQ(g.label2id.at("3"), 2);
}

// transformers' AutoConfig: without model_type, the longest model type the path names; none: refused.
TEST_F(ConfigTest, ModelTypeComesFromThePathOrIsRefused) {
  const fs::path plain = fs::path(testing::TempDir()) / ("anatomy_no_type_" + std::to_string(::getpid()));
  fs::create_directories(plain / "my-distilbert-run");
  const std::string distil = R"({"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64, "vocab_size": 100})";
  std::ofstream(plain / "config.json") << distil;
  std::ofstream(plain / "my-distilbert-run" / "config.json") << distil;
  const std::string p = (plain / "config.json").string();
  try {
    BertConfig::from_json_file(p);
    ADD_FAILURE() << "a config without model_type in a path naming none was read";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(p + ": has no model_type and its directory's name names no model type", 0), 0u)
        << e.what();
  }
  // A Hub cache snapshot: the repository's name counts, not the directories above the cache.
  const fs::path snap = plain / "roberta_home" / "hub" / "models--google--bert_uncased_L-2" / "snapshots" / "0123abc";
  fs::create_directories(snap);
  std::ofstream(snap / "config.json") << R"({"hidden_size": 64, "num_attention_heads": 2})";
  EXPECT_EQ(BertConfig::from_json_file((snap / "config.json").string()).architecture, Architecture::Bert);
  // A family whose name holds a supported one's is refused, not read as BERT.
  fs::create_directories(plain / "albert-base-v2");
  std::ofstream(plain / "albert-base-v2" / "config.json") << R"({"hidden_size": 64, "num_attention_heads": 2})";
  try {
    BertConfig::from_json_file((plain / "albert-base-v2" / "config.json").string());
    ADD_FAILURE() << "an ALBERT directory was read as BERT";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model_type 'albert' is not supported"), std::string::npos) << e.what();
  }
  const BertConfig d = BertConfig::from_json_file((plain / "my-distilbert-run" / "config.json").string());
  EXPECT_EQ(d.architecture, Architecture::DistilBert);
  EXPECT_EQ(d.hidden_size, 32);
  EXPECT_EQ(d.num_hidden_layers, 2);
  EXPECT_EQ(BertConfig::from_json_file(write("config.json", R"({"hidden_size": 64, "num_attention_heads": 2})")).architecture,
            Architecture::Bert);
  fs::remove_all(plain);
}

// tie_word_embeddings false is kept through a save, and refused only where the decoder is read.
TEST_F(ConfigTest, AnUntiedMaskedLmDecoderIsRefusedOnlyForMaskedLm) {
  BertConfig c = BertConfig::from_json_file(write("config.json", R"({"tie_word_embeddings": false})"));
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.to_json().at("tie_word_embeddings"), false);
  EXPECT_FALSE(BertConfig::preset("bert-tiny").to_json().contains("tie_word_embeddings"));  // the default, as before
  c.architectures = {"BertForSequenceClassification"};
  check_masked_lm_decoder(c, "c.json");  // the classifier never reads the decoder
  c.architectures = {"BertForMaskedLM"};
  try {
    check_masked_lm_decoder(c, "c.json");
    ADD_FAILURE() << "an untied masked-LM decoder was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("c.json: tie_word_embeddings false: a masked-LM decoder of its own", 0), 0u)
        << e.what();
  }
}

TEST_F(ConfigTest, BadConfigsAreOneLineErrors) {
  try {
    BertConfig::from_json_file((m_dir / "nope" / "config.json").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json: cannot open"), std::string::npos) << e.what();
  }
  expect_bad("", "not valid JSON at byte");
  expect_bad("{\"hidden_size\": 768,\n \"x\": }", "not valid JSON at byte 28");
  expect_bad("[768]", "must be a JSON object");
  expect_bad(R"({"hidden_size": "768"})", "field 'hidden_size' must be a positive integer");
  expect_bad(R"({"hidden_size": 768.0})", "field 'hidden_size' must be a positive integer");
  expect_bad(R"({"hidden_size": -768})", "field 'hidden_size' must be a positive integer");
  expect_bad(R"({"num_hidden_layers": 0})", "field 'num_hidden_layers' must be a positive integer");
  expect_bad(R"({"vocab_size": 18446744073709551615})", "field 'vocab_size' must be a positive integer");
  expect_bad(R"({"num_attention_heads": true})", "field 'num_attention_heads'");
  expect_bad(R"({"hidden_size": 100})", "hidden_size 100 is not a multiple of num_attention_heads 12");
  expect_bad(R"({"hidden_dropout_prob": 1.0})", "field 'hidden_dropout_prob' must be a probability in [0, 1)");
  expect_bad(R"({"attention_probs_dropout_prob": -0.1})", "field 'attention_probs_dropout_prob'");
  expect_bad(R"({"classifier_dropout": 2})", "field 'classifier_dropout'");
  expect_bad(R"({"hidden_dropout_prob": "0.1"})", "field 'hidden_dropout_prob' must be a number");
  expect_bad(R"({"hidden_act": "gelu_new"})", "hidden_act 'gelu_new' is not supported");
  expect_bad(R"({"hidden_act": "relu"})", "only \"gelu\"");
  expect_bad(R"({"position_embedding_type": "relative_key"})", "position_embedding_type");
  expect_bad(R"({"model_type": "gpt2"})", "model_type 'gpt2'");
  expect_bad(R"({"model_type": "modernbert", "hidden_size": 24, "num_attention_heads": 8})", "is odd");
  expect_bad(R"({"model_type": "modernbert", "layer_types": ["full_attention"]})", "layer_types");
  expect_bad(R"({"model_type": "modernbert", "classifier_pooling": "max"})", "classifier_pooling 'max'");
  expect_bad(R"({"model_type": "modernbert", "mlp_dropout": 0.1})", "dropout");
  expect_bad(R"({"model_type": "distilbert", "sinusoidal_pos_embds": true})", "sinusoidal_pos_embds");
  expect_bad(R"({"model_type": "electra", "embedding_size": 300, "hidden_size": 256, "num_attention_heads": 4})", "embedding_size 300");
  expect_bad(R"({"model_type": "roberta", "max_position_embeddings": 2})", "leaves no position");
  expect_bad(R"({"layer_norm_eps": 0})", "field 'layer_norm_eps'");
  expect_bad(R"({"pad_token_id": 30522})", "field 'pad_token_id'");
  expect_bad(R"({"num_labels": 0})", "field 'num_labels' must be a positive integer");
  expect_bad(R"({"id2label": {"0": "a", "2": "b"}})", "1 is missing");
  expect_bad(R"({"id2label": {"x": "a"}})", "field 'id2label' keys must be non-negative integers");
  expect_bad(R"({"id2label": {"0": 5.5}})", "field 'id2label' values must be strings, integers or booleans");
  expect_bad(R"({"id2label": {"0": "a", "00": "b"}})", "has the id 0 twice");
  expect_bad(R"({"label2id": {"a": "0"}})", "field 'label2id' values");
  expect_bad(R"({"problem_type": "ranking"})", "problem_type 'ranking'");
  expect_bad(R"({"architectures": "BertModel"})", "field 'architectures'");
  expect_bad(R"({"tie_word_embeddings": 0})", "field 'tie_word_embeddings' must be true or false");

  BertConfig c;
  c.num_attention_heads = 5;
  try {
    c.validate("my.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "my.json: hidden_size 768 is not a multiple of num_attention_heads 5");
  }
}

// The fused attention input reads q|k|v as one [3H, H] matrix and one [3H] bias: whatever the
// hidden size (36 and 6 leave the 8-element alignment), the key and value parameters follow the
// query's with no gap, while every other parameter starts aligned.
TEST(ParamLayoutTest, QueryKeyValueAreOneBlockForAnyHiddenSize) {
  for (int64_t H : {36, 6, 64}) {
    anatomy::BertConfig c = anatomy::BertConfig::preset("bert-tiny");
    c.hidden_size = H;
    c.num_attention_heads = 3 * (H % 3 == 0) + 2 * (H % 3 != 0);
    c.intermediate_size = 4 * H;
    const anatomy::ParamLayout lay = anatomy::ParamLayout::for_sequence_classification(c);
    for (const char* part : {"weight", "bias"}) {
      const std::string base = "bert.encoder.layer.1.attention.self.";
      const auto& q = lay.get(base + "query." + part);
      const size_t n = static_cast<size_t>(q.shape.numel());
      EXPECT_EQ(lay.get(base + "key." + part).offset, q.offset + n) << "H " << H << " " << part;
      EXPECT_EQ(lay.get(base + "value." + part).offset, q.offset + 2 * n) << "H " << H << " " << part;
    }
    for (const auto& p : lay.params()) {
      if (p.name.find(".key.") == std::string::npos && p.name.find(".value.") == std::string::npos) {
        EXPECT_EQ(p.offset % 8, 0u) << p.name;
      }
    }
  }
}
