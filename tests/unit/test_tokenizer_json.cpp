// BPE and Unigram tokenizer.json files against the tokenizers package: every line of the corpus
// and every truncated pair that tests/fixtures/make_tokenizers.py recorded, then the directory
// factory and the errors.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "../common/dirs.h"
#include "core/error.h"
#include "data/text_dataset.h"
#include "data/tokenizer.h"
#include "data/tokenizer_json.h"
#include "io/read_file.h"
#include "train/checkpoints.h"

using namespace anatomy;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(ANATOMY_SOURCE_DIR) / "tests/fixtures/tokenizers";

std::string gunzip(const fs::path& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open " + path.string());
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  gzclose(f);
  if (n < 0) throw std::runtime_error("cannot read " + path.string());
  return out;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i < s.size() && s[i] != sep) continue;
    out.push_back(s.substr(start, i - start));
    start = i + 1;
  }
  return out;
}

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::istringstream in(s);
  for (int32_t v; in >> v;) ids.push_back(v);
  return ids;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t v : ids) s += std::to_string(v) + " ";
  return s;
}

// The fixture's tokenizer.json, unzipped into the test's folder.
// In a directory of the running test's own: ctest runs tests in parallel processes, and a
// directory shared by name was rewritten under another test's reader.
std::string unpack(const std::string& name) {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string tag = test ? std::string(test->test_suite_name()) + "." + test->name() : "none";
  std::replace(tag.begin(), tag.end(), '/', '_');
  const std::string dir = testing_dirs::fresh_dir("tokjson_" + name + "_" + tag);
  const std::string path = dir + "/tokenizer.json";
  std::ofstream(path, std::ios::binary) << gunzip(kFixtures / (name + ".json.gz"));
  return path;
}

const std::vector<std::string>& lines() {
  static const std::vector<std::string> l = split(gunzip(kFixtures / "lines.txt.gz"), '\n');
  return l;
}

class Parity : public ::testing::TestWithParam<std::string> {};

// Every line and pair of the fixture text through `tok`, against `want_file`.expected.gz.
void expect_parity(const Tokenizer& tok, const std::string& want_file, const std::string& label) {
  ASSERT_NE(tok.json(), nullptr);
  const std::vector<std::string> expected = split(gunzip(kFixtures / (want_file + ".expected.gz")), '\n');
  const auto& text = lines();
  ASSERT_GE(text.size(), 10000u);
  ASSERT_GT(expected.size(), text.size() + 1);
  ASSERT_EQ(expected[text.size()], "pairs");

  size_t bad = 0, tokens = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const std::vector<int32_t> want = parse_ids(expected[i]);
    const Encoding e = tok.encode(text[i], std::nullopt, 0, Truncation::None, Padding::None);
    tokens += want.size();
    if (e.input_ids == want) continue;
    if (bad++ == 0)
      ADD_FAILURE() << label << ": first mismatch on line " << i + 1 << " \"" << text[i] << "\"\n  want "
                    << show(want) << "\n  got  " << show(e.input_ids);
  }
  EXPECT_EQ(bad, 0u) << "of " << text.size() << " lines (" << tokens << " tokens)";

  size_t bad_pairs = 0, pairs = 0;
  for (size_t k = text.size() + 1; k < expected.size(); ++k) {
    if (expected[k].empty()) continue;
    const std::vector<std::string> f = split(expected[k], '\t');
    ASSERT_EQ(f.size(), 3u) << expected[k];
    const std::vector<int32_t> head = parse_ids(f[0]);
    ASSERT_EQ(head.size(), 3u);
    const std::string& a = text.at(static_cast<size_t>(head[0]));
    const std::string& b = text.at(static_cast<size_t>(head[1]));
    const Encoding e = tok.encode(a, b, static_cast<size_t>(head[2]), Truncation::LongestFirst, Padding::None);
    ++pairs;
    if (e.input_ids == parse_ids(f[1]) && e.token_type_ids == parse_ids(f[2])) continue;
    if (bad_pairs++ == 0)
      ADD_FAILURE() << label << ": first pair mismatch, lines " << head[0] + 1 << " and " << head[1] + 1
                    << " max_length " << head[2] << "\n  want " << f[1] << " / " << f[2] << "\n  got  "
                    << show(e.input_ids) << " / " << show(e.token_type_ids);
  }
  EXPECT_GE(pairs, 1000u);
  EXPECT_EQ(bad_pairs, 0u) << "of " << pairs << " pairs";
}

// GetParam(): a fixture name, or "file:expected" for an older file shape of the same tokenizer.
TEST_P(Parity, EveryLineAndPairAsTheTokenizersPackage) {
  const std::string file = GetParam().substr(0, GetParam().find(':'));
  const std::string want_file = GetParam().substr(GetParam().find(':') == std::string::npos ? 0 : GetParam().find(':') + 1);
  expect_parity(Tokenizer::from_tokenizer_json(unpack(file)), want_file, GetParam());
}

// Note [XLM-R as transformers 5 builds it]: a directory AutoTokenizer makes an XLMRobertaTokenizer
// of (tokenizer_config.json's tokenizer_class, or config.json's model_type) tokenizes as
// transformers 5 does (tests/fixtures/make_xlmr_class.py), not as its tokenizer.json alone
// (2978 of 12006 lines differ); another class, or none named, keeps the file's pipeline.
TEST(TokenizerJsonXlmRobertaClass, EveryLineAndPairAsTransformers5) {
  const std::string file = unpack("xlmr");
  const std::string dir = fs::path(file).parent_path().string();
  std::ofstream(dir + "/tokenizer_config.json") << R"({"tokenizer_class": "XLMRobertaTokenizerFast"})";
  expect_parity(Tokenizer::from_directory(dir), "xlmr_class", "tokenizer_class");
  std::ofstream(dir + "/tokenizer_config.json") << "{}";
  std::ofstream(dir + "/config.json") << R"({"model_type": "xlm-roberta"})";
  expect_parity(Tokenizer::from_directory(dir), "xlmr_class", "model_type");
  std::ofstream(dir + "/tokenizer_config.json") << R"({"tokenizer_class": "PreTrainedTokenizerFast"})";
  expect_parity(Tokenizer::from_directory(dir), "xlmr", "another class");
  // The class's templates replace the file's post-processor, even none (<s> and </s> were lost).
  nlohmann::json j = nlohmann::json::parse(read_regular_file(file));
  j["post_processor"] = nullptr;
  std::ofstream(file) << j.dump();
  std::ofstream(dir + "/tokenizer_config.json") << R"({"tokenizer_class": "XLMRobertaTokenizer", "bos_token": {"content": "<s>"}})";
  expect_parity(Tokenizer::from_directory(dir), "xlmr_class", "no post-processor");
  // Note [the class of a bare tokenizer]: a directory naming no class takes the model's type.
  const std::string bare = fs::path(unpack("xlmr")).parent_path().string();
  expect_parity(Tokenizer::from_directory(bare), "xlmr", "bare");
  expect_parity(Tokenizer::from_directory(bare, "xlm-roberta"), "xlmr_class", "bare, for an XLM-R model");
  // Note [the class of a saved tokenizer]: the same file in a directory of type roberta, passed
  // with an XLM-R model, is built as its own type (the file's pipeline) and saved naming that
  // class, so that the saved model (whose config.json says xlm-roberta) reloads with the tokens
  // it was trained on; it reloaded as XLM-R's class.
  const std::string typed = fs::path(unpack("xlmr")).parent_path().string();
  std::ofstream(typed + "/config.json") << R"({"model_type": "roberta"})";
  expect_parity(Tokenizer::from_directory(typed, "xlm-roberta"), "xlmr", "a roberta directory for an XLM-R model");
  const std::string saved = testing_dirs::fresh_dir("tokjson_saved_class");
  save_tokenizer_into(saved, Tokenizer::files_to_save(typed, "xlm-roberta"));
  std::ofstream(saved + "/config.json") << R"({"model_type": "xlm-roberta"})";
  expect_parity(Tokenizer::from_directory(saved, "xlm-roberta"), "xlmr", "saved beside the XLM-R model");
  EXPECT_EQ(nlohmann::json::parse(read_regular_file(saved + "/tokenizer_config.json"))["tokenizer_class"],
            "RobertaTokenizer");
  // A null class is no class (as from_directory reads it); a vocab.txt directory of a type with no
  // class of its own here is not recorded as the generic class transformers cannot build from it.
  std::ofstream(typed + "/tokenizer_config.json") << R"({"tokenizer_class": null})";
  EXPECT_NE(Tokenizer::files_to_save(typed, "xlm-roberta").config.find("\"RobertaTokenizer\""), std::string::npos);
  const std::string wp = testing_dirs::fresh_dir("tokjson_saved_wp");
  fs::copy_file(fs::path(ANATOMY_SOURCE_DIR) / "tests/data/tokenizer/vocab.txt", wp + "/vocab.txt");
  std::ofstream(wp + "/config.json") << R"({"model_type": "mobilebert"})";
  EXPECT_EQ(Tokenizer::files_to_save(wp, "bert").config, "");
}

// Pre-split words (Hugging Face's is_split_into_words): ids and each token's word index, against
// the tokenizers package's for `want_file`.
void expect_split_words(const Tokenizer& tok, const std::string& want_file) {
  const std::vector<std::string> cases = split(gunzip(kFixtures / (want_file + ".words.gz")), '\n');
  size_t bad = 0, n = 0;
  for (const std::string& c : cases) {
    if (c.empty()) continue;
    const std::vector<std::string> f = split(c, '\t');
    ASSERT_EQ(f.size(), 3u) << c;
    const std::vector<int32_t> head = parse_ids(f[0]);
    std::vector<std::string> words;
    for (const std::string& w : split(lines().at(static_cast<size_t>(head[0])), ' '))
      if (!w.empty()) words.push_back(w);
    const WordEncoding e = tok.encode_split_words(words, static_cast<size_t>(head[1]), Truncation::LongestFirst, Padding::None);
    ++n;
    if (e.encoding.input_ids == parse_ids(f[1]) && e.word_ids == parse_ids(f[2])) continue;
    if (bad++ == 0)
      ADD_FAILURE() << want_file << ": first mismatch, line " << head[0] + 1 << " max_length " << head[1] << "\n  want "
                    << f[1] << " / " << f[2] << "\n  got  " << show(e.encoding.input_ids) << " / " << show(e.word_ids);
  }
  EXPECT_GE(n, 500u);
  EXPECT_EQ(bad, 0u) << "of " << n << " word lists";
}

TEST_P(Parity, SplitWordsAsTheTokenizersPackage) {
  const std::string file = GetParam().substr(0, GetParam().find(':'));
  const std::string want_file = GetParam().substr(GetParam().find(':') == std::string::npos ? 0 : GetParam().find(':') + 1);
  expect_split_words(Tokenizer::from_tokenizer_json(unpack(file)), want_file);
}

// Note [prefix space for words]: a byte-level tokenizer saved without add_prefix_space, asked for
// it (as run_ner.py asks for RoBERTa's), splits words as the one saved with it.
TEST(TokenizerJsonPrefixSpace, AddedAsTransformersAddsIt) {
  const std::string path = unpack("roberta_prefix");
  nlohmann::json j = nlohmann::json::parse(read_regular_file(path));
  ASSERT_EQ(j["pre_tokenizer"]["add_prefix_space"], true);
  j["pre_tokenizer"]["add_prefix_space"] = false;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << j.dump();
  const Tokenizer without = Tokenizer::from_tokenizer_json(path);
  EXPECT_NE(without.encode_words("word")[0], without.with_prefix_space().encode_words("word")[0]);
  expect_split_words(without.with_prefix_space(), "roberta_prefix");
}

INSTANTIATE_TEST_SUITE_P(TokenizerJson, Parity,
                         ::testing::Values("roberta", "roberta_prefix", "modernbert", "xlmr", "unigram", "bpe_unk",
                                           "roberta_legacy:roberta", "xlmr_legacy:xlmr"),
                         [](const auto& info) { return info.param.substr(0, info.param.find(':')); });

TEST(TokenizerJson, PadsToMaxLengthWithThePadToken) {
  const Tokenizer tok = Tokenizer::from_tokenizer_json(unpack("roberta"));
  const int32_t pad = tok.token_to_id("<pad>");
  ASSERT_GE(pad, 0);
  EXPECT_EQ(tok.pad_id(), pad);
  EXPECT_EQ(tok.cls_id(), tok.token_to_id("<s>"));
  EXPECT_EQ(tok.sep_id(), tok.token_to_id("</s>"));
  const Encoding e = tok.encode("Hello world", std::nullopt, 16);
  ASSERT_EQ(e.input_ids.size(), 16u);
  const size_t n = tok.encode("Hello world", std::nullopt, 16, Truncation::LongestFirst, Padding::None).input_ids.size();
  ASSERT_LT(n, 16u);
  for (size_t i = 0; i < 16; ++i) {
    EXPECT_EQ(e.attention_mask[i], i < n ? 1 : 0);
    if (i >= n) { EXPECT_EQ(e.input_ids[i], pad); }
  }
  EXPECT_EQ(e.input_ids.front(), tok.cls_id());
  EXPECT_EQ(e.input_ids[n - 1], tok.sep_id());
}

TEST(TokenizerJson, DirectoryPrefersTokenizerJsonThenVocabTxt) {
  const std::string dir = testing_dirs::fresh_dir("tokjson_dir");
  fs::copy_file(unpack("xlmr"), dir + "/tokenizer.json");
  const Tokenizer t = Tokenizer::from_directory(dir);
  ASSERT_NE(t.json(), nullptr);
  EXPECT_EQ(t.vocab_size(), 3002u);
  const TokenizerFiles saved = Tokenizer::files_to_save(dir, "xlm-roberta");
  EXPECT_EQ(saved.files.size(), 1u);
  EXPECT_EQ(saved.config, "");  // built as the model type builds it: nothing to record

  const std::string wp = testing_dirs::fresh_dir("tokjson_wp");
  fs::copy_file(fs::path(ANATOMY_SOURCE_DIR) / "tests/data/tokenizer/vocab.txt", wp + "/vocab.txt");
  const Tokenizer w = Tokenizer::from_directory(wp);
  ASSERT_NE(w.wordpiece(), nullptr);
  EXPECT_EQ(w.encode("hello", std::nullopt, 8).input_ids, w.wordpiece()->encode("hello", std::nullopt, 8).input_ids);
  // Split words through WordPiece: the ids of the joined text, each piece tagged with its word.
  const std::vector<std::string> words = {"Hello", "unaffable", "world!"};
  const WordEncoding we = w.encode_split_words(words, 16, Truncation::LongestFirst, Padding::MaxLength);
  EXPECT_EQ(we.encoding.input_ids, w.encode("Hello unaffable world!", std::nullopt, 16).input_ids);
  ASSERT_EQ(we.word_ids.size(), 16u);
  EXPECT_EQ(we.word_ids.front(), -1);
  int32_t last = -1;
  size_t tagged = 0;
  for (size_t i = 0; i < 16; ++i) {
    if (we.word_ids[i] < 0) continue;
    EXPECT_GE(we.word_ids[i], last);
    last = we.word_ids[i];
    ++tagged;
    EXPECT_NE(we.encoding.input_ids[i], w.sep_id());
  }
  EXPECT_EQ(last, 2);
  EXPECT_GE(tagged, 4u);  // "world!" is at least two pieces
  // A WordPiece tokenizer.json still goes to the WordPiece reader.
  const Tokenizer wj = Tokenizer::from_tokenizer_json((fs::path(ANATOMY_SOURCE_DIR) / "tests/data/tokenizer/tokenizer.json").string());
  EXPECT_NE(wj.wordpiece(), nullptr);
}

// Bytes that are not UTF-8, lone special-token fragments and long runs: every tokenizer gives ids
// inside its vocabulary, deterministically, and cuts to max_length.
TEST(TokenizerJson, ArbitraryBytesGiveIdsInsideTheVocabulary) {
  std::mt19937 rng(15);
  std::vector<std::string> texts = {std::string("\xff\xfe<s\xc3", 5), std::string(3000, '-'), "<mask><mask> <s></s>",
                                    std::string(2000, ' ') + "x", "\xe4\xb8\xad\xe6\x96\x87" + std::string(600, 'a')};
  for (int i = 0; i < 200; ++i) {
    std::string t(rng() % 64, '\0');
    for (char& c : t) c = static_cast<char>(rng() % 256);
    texts.push_back(t);
  }
  for (const char* name : {"roberta", "modernbert", "xlmr", "unigram", "bpe_unk"}) {
    const Tokenizer tok = Tokenizer::from_tokenizer_json(unpack(name));
    for (const std::string& t : texts) {
      const Encoding e = tok.encode(t, std::string_view("pair"), 32, Truncation::LongestFirst, Padding::MaxLength);
      ASSERT_EQ(e.input_ids.size(), 32u) << name;
      for (int32_t id : e.input_ids) ASSERT_TRUE(id >= 0 && static_cast<size_t>(id) < tok.vocab_size()) << name << " " << id;
      EXPECT_EQ(tok.encode_words(t), tok.encode_words(t)) << name;
    }
  }
}

// The dataset takes any tokenizer: a RoBERTa-style pair file gives the ids encode() gives,
// <s> a </s></s> b </s> padded with <pad>.
TEST(TokenizerJson, TextDatasetEncodesPairsWithAJsonTokenizer) {
  const std::string dir = testing_dirs::fresh_dir("tokjson_ds");
  fs::copy_file(unpack("roberta"), dir + "/tokenizer.json");
  const Tokenizer tok = Tokenizer::from_directory(dir);
  const std::string csv = dir + "/pairs.csv";
  std::ofstream(csv) << "text,text_pair,label\nHi,yo,1\n\"Héllo, мир! Καλημέρα κόσμε 😀\",\"a much longer second text, to be cut\",0\n";
  TextDataOptions opt;
  opt.text_pair_column = "text_pair";
  opt.max_length = 12;
  opt.cache = CacheMode::Off;
  const TextDataset ds = TextDataset::load(csv, tok, opt);
  ASSERT_EQ(ds.size(), 2u);
  const std::pair<const char*, const char*> rows[] = {{"Hi", "yo"},
                                                      {"Héllo, мир! Καλημέρα κόσμε 😀", "a much longer second text, to be cut"}};
  for (size_t i = 0; i < 2; ++i) {
    const Encoding e = tok.encode(rows[i].first, std::string_view(rows[i].second), 12, Truncation::LongestFirst, Padding::None);
    const auto ids = ds.ids(i);
    EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.end()), e.input_ids) << "row " << i;
    EXPECT_EQ(e.input_ids[0], tok.token_to_id("<s>"));
  }
  EXPECT_EQ(ds.ids(1).size(), 12u);  // cut longest-first to max_length
  opt.max_length = 3;  // <s> </s></s> </s> needs 4
  try {
    TextDataset::load(csv, tok, opt);
    ADD_FAILURE() << "max_length 3 accepted for a RoBERTa pair";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(csv), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[4, 16777216]"), std::string::npos) << e.what();
  }
  opt.max_length = 12;
  const size_t n0 = ds.ids(0).size();
  ASSERT_LT(n0, 12u);
  HostBatch b;
  b.resize(1, 12);
  ds.get(0, b, 0);
  for (size_t t = 0; t < 12; ++t) {
    EXPECT_EQ(b.input_ids[t], t < n0 ? ds.ids(0)[t] : tok.pad_id()) << t;
    EXPECT_EQ(b.attention_mask[t], t < n0 ? 1 : 0) << t;
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TokenizerJson, UnsupportedPartsAreOneLineErrorsNamingTheFile) {
  const std::string dir = testing_dirs::fresh_dir("tokjson_err");
  auto write = [&](const std::string& name, const std::string& body) {
    const std::string p = dir + "/" + name;
    std::ofstream(p) << body;
    return p;
  };
  const std::string base = R"({"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]})";
  const std::string ok = write("ok.json", base + "}");
  EXPECT_EQ(Tokenizer::from_tokenizer_json(ok).encode_words("abba"), (std::vector<int32_t>{2, 1, 0}));
  for (const auto& [name, body, needle] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"norm.json", base + R"(,"normalizer":{"type":"Nope"}})", "normalizer type \"Nope\""},
           {"pre.json", base + R"(,"pre_tokenizer":{"type":"Digits"}})", "pre_tokenizer type \"Digits\""},
           {"post.json", base + R"(,"post_processor":{"type":"Odd"}})", "post_processor type \"Odd\""},
           {"regex.json", base + R"(,"normalizer":{"type":"Replace","pattern":{"Regex":"a|b"},"content":""}})", "a|b"},
           {"merge.json", R"({"model":{"type":"BPE","vocab":{"a":0},"merges":["a c"]}})", "merge"},
           {"unk.json", R"({"model":{"type":"Unigram","vocab":[["a",0.0]]}})", "unk_id"},
           {"cut.json", R"({"model":{"type":"BPE","vocab":)", "not valid JSON"}}) {
    const std::string p = write(name, body);
    const std::string msg = error_of([&] { Tokenizer::from_tokenizer_json(p); });
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

}  // namespace
