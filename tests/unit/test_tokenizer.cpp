// WordPiece tokenization against Hugging Face: the whole parity corpus (tests/data/tokenizer, made by
// tests/golden/make_tokenizer_parity.py), then the edges one at a time.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include "core/error.h"
#include "data/tokenizer.h"
#include "data/unicode.h"

using namespace anatomy;
namespace fs = std::filesystem;

namespace {

const std::string kDir = std::string(ANATOMY_SOURCE_DIR) + "/tests/data/tokenizer";
const std::string kVocab = kDir + "/vocab.txt";
const std::string kJson = kDir + "/tokenizer.json";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A scratch folder for this process, removed at exit.
struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("anatomy_tok_" + std::to_string(::getpid()));
  Scratch() { fs::create_directories(dir); }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string write(const std::string& name, const std::string& bytes) const {
    const fs::path p = dir / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }
};
const Scratch& scratch() {
  static Scratch s;
  return s;
}

// tokenizer.json with the normalizer's lowercase and strip_accents changed, as the generator does.
std::string json_variant(const std::string& name, bool lowercase, std::optional<bool> strip) {
  nlohmann::json j = nlohmann::json::parse(slurp(kJson));
  j["normalizer"]["lowercase"] = lowercase;
  j["normalizer"]["strip_accents"] = strip ? nlohmann::json(*strip) : nlohmann::json();
  return scratch().write(name + ".json", j.dump());
}

const WordPieceTokenizer& variant(const std::string& name) {
  static std::map<std::string, std::unique_ptr<WordPieceTokenizer>> cache;
  auto& slot = cache[name];
  if (slot) return *slot;
  auto make = [&]() -> WordPieceTokenizer {
    if (name == "slow_uncased") return WordPieceTokenizer::from_vocab_txt(kVocab, true);
    if (name == "slow_cased") return WordPieceTokenizer::from_vocab_txt(kVocab, false);
    if (name == "slow_cased_strip") return WordPieceTokenizer::from_vocab_txt(kVocab, false, true);
    if (name == "slow_lower_nostrip") return WordPieceTokenizer::from_vocab_txt(kVocab, true, false);
    if (name == "fast_uncased") return WordPieceTokenizer::from_tokenizer_json(kJson);
    if (name == "fast_cased") return WordPieceTokenizer::from_tokenizer_json(json_variant(name, false, {}));
    if (name == "fast_cased_strip") return WordPieceTokenizer::from_tokenizer_json(json_variant(name, false, true));
    if (name == "fast_lower_nostrip")
      return WordPieceTokenizer::from_tokenizer_json(json_variant(name, true, false));
    fail("unknown variant ", name);
  };
  slot = std::make_unique<WordPieceTokenizer>(make());
  return *slot;
}

std::vector<int32_t> parse_ids(std::string_view s) {
  std::vector<int32_t> v;
  std::istringstream in{std::string(s)};
  for (int32_t x; in >> x;) v.push_back(x);
  return v;
}

struct Record {  // a P or S line of expected.txt
  size_t line, max_length, n0;
  std::vector<int32_t> ids;
};

struct Golden {
  std::vector<std::string> corpus;
  std::vector<std::string> variants;
  std::vector<std::vector<std::vector<int32_t>>> words;  // [line][variant]
  std::map<std::string, std::vector<Record>> pairs, singles;
};

const Golden& golden() {
  static const Golden g = [] {
    Golden g;
    const std::string corpus = slurp(kDir + "/corpus.txt");
    EXPECT_FALSE(corpus.empty()) << "tests/data/tokenizer/corpus.txt is missing";
    for (size_t i = 0; i < corpus.size();) {
      const size_t j = corpus.find('\n', i);
      g.corpus.push_back(corpus.substr(i, j - i));
      i = j == std::string::npos ? corpus.size() : j + 1;
    }
    std::istringstream in(slurp(kDir + "/expected.txt"));
    for (std::string line; std::getline(in, line);) {
      if (line.starts_with("V ")) {
        std::istringstream vs(line.substr(2));
        for (std::string v; vs >> v;) g.variants.push_back(v);
      } else if (line.starts_with("L ")) {
        std::vector<std::vector<int32_t>> row;
        size_t a = 2;
        for (;;) {
          const size_t b = line.find('|', a);
          const std::string f = line.substr(a, b == std::string::npos ? std::string::npos : b - a);
          row.push_back(f.starts_with("=") ? row.at(std::stoul(f.substr(1))) : parse_ids(f));
          if (b == std::string::npos) break;
          a = b + 1;
        }
        g.words.push_back(std::move(row));
      } else if (line.starts_with("P ") || line.starts_with("S ")) {
        std::istringstream rs(line.substr(2));
        std::string v;
        Record r;
        rs >> v >> r.line >> r.max_length >> r.n0;
        for (int32_t x; rs >> x;) r.ids.push_back(x);
        (line[0] == 'P' ? g.pairs : g.singles)[v].push_back(std::move(r));
      }
    }
    return g;
  }();
  return g;
}

std::string show(std::string_view bytes) {  // printable, for failure messages
  std::string s;
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c != 0x7F && c != '\\') {
      s += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      s += buf;
    }
  }
  return s;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Parity with Hugging Face, every corpus line, every variant.

class TokenizerParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerParity, EveryCorpusLineGivesIdenticalIds) {
  const Golden& g = golden();
  ASSERT_GE(g.corpus.size(), 10000u);
  ASSERT_EQ(g.words.size(), g.corpus.size()) << "expected.txt does not match corpus.txt";
  const auto vi = std::find(g.variants.begin(), g.variants.end(), GetParam()) - g.variants.begin();
  ASSERT_LT(static_cast<size_t>(vi), g.variants.size()) << GetParam() << " is not in expected.txt";
  const WordPieceTokenizer& tok = variant(GetParam());
  size_t mismatches = 0, first = 0;
  std::vector<int32_t> first_got;
  for (size_t i = 0; i < g.corpus.size(); ++i) {
    const std::vector<int32_t> got = tok.encode_words(g.corpus[i]);
    if (got != g.words[i][static_cast<size_t>(vi)] && mismatches++ == 0) first = i, first_got = got;
  }
  EXPECT_EQ(mismatches, 0u) << "first mismatch: corpus line " << first + 1 << " \"" << show(g.corpus[first])
                            << "\"\n  expected " << show(g.words[first][static_cast<size_t>(vi)])
                            << "\n  got      " << show(first_got);
}

INSTANTIATE_TEST_SUITE_P(TokenizerVsHuggingFace, TokenizerParity,
                         ::testing::Values("slow_uncased", "slow_cased", "slow_cased_strip", "slow_lower_nostrip",
                                           "fast_uncased", "fast_cased", "fast_cased_strip", "fast_lower_nostrip"));

TEST(Tokenizer, PairsAndSinglesTruncatedAndPaddedLikeHuggingFace) {
  const Golden& g = golden();
  ASSERT_EQ(g.pairs.size(), 2u) << "expected.txt should hold encode() records of two variants";
  for (const bool pair : {true, false}) {
    for (const auto& [name, recs] : pair ? g.pairs : g.singles) {
      const WordPieceTokenizer& tok = variant(name);
      size_t mismatches = 0;
      for (const Record& r : recs) {
        const Encoding e = pair ? tok.encode(g.corpus[r.line], g.corpus[r.line + 1], r.max_length)
                                : tok.encode(g.corpus[r.line], std::nullopt, r.max_length);
        Encoding want;
        want.input_ids = r.ids;
        want.input_ids.resize(r.max_length, tok.pad_id());
        want.token_type_ids.assign(r.max_length, 0);
        std::fill(want.token_type_ids.begin() + static_cast<long>(r.n0),
                  want.token_type_ids.begin() + static_cast<long>(r.ids.size()), 1);
        want.attention_mask.assign(r.max_length, 0);
        std::fill(want.attention_mask.begin(), want.attention_mask.begin() + static_cast<long>(r.ids.size()), 1);
        const bool same = e.input_ids == want.input_ids && e.token_type_ids == want.token_type_ids &&
                          e.attention_mask == want.attention_mask;
        if (!same && mismatches++ == 0)
          ADD_FAILURE() << name << (pair ? " pair" : " single") << " at corpus line " << r.line + 1
                        << " max_length " << r.max_length << "\n  expected " << show(want.input_ids)
                        << "\n  got      " << show(e.input_ids);
      }
      EXPECT_EQ(mismatches, 0u) << name;
      EXPECT_GT(recs.size(), 100u) << name;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The edges, one at a time (expected ids from transformers 5.23 / tokenizers 0.23).

TEST(Tokenizer, PairGetsClsSepAndTokenTypes) {
  for (const char* v : {"slow_uncased", "fast_uncased"}) {
    const Encoding e = variant(v).encode("Hello, world!", "How are you?", 16);
    EXPECT_EQ(e.input_ids, (std::vector<int32_t>{101, 7592, 1010, 2088, 999, 102, 2129, 2024, 2017, 1029, 102,
                                                 0, 0, 0, 0, 0}));
    EXPECT_EQ(e.token_type_ids, (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0}));
    EXPECT_EQ(e.attention_mask, (std::vector<int32_t>{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0}));
  }
}

TEST(Tokenizer, WordPiecesAreGreedyLongestMatchWithPrefix) {
  const auto& t = variant("slow_uncased");
  EXPECT_EQ(t.tokenize("unaffable Ångström"),
            (std::vector<std::string>{"una", "##ffa", "##ble", "ang", "##strom"}));
  EXPECT_EQ(t.encode_words("unaffable Ångström"), (std::vector<int32_t>{14477, 20961, 3468, 17076, 15687}));
}

TEST(Tokenizer, TruncationIsLongestFirstWithEachLibrarysTieBreak) {
  const std::string a = "one two three four five six seven eight";
  const std::string b = "alpha beta gamma delta epsilon zeta eta theta";
  // 8 + 8 pieces into 12 - 3: transformers keeps 5 + 4, tokenizers 4 + 5.
  EXPECT_EQ(variant("slow_uncased").encode(a, b, 12, Truncation::LongestFirst, Padding::None).input_ids,
            (std::vector<int32_t>{101, 2028, 2048, 2093, 2176, 2274, 102, 6541, 8247, 13091, 7160, 102}));
  EXPECT_EQ(variant("fast_uncased").encode(a, b, 12, Truncation::LongestFirst, Padding::None).input_ids,
            (std::vector<int32_t>{101, 2028, 2048, 2093, 2176, 102, 6541, 8247, 13091, 7160, 28038, 102}));
  // The longer loses first: 8 + 2 into 7 keeps 2 + 2 in both.
  for (const char* v : {"slow_uncased", "fast_uncased"}) {
    const Encoding e = variant(v).encode(a, "alpha beta", 7, Truncation::LongestFirst, Padding::None);
    EXPECT_EQ(e.input_ids, (std::vector<int32_t>{101, 2028, 2048, 102, 6541, 8247, 102}));
    EXPECT_EQ(e.token_type_ids, (std::vector<int32_t>{0, 0, 0, 0, 1, 1, 1}));
  }
  // A single text keeps its head; without truncation nothing is cut and nothing padded.
  EXPECT_EQ(variant("slow_uncased").encode(a, std::nullopt, 4).input_ids,
            (std::vector<int32_t>{101, 2028, 2048, 102}));
  EXPECT_EQ(variant("slow_uncased").encode(a, std::nullopt, 4, Truncation::None).input_ids.size(), 10u);
  EXPECT_THROW(variant("slow_uncased").encode(a, b, 2), Error);
}

TEST(Tokenizer, PaddingFillsToMaxLengthWithMaskAndTypeZero) {
  const Encoding e = variant("fast_uncased").encode("", std::nullopt, 6);
  EXPECT_EQ(e.input_ids, (std::vector<int32_t>{101, 102, 0, 0, 0, 0}));
  EXPECT_EQ(e.token_type_ids, (std::vector<int32_t>(6, 0)));
  EXPECT_EQ(e.attention_mask, (std::vector<int32_t>{1, 1, 0, 0, 0, 0}));
  const Encoding n = variant("fast_uncased").encode("", std::nullopt, 6, Truncation::LongestFirst, Padding::None);
  EXPECT_EQ(n.input_ids, (std::vector<int32_t>{101, 102}));
}

TEST(Tokenizer, EmptyAndBlankLinesHaveNoWords) {
  for (const char* v : {"slow_uncased", "fast_cased"}) {
    EXPECT_TRUE(variant(v).encode_words("").empty());
    EXPECT_TRUE(variant(v).encode_words(std::string_view(" \t\r\x0b\xe2\x80\x8b\0\x7f", 9)).empty());
  }
}

TEST(Tokenizer, OverLongWordIsUnknown) {
  for (const char* v : {"slow_uncased", "fast_uncased"}) {
    const auto& t = variant(v);
    EXPECT_EQ(t.max_input_chars_per_word(), 100u);
    const auto hundred = t.encode_words(std::string(100, 'a'));
    EXPECT_EQ(hundred.size(), 50u);
    EXPECT_EQ(hundred.front(), 13360);
    EXPECT_EQ(t.encode_words(std::string(101, 'a')), (std::vector<int32_t>{t.unk_id()}));
    // Punctuation splits before the length is counted.
    EXPECT_EQ(t.encode_words(std::string(60, 'a') + "-" + std::string(60, 'a')).size(), 61u);
  }
}

TEST(Tokenizer, InvalidUtf8BecomesReplacementCharactersAsPythonDecodes) {
  using unicode::decode_utf8;
  EXPECT_EQ(decode_utf8("abc\xff" "def"), U"abc\uFFFDdef");
  EXPECT_EQ(decode_utf8("\xe2\x82" "A"), U"\uFFFDA");
  EXPECT_EQ(decode_utf8("\xed\xa0\x80x"), U"\uFFFD\uFFFD\uFFFDx");
  EXPECT_EQ(decode_utf8("\xf0\x9f\x98"), U"\uFFFD");
  EXPECT_EQ(decode_utf8("\xf4\x90\x80\x80"), U"\uFFFD\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(decode_utf8("\xc0\xaf"), U"\uFFFD\uFFFD");
  EXPECT_EQ(decode_utf8("\xe0\x80\xaf"), U"\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(decode_utf8("\xf0\x9f\x98\x80"), U"\U0001F600");
  EXPECT_EQ(decode_utf8("\xc3"), U"\uFFFD");
  EXPECT_EQ(decode_utf8("\xfe\xff"), U"\uFFFD\uFFFD");
  EXPECT_EQ(decode_utf8("\xf1\x80\x80\xe1\x80"), U"\uFFFD\uFFFD");
  // Cleaning drops U+FFFD, so the bad bytes vanish and the text around them joins.
  const auto& t = variant("slow_uncased");
  EXPECT_EQ(t.encode_words("abc\xff def"), t.encode_words("abc def"));
  EXPECT_EQ(t.encode_words("\xe2\x82" "A"), t.encode_words("a"));
}

TEST(Tokenizer, LowerCasingFollowsPythonOrRust) {
  // Final sigma: str.lower() gives ς at a word's end, tokenizers' per-character lowercase σ.
  EXPECT_EQ(variant("slow_uncased").tokenize("ΟΔΟΣ"), (std::vector<std::string>{"ο", "##δ", "##ος"}));
  EXPECT_EQ(variant("fast_uncased").tokenize("ΟΔΟΣ"), (std::vector<std::string>{"ο", "##δ", "##ο", "##σ"}));
  // U+0130 lowers to "i" + U+0307, and accent stripping leaves "i".
  EXPECT_EQ(variant("slow_uncased").tokenize("İstanbul"), (std::vector<std::string>{"istanbul"}));
  EXPECT_EQ(variant("fast_uncased").tokenize("İstanbul"), (std::vector<std::string>{"istanbul"}));
}

// A model directory with only vocab.txt is read as AutoTokenizer (run_glue.py's use_fast=True)
// reads it: converted to the fast tokenizer, so with the tokenizers library's rules, as its
// tokenizer.json would be (the Python rules truncated pairs and lowered Greek otherwise).
TEST(Tokenizer, AVocabTxtDirectoryFollowsTheFastTokenizer) {
  const std::string dir = (scratch().dir / "vocab_only").string();
  fs::create_directories(dir);
  fs::copy_file(kVocab, dir + "/vocab.txt", fs::copy_options::overwrite_existing);
  scratch().write("vocab_only/tokenizer_config.json", R"({"do_lower_case": true})");
  const WordPieceTokenizer t = WordPieceTokenizer::from_directory(dir);
  EXPECT_EQ(t.semantics(), BertSemantics::Tokenizers);
  const std::string a = "one two three four five six seven eight", b = "alpha beta gamma delta epsilon zeta eta theta";
  EXPECT_EQ(t.encode(a, b, 12, Truncation::LongestFirst, Padding::None).input_ids,
            variant("fast_uncased").encode(a, b, 12, Truncation::LongestFirst, Padding::None).input_ids);
  EXPECT_EQ(t.tokenize("ΟΔΟΣ"), variant("fast_uncased").tokenize("ΟΔΟΣ"));
  EXPECT_NE(t.tokenize("ΟΔΟΣ"), variant("slow_uncased").tokenize("ΟΔΟΣ"));
}

// Note [BERT as transformers 5 builds it]: a BERT directory's normalizer is tokenizer_config.json's
// (do_lower_case, strip_accents, tokenize_chinese_chars; lower-casing when it says nothing), not
// its tokenizer.json's: transformers 5.24 gave [2, 50, 229, 82, 65, 122, 91, 83, 3] for "Hello
// World" through a cased tokenizer.json with config.json's model_type bert and no
// tokenizer_config.json (the lower-cased words), where the file's pipeline gives [2, 1, 1, 3].
// A directory of no BERT class keeps the file's normalizer.
TEST(Tokenizer, ABertDirectoryNormalizesAsItsTokenizerConfigSays) {
  const std::string dir = (scratch().dir / "cased_json").string();
  fs::create_directories(dir);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(kJson));
  j["normalizer"]["lowercase"] = false;
  j["normalizer"]["strip_accents"] = false;
  std::ofstream(dir + "/tokenizer.json") << j.dump();
  const std::vector<int32_t> lower = Tokenizer::from_tokenizer_json(kJson).encode_words("hello world");
  const std::vector<int32_t> cased = Tokenizer::from_tokenizer_json(dir + "/tokenizer.json").encode_words("Hello World");
  ASSERT_NE(cased, lower);
  EXPECT_EQ(Tokenizer::from_directory(dir).encode_words("Hello World"), cased);  // no class: the file's
  std::ofstream(dir + "/config.json") << R"({"model_type": "bert"})";
  EXPECT_EQ(Tokenizer::from_directory(dir).encode_words("Hello World"), lower);
  std::ofstream(dir + "/tokenizer_config.json") << R"({"do_lower_case": false, "tokenizer_class": "DistilBertTokenizer"})";
  EXPECT_EQ(Tokenizer::from_directory(dir).encode_words("Hello World"), cased);
  std::ofstream(dir + "/tokenizer_config.json") << R"({"tokenizer_class": "ElectraTokenizerFast"})";
  EXPECT_EQ(Tokenizer::from_directory(dir).encode_words("Hello World"), lower);
  std::ofstream(dir + "/tokenizer_config.json") << R"({"tokenizer_class": "PreTrainedTokenizerFast"})";
  EXPECT_EQ(Tokenizer::from_directory(dir).encode_words("Hello World"), cased);
  // A setting that is not a boolean is refused naming the file (it was read as the default).
  std::ofstream(dir + "/tokenizer_config.json") << R"({"do_lower_case": "false"})";
  try {
    Tokenizer::from_directory(dir);
    ADD_FAILURE() << "a string do_lower_case was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: do_lower_case must be true or false (got \"false\")"),
              std::string::npos) << e.what();
  }
  // A tokenizer_config.json that is not JSON is refused naming it (it was read as {}: lower-cased).
  std::ofstream(dir + "/tokenizer_config.json") << R"({"do_lower_case": false,)";
  try {
    Tokenizer::from_directory(dir);
    ADD_FAILURE() << "a broken tokenizer_config.json was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json is not a JSON object (not valid JSON)"), std::string::npos)
        << e.what();
  }
}

// A tokenizer that truncates on the left (tokenizer_config.json's truncation_side) would be given
// other tokens than the user's script sees: refused, naming the file and the setting.
TEST(Tokenizer, LeftTruncationIsRefused) {
  const std::string dir = (scratch().dir / "left").string();
  fs::create_directories(dir);
  fs::copy_file(kVocab, dir + "/vocab.txt", fs::copy_options::overwrite_existing);
  scratch().write("left/tokenizer_config.json", R"({"do_lower_case": true, "truncation_side": "left"})");
  try {
    Tokenizer::from_directory(dir);
    ADD_FAILURE() << "a left-truncating tokenizer was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("left/tokenizer_config.json: truncation_side \"left\" is not supported"),
              std::string::npos)
        << e.what();
  }
  scratch().write("left/tokenizer_config.json", R"({"do_lower_case": true, "truncation_side": "right"})");
  EXPECT_NO_THROW(Tokenizer::from_directory(dir));
}

TEST(Tokenizer, SpecialTokensInTextKeepTheirIds) {
  for (const char* v : {"slow_uncased", "fast_uncased"}) {
    EXPECT_EQ(variant(v).tokenize("hello [SEP] world[MASK]x [cls]"),
              (std::vector<std::string>{"hello", "[SEP]", "world", "[MASK]", "x", "[", "cl", "##s", "]"}));
  }
}

// ---------------------------------------------------------------------------------------------
// Bad files give one line naming the file.

namespace {
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void expect_one_line_naming(const std::string& msg, const std::string& path, const std::string& what) {
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find(what), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}
}  // namespace

TEST(Tokenizer, MissingOrGarbledVocabTxtIsAOneLineError) {
  const std::string missing = scratch().dir.string() + "/no_such_vocab.txt";
  expect_one_line_naming(error_of([&] { WordPieceTokenizer::from_vocab_txt(missing); }), missing, "cannot open");
  const std::string empty = scratch().write("empty_vocab.txt", "");
  expect_one_line_naming(error_of([&] { WordPieceTokenizer::from_vocab_txt(empty); }), empty, "empty");
  const std::string bad = scratch().write("bad_utf8_vocab.txt", "[PAD]\n[UNK]\nab\xff\n");
  expect_one_line_naming(error_of([&] { WordPieceTokenizer::from_vocab_txt(bad); }), bad, "line 3");
  const std::string garbage = scratch().write("garbage_vocab.txt", "{\"not\": \"a vocab\"}\n");
  expect_one_line_naming(error_of([&] { WordPieceTokenizer::from_vocab_txt(garbage); }), garbage, "[UNK]");
  // CRLF line ends are fine, as in Python's text mode.
  const auto crlf = WordPieceTokenizer::from_vocab_txt(
      scratch().write("crlf_vocab.txt", "[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\nhello\r\n##s\r\n"));
  EXPECT_EQ(crlf.encode_words("Hellos"), (std::vector<int32_t>{4, 5}));
}

TEST(Tokenizer, MissingOrGarbledTokenizerJsonIsAOneLineError) {
  const std::string missing = scratch().dir.string() + "/no_such_tokenizer.json";
  expect_one_line_naming(error_of([&] { WordPieceTokenizer::from_tokenizer_json(missing); }), missing,
                         "cannot open");
  const std::string full = slurp(kJson);
  const std::string cut = scratch().write("cut.json", full.substr(0, full.size() / 2));
  expect_one_line_naming(error_of([&] { WordPieceTokenizer::from_tokenizer_json(cut); }), cut, "not valid JSON");
  const std::string other = scratch().write("other.json", "[1, 2, 3]");
  expect_one_line_naming(error_of([&] { WordPieceTokenizer::from_tokenizer_json(other); }), other, "model");
  nlohmann::json j = nlohmann::json::parse(full);
  j["model"]["type"] = "BPE";
  const std::string bpe = scratch().write("bpe.json", j.dump());
  expect_one_line_naming(error_of([&] { WordPieceTokenizer::from_tokenizer_json(bpe); }), bpe, "WordPiece");
  j = nlohmann::json::parse(full);
  j["model"]["vocab"] = "oops";
  const std::string novocab = scratch().write("novocab.json", j.dump());
  expect_one_line_naming(error_of([&] { WordPieceTokenizer::from_tokenizer_json(novocab); }), novocab, "vocab");
  j = nlohmann::json::parse(full);
  j["normalizer"]["lowercase"] = "yes";
  const std::string wrongtype = scratch().write("wrongtype.json", j.dump());
  expect_one_line_naming(error_of([&] { WordPieceTokenizer::from_tokenizer_json(wrongtype); }), wrongtype,
                         "malformed");
}
