// Text datasets: CSV/TSV/JSONL parsing, labels, the token cache, padding, bucketing, splits, and
// hostile files (each a one-line error naming the file and line, never a crash).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/csv.h"
#include "data/masked_lm.h"
#include "data/text_dataset.h"
#include "data/tokenizer.h"
#include "io/read_file.h"

using namespace anatomy;
namespace fs = std::filesystem;

namespace {

const std::string kSentiment = std::string(ANATOMY_SOURCE_DIR) + "/tests/data/text/sentiment.jsonl";

const WordPieceTokenizer& tokenizer() {
  static const WordPieceTokenizer tok =
      WordPieceTokenizer::from_vocab_txt(std::string(ANATOMY_SOURCE_DIR) + "/tests/data/tokenizer/vocab.txt");
  return tok;
}

std::vector<std::vector<std::string>> parse_csv(std::string_view data, char delim = ',',
                                                std::vector<size_t>* lines = nullptr) {
  CsvParser p(data, delim, "t.csv");
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> f;
  while (p.next(f)) {
    rows.push_back(f);
    if (lines) lines->push_back(p.record_line());
  }
  return rows;
}

using Rows = std::vector<std::vector<std::string>>;

class TextDatasetTest : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    m_dir =
        fs::path(testing::TempDir()) / ("anatomy_text_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(m_dir);
    fs::create_directories(m_dir);
  }
  void TearDown() override { fs::remove_all(m_dir); }

  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string p = (m_dir / name).string();
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  static TextDataOptions no_cache() {
    TextDataOptions o;
    o.cache = CacheMode::Off;
    return o;
  }
  // Loading must throw one line that contains every needle (typically "file:line:").
  static void expect_error(const std::string& path, const std::vector<std::string>& needles,
                           TextDataOptions opt = no_cache()) {
    try {
      TextDataset::load(path, tokenizer(), opt);
      ADD_FAILURE() << "expected an error loading " << path;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      EXPECT_LT(m.size(), 600u) << m;
      for (const std::string& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "'" << n << "' not in: " << m;
    }
  }
  // The ids of a sample as a vector.
  static std::vector<int32_t> ids(const TextDataset& ds, size_t i) {
    auto s = ds.ids(i);
    return {s.begin(), s.end()};
  }

  fs::path m_dir;
};

}  // namespace

// ------------------------------------------------------------------------------ CSV parsing

TEST(TextDatasetCsv, QuotesEscapesAndLineEnds) {
  std::vector<size_t> lines;
  const Rows rows = parse_csv(
      "text,label\r\n"
      "plain,1\r\n"
      "\"with, comma\",2\n"
      "\"say \"\"hi\"\"\",3\r\n"
      "\"two\r\nlines\",4\n"
      "\n\r\n"  // blank lines are skipped
      "\"\",5\n"
      "trailing,\n"
      "a\"b,6\r"  // a quote inside an unquoted field is a character; a lone \r ends a record
      "last,7",   // no final line end
      ',', &lines);
  const Rows want = {{"text", "label"},   {"plain", "1"},        {"with, comma", "2"},
                     {"say \"hi\"", "3"}, {"two\r\nlines", "4"}, {"", "5"},
                     {"trailing", ""},    {"a\"b", "6"},         {"last", "7"}};
  EXPECT_EQ(rows, want);
  EXPECT_EQ(lines, (std::vector<size_t>{1, 2, 3, 4, 5, 9, 10, 11, 12}));
}

TEST(TextDatasetCsv, TabsAndOtherDelimiters) {
  EXPECT_EQ(parse_csv("a\tb\n\"x\ty\"\t2\n", '\t'), (Rows{{"a", "b"}, {"x\ty", "2"}}));
  EXPECT_EQ(parse_csv("a;b\nx,y;2\n", ';'), (Rows{{"a", "b"}, {"x,y", "2"}}));
  EXPECT_THROW(CsvParser("", '"', "t.csv"), Error);
}

TEST(TextDatasetCsv, MalformedQuotes) {
  try {
    parse_csv("text,label\nok,1\n\"never closed,2\nmore,3\n");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.csv:3: unterminated quoted field"), std::string::npos) << e.what();
  }
  // Text after a closing quote joins the field, and a line of spaces is blank, as pandas reads
  // them (GLUE's TSVs hold such rows).
  const auto rows = parse_csv("text,label\n\"closed\"x,1\n   \n\"quoted start\" and more,2\n");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[1][0], "closedx");
  EXPECT_EQ(rows[2][0], "quoted start and more");
  EXPECT_EQ(rows[2][1], "2");
}

TEST(TextDatasetCsv, HashIsStableAndSensitive) {
  EXPECT_EQ(hash64("hello"), hash64("hello"));
  EXPECT_NE(hash64("hello"), hash64("hellp"));
  EXPECT_NE(hash64(""), hash64(std::string(1, '\0')));
  // Streaming in pieces equals one call, whatever the split.
  std::string s(1000, 'x');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(i * 7 + 3);
  for (size_t cut : {0, 1, 31, 32, 33, 500, 999}) {
    Hash64 h;
    h.update(s.substr(0, cut)).update(s.substr(cut));
    EXPECT_EQ(h.digest(), hash64(s)) << cut;
  }
  Hash64 a, b;
  a.field("ab").field("c");
  b.field("a").field("bc");
  EXPECT_NE(a.digest(), b.digest());
}

// ------------------------------------------------------------------------------ loading

TEST_F(TextDatasetTest, JsonlWithStringLabels) {
  TextDataset ds = TextDataset::load(kSentiment, tokenizer(), no_cache());
  ASSERT_EQ(ds.size(), 197u);
  EXPECT_EQ(ds.seq_len(), 128);
  EXPECT_EQ(ds.cache_status(), CacheStatus::InMemory);
  const LabelSet& ls = ds.labels();
  EXPECT_EQ(ls.kind, LabelSet::Kind::Names);
  EXPECT_EQ(ls.names, (std::vector<std::string>{"negative", "neutral", "positive"}));
  EXPECT_EQ(ls.id2label(), (std::map<int, std::string>{{0, "negative"}, {1, "neutral"}, {2, "positive"}}));
  EXPECT_EQ(ls.label2id().at("positive"), 2);
  // The first line: {"text": "The meeting wasted the whole afternoon.", "label": "negative"}
  EXPECT_EQ(ds.label(0), 0);
  EXPECT_EQ(ids(ds, 0), tokenizer()
                            .encode("The meeting wasted the whole afternoon.", std::nullopt, 128,
                                    Truncation::LongestFirst, Padding::None)
                            .input_ids);
  std::set<int32_t> seen;
  for (size_t i = 0; i < ds.size(); ++i) seen.insert(ds.label(i));
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1, 2}));
}

TEST_F(TextDatasetTest, CsvIntegerLabelsAndColumnNames) {
  const std::string p = write("d.csv",
                              "id,sentence,y\n"
                              "1,\"Hello, world.\",3\n"
                              "2,Good morning,0\n");
  TextDataOptions o = no_cache();
  o.text_column = "sentence";
  o.label_column = "y";
  TextDataset ds = TextDataset::load(p, tokenizer(), o);
  ASSERT_EQ(ds.size(), 2u);
  // Labels 3 and 0 are two classes, numbered in numeric order as run_glue.py numbers them.
  EXPECT_EQ(ds.labels().kind, LabelSet::Kind::Names);
  EXPECT_EQ(ds.labels().names, (std::vector<std::string>{"0", "3"}));
  EXPECT_EQ(ds.label(0), 1);
  EXPECT_EQ(ds.label(1), 0);
  EXPECT_EQ(ids(ds, 0),
            tokenizer().encode("Hello, world.", std::nullopt, 128, Truncation::LongestFirst, Padding::None).input_ids);
  // Strings and integers mixed (issue 19): refused at the first label of the other kind.
  const std::string q = write("m.csv", "text,label\na,10\nb,2\nc,x\n");
  try {
    TextDataset::load(q, tokenizer(), no_cache());
    ADD_FAILURE() << "a label column mixing ids and names was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("m.csv:4: label 'x' is a name but line 2's label '10' is an integer"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(TextDatasetTest, TsvByExtensionAndDelimiterOption) {
  TextDataset tsv = TextDataset::load(write("d.tsv", "text\tlabel\nit works, really\tpos\n"), tokenizer(), no_cache());
  ASSERT_EQ(tsv.size(), 1u);
  EXPECT_EQ(tsv.labels().names, std::vector<std::string>{"pos"});
  TextDataOptions o = no_cache();
  o.delimiter = ';';
  TextDataset semi = TextDataset::load(write("d.csv", "label;text\nneg;a, b\n"), tokenizer(), o);
  EXPECT_EQ(ids(semi, 0),
            tokenizer().encode("a, b", std::nullopt, 128, Truncation::LongestFirst, Padding::None).input_ids);
  o.format = TextFormat::Tsv;
  o.delimiter = 0;
  EXPECT_EQ(TextDataset::load(write("d.data", "text\tlabel\nx\t1\n"), tokenizer(), o).size(), 1u);
  expect_error(write("d.parquet", "x"), {"d.parquet: cannot tell the format"});
}

TEST_F(TextDatasetTest, PairColumns) {
  const std::string p = write("pairs.jsonl",
                              "{\"premise\": \"A man plays a guitar.\", \"hypothesis\": \"Someone makes music.\", "
                              "\"label\": \"entailment\"}\n"
                              "{\"premise\": \"The cat sleeps.\", \"hypothesis\": \"The cat runs.\", "
                              "\"label\": \"contradiction\"}\n");
  TextDataOptions o = no_cache();
  o.text_column = "premise";
  o.text_pair_column = "hypothesis";
  o.max_length = 12;
  TextDataset ds = TextDataset::load(p, tokenizer(), o);
  ASSERT_EQ(ds.size(), 2u);
  const Encoding e = tokenizer().encode("A man plays a guitar.", std::string_view("Someone makes music."), 12,
                                        Truncation::LongestFirst, Padding::None);
  EXPECT_EQ(ids(ds, 0), e.input_ids);
  auto ty = ds.types(0);
  EXPECT_EQ(std::vector<int32_t>(ty.begin(), ty.end()), e.token_type_ids);
  EXPECT_EQ(ds.length(0), 12);  // truncated longest-first
  EXPECT_EQ(ty[11], 1);
  EXPECT_EQ(ds.labels().names, (std::vector<std::string>{"contradiction", "entailment"}));
  o.text_pair_column = "missing";
  expect_error(p, {"pairs.jsonl:1: no field 'missing'"}, o);
}

// Note [joined text columns]: run_classification.py's --text_column_names title,body is one text,
// the values joined by a space (it was read as a pair), from JSON Lines and CSV alike.
TEST_F(TextDatasetTest, JoinedTextColumnsAreOneText) {
  const std::string j = write("j.jsonl", "{\"title\": \"A fine film\", \"body\": \"with a good plot\", \"label\": \"pos\"}\n");
  const std::string c = write("c.csv", "title,body,label\nA fine film,with a good plot,pos\n");
  TextDataOptions o = no_cache();
  o.text_column = std::string("title") + kColumnJoin + "body";
  const Encoding want = tokenizer().encode("A fine film with a good plot", std::nullopt, 128, Truncation::LongestFirst,
                                           Padding::None);
  for (const std::string& p : {j, c}) {
    TextDataset ds = TextDataset::load(p, tokenizer(), o);
    ASSERT_EQ(ds.size(), 1u);
    EXPECT_EQ(ids(ds, 0), want.input_ids) << p;
    auto ty = ds.types(0);
    EXPECT_EQ(std::count(ty.begin(), ty.end(), 1), 0) << "one text, not a pair";
  }
  o.text_column = std::string("title") + kColumnJoin + "abstract";
  expect_error(j, {"j.jsonl:1: no field 'abstract'"}, o);
  expect_error(c, {"c.csv:1: no column 'abstract'"}, o);
}

// Note [run_glue.py's text columns]: with no text column named, a file without `text` is read
// as run_glue.py reads a --train_file; one with `text` (or a named column) as before.
TEST(TextDatasetColumns, RunGlueChoosesFromTheColumnsBesideTheLabel) {
  auto pick = [](std::vector<std::string> names, const std::string& label) {
    const RecordColumns c = glue_text_columns(names, label);
    return std::vector<std::string>{c.text, c.text_pair, c.label};
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pick({"sentence", "label"}, "label"), (V{"sentence", "", "label"}));
  EXPECT_EQ(pick({"label", "premise", "hypothesis"}, "label"), (V{"premise", "hypothesis", "label"}));
  EXPECT_EQ(pick({"idx", "sentence2", "label", "sentence1"}, "label"), (V{"sentence1", "sentence2", "label"}));
  EXPECT_EQ(pick({"review", "stars", "extra"}, "stars"), (V{"review", "extra", "stars"}));
  EXPECT_EQ(pick({"a", "b"}, ""), (V{"a", "b", ""}));
  EXPECT_EQ(pick({"sentence", "label"}, ""), (V{"sentence", "", ""}));  // "label" is set aside by name too
  EXPECT_EQ(pick({"label"}, "label"), (V{"", "", "label"}));
}

// run_mlm.py's column: the first one when the file lacks `text`; `text`, an unnamed first column
// (a pandas index) or a file that cannot be read leave the column as it is.
TEST_F(TextDatasetTest, RunMlmColumnIsTheFirstOne) {
  auto column = [&](const std::string& name, const std::string& data) {
    TextDataOptions o = no_cache();
    use_run_mlm_column(o, write(name, data));
    return o.text_column;
  };
  EXPECT_EQ(column("a.csv", "sentence,source\nthe cat sat,web\n"), "sentence");
  EXPECT_EQ(column("b.jsonl", "{\"body\": \"the cat\", \"id\": 3}\n"), "body");
  EXPECT_EQ(column("c.csv", "source,text\nweb,the cat sat\n"), "text");
  EXPECT_EQ(column("d.csv", ",sentence\n0,the cat sat\n"), "text");
  EXPECT_EQ(column("e.jsonl", "not json\n"), "text");
  EXPECT_TRUE(is_lines_file("corpus.TXT") && is_lines_file("a/b.txt") && !is_lines_file("a.csv") && !is_lines_file("txt"));
}

TEST_F(TextDatasetTest, RunGlueColumnsWhenNoneIsNamed) {
  // The first record's columns in file order: a header (after a byte-order mark), or the first
  // JSON line's keys as written, not sorted.
  EXPECT_EQ(text_file_columns(write("h.csv", "\xEF\xBB\xBFsentence,label\nx,1\n"), TextFormat::Auto, 0),
            (std::vector<std::string>{"sentence", "label"}));
  EXPECT_EQ(text_file_columns(write("k.jsonl", "\n{\"zeta\": \"x\", \"alpha\": \"y\", \"label\": 0}\n"),
                              TextFormat::Auto, 0),
            (std::vector<std::string>{"zeta", "alpha", "label"}));
  EXPECT_TRUE(text_file_columns((m_dir / "absent.csv").string(), TextFormat::Auto, 0).empty());

  TextDataOptions o = no_cache();
  o.source_flag = "--train-file";
  o.max_length = 16;
  auto resolved = [&](const std::string& path) {  // what training does when no text column is named
    TextDataOptions r = o;
    use_run_glue_columns(r, path);
    return r;
  };
  auto load = [&](const std::string& path) { return TextDataset::load(path, tokenizer(), resolved(path)); };
  // sentence,label: the sentence is the text, as the file's own `text` would have been.
  const TextDataset one = load(write("s.csv", "sentence,label\nthe cat sat,1\na dog ran,0\n"));
  TextDataOptions named = no_cache();
  named.text_column = "sentence";
  named.max_length = 16;
  const TextDataset want = TextDataset::load(write("s2.csv", "sentence,label\nthe cat sat,1\na dog ran,0\n"), tokenizer(), named);
  ASSERT_EQ(one.size(), 2u);
  EXPECT_EQ(ids(one, 0), ids(want, 0));
  EXPECT_EQ(ids(one, 1), ids(want, 1));
  // Two columns beside the label: a pair, text first, as written.
  const TextDataset pair = load(write("p.jsonl", "{\"premise\": \"the cat sat\", \"hypothesis\": \"a dog ran\", \"label\": 0}\n"));
  const Encoding e = tokenizer().encode("the cat sat", std::string_view("a dog ran"), 16, Truncation::LongestFirst,
                                        Padding::None);
  EXPECT_EQ(ids(pair, 0), e.input_ids);
  // A file with `text` reads it, whatever else it holds.
  const TextDataset text = load(write("t.csv", "sentence,text,label\nthe cat sat,a dog ran,1\n"));
  EXPECT_EQ(ids(text, 0), ids(want, 1));
  // Named columns are never second-guessed: unresolved, the missing `text` is an error.
  expect_error(write("n.csv", "sentence,label\nx,1\n"), {"n.csv:1: no column 'text'"});
  // Only a label column: nothing to choose; the error names what is missing.
  const std::string l = write("l.csv", "label\n1\n");
  expect_error(l, {"l.csv:1: no column 'text'"}, resolved(l));
}

// ------------------------------------------------------------------------------ cache

TEST_F(TextDatasetTest, CacheIsCreatedOnceAndReused) {
  const std::string p =
      write("s.jsonl", std::string(std::istreambuf_iterator<char>(std::ifstream(kSentiment).rdbuf()), {}));
  TextDataset first = TextDataset::load(p, tokenizer());
  EXPECT_EQ(first.cache_status(), CacheStatus::Created);
  ASSERT_TRUE(fs::exists(first.cache_path()));
  EXPECT_EQ(fs::path(first.cache_path()).parent_path(), m_dir);
  struct stat before {};
  ASSERT_EQ(::stat(first.cache_path().c_str(), &before), 0);

  TextDataset second = TextDataset::load(p, tokenizer());
  EXPECT_EQ(second.cache_status(), CacheStatus::Reused);  // mapped, not re-tokenized
  EXPECT_EQ(second.cache_path(), first.cache_path());
  struct stat after {};
  ASSERT_EQ(::stat(second.cache_path().c_str(), &after), 0);
  EXPECT_EQ(before.st_mtim.tv_sec, after.st_mtim.tv_sec);
  EXPECT_EQ(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
  EXPECT_EQ(before.st_ino, after.st_ino);
  ASSERT_EQ(second.size(), first.size());
  EXPECT_EQ(second.labels(), first.labels());
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(ids(second, i), ids(first, i));
    EXPECT_EQ(second.label(i), first.label(i));
  }
  // A moved dataset keeps its mapping.
  TextDataset moved = std::move(second);
  EXPECT_EQ(ids(moved, 5), ids(first, 5));

  // Other options make another cache; a cache directory holds it elsewhere.
  TextDataOptions o;
  o.max_length = 16;
  TextDataset shorter = TextDataset::load(p, tokenizer(), o);
  EXPECT_EQ(shorter.cache_status(), CacheStatus::Created);
  EXPECT_NE(shorter.cache_path(), first.cache_path());
  o.cache_dir = (m_dir / "cache").string();
  TextDataset elsewhere = TextDataset::load(p, tokenizer(), o);
  EXPECT_EQ(elsewhere.cache_status(), CacheStatus::Created);
  EXPECT_EQ(fs::path(elsewhere.cache_path()).parent_path(), m_dir / "cache");
  EXPECT_EQ(TextDataset::load(p, tokenizer(), o).cache_status(), CacheStatus::Reused);
}

TEST_F(TextDatasetTest, CacheIsInvalidatedWhenTheDataChanges) {
  const std::string p = write("d.csv", "text,label\nthe first text,a\nthe second,b\n");
  TextDataset a = TextDataset::load(p, tokenizer());
  EXPECT_EQ(a.cache_status(), CacheStatus::Created);
  write("d.csv", "text,label\nthe first text,a\nthe second one,b\n");  // same labels, one more word
  fs::last_write_time(a.cache_path(), fs::last_write_time(p) - std::chrono::hours(1));  // made before the edit
  TextDataset b = TextDataset::load(p, tokenizer());
  EXPECT_EQ(b.cache_status(), CacheStatus::Created);
  EXPECT_NE(b.cache_path(), a.cache_path());
  EXPECT_EQ(b.length(1), a.length(1) + 1);
  // Note [stale token caches]: the earlier version's cache is gone; a cache of other options made
  // since the edit stays when yet another is written.
  EXPECT_FALSE(fs::exists(a.cache_path()));
  TextDataOptions shorter;
  shorter.max_length = 64;
  TextDataset other = TextDataset::load(p, tokenizer(), shorter);
  EXPECT_EQ(other.cache_status(), CacheStatus::Created);
  EXPECT_TRUE(fs::exists(b.cache_path()));
  // A damaged cache is rebuilt, not trusted.
  {
    std::fstream f(b.cache_path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64);
    const uint64_t bogus = 12345;
    f.write(reinterpret_cast<const char*>(&bogus), 8);
  }
  TextDataset c = TextDataset::load(p, tokenizer());
  EXPECT_EQ(c.cache_status(), CacheStatus::Created);
  EXPECT_EQ(ids(c, 1), ids(b, 1));
}

TEST_F(TextDatasetTest, UnwritableCacheFallsBackToMemory) {
  TextDataOptions o;
  o.cache_dir = "/proc/no-such-dir";
  TextDataset ds = TextDataset::load(write("d.csv", "text,label\nx,1\n"), tokenizer(), o);
  EXPECT_EQ(ds.cache_status(), CacheStatus::InMemory);
  EXPECT_TRUE(ds.cache_path().empty());
  EXPECT_EQ(ds.size(), 1u);
}

// ------------------------------------------------------------------------------ batches

TEST_F(TextDatasetTest, PaddingMasksAndDynamicPadding) {
  const std::string p = write("d.csv", "text,label\nhello world,0\na much longer sentence than the first one,1\n");
  TextDataOptions o = no_cache();
  o.max_length = 16;
  TextDataset ds = TextDataset::load(p, tokenizer(), o);
  const int64_t l0 = ds.length(0), l1 = ds.length(1);
  EXPECT_EQ(l0, 4);  // [CLS] hello world [SEP]
  EXPECT_GT(l1, l0);

  HostBatch full;
  full.resize(2, ds.seq_len());
  std::fill(full.input_ids.begin(), full.input_ids.end(), -7);  // poison
  ds.get(1, full, 0);
  ds.get(0, full, 1);
  for (int64_t t = 0; t < 16; ++t) {
    EXPECT_EQ(full.attention_mask[t], t < l1 ? 1 : 0);
    EXPECT_EQ(full.attention_mask[16 + t], t < l0 ? 1 : 0);
    if (t >= l0) {
      EXPECT_EQ(full.input_ids[16 + t], tokenizer().pad_id());
    }
    EXPECT_EQ(full.token_type_ids[16 + t], 0);
  }
  EXPECT_EQ(full.input_ids[16], tokenizer().cls_id());
  EXPECT_EQ(full.input_ids[16 + l0 - 1], tokenizer().sep_id());
  EXPECT_EQ(full.labels, (std::vector<int32_t>{1, 0}));

  // Dynamic padding: the batch is as long as its longest sample.
  EXPECT_EQ(ds.longest_in({0}), l0);
  EXPECT_EQ(ds.longest_in({0, 1}), l1);
  HostBatch dyn;
  dyn.resize(2, ds.longest_in({0, 1}));
  ds.get(0, dyn, 0);
  ds.get(1, dyn, 1);
  for (int64_t t = 0; t < l1; ++t) {
    EXPECT_EQ(dyn.input_ids[l1 + t], full.input_ids[t]);
    EXPECT_EQ(dyn.attention_mask[t], t < l0 ? 1 : 0);
  }
  HostBatch too_short;
  too_short.resize(1, l0);
  EXPECT_THROW(ds.get(1, too_short, 0), Error);
}

TEST(TextDatasetBatches, BucketingCoversEveryIndexOnce) {
  std::vector<int64_t> lengths(1003);
  for (size_t i = 0; i < lengths.size(); ++i) lengths[i] = 2 + static_cast<int64_t>((i * 7919) % 126);
  // Padded tokens of a batch list: each batch costs its longest sample times its size.
  auto padded_tokens = [&](const std::vector<std::vector<size_t>>& batches) {
    int64_t padded = 0;
    for (const auto& b : batches) {
      int64_t longest = 0;
      for (size_t i : b) longest = std::max(longest, lengths[i]);
      padded += longest * static_cast<int64_t>(b.size());
    }
    return padded;
  };
  for (int64_t batch : {1, 8, 32}) {
    const auto batches = bucketed_batches(lengths, batch, 42, 5);
    std::vector<size_t> all;
    size_t short_batches = 0;
    for (const auto& b : batches) {
      ASSERT_FALSE(b.empty());
      ASSERT_LE(b.size(), static_cast<size_t>(batch));
      short_batches += b.size() < static_cast<size_t>(batch);
      all.insert(all.end(), b.begin(), b.end());
    }
    std::sort(all.begin(), all.end());
    ASSERT_EQ(all.size(), lengths.size());
    for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], i);
    EXPECT_LE(short_batches, 1u);
    if (batch > 1) {  // sorting within chunks pads far less than random batches (one-batch chunks)
      const int64_t bucketed = padded_tokens(batches), random = padded_tokens(bucketed_batches(lengths, batch, 42, 1));
      EXPECT_LT(bucketed * 4, random * 3) << bucketed << " vs " << random;
    }
  }
  EXPECT_EQ(bucketed_batches(lengths, 8, 1), bucketed_batches(lengths, 8, 1));
  EXPECT_NE(bucketed_batches(lengths, 8, 1), bucketed_batches(lengths, 8, 2));
  EXPECT_TRUE(bucketed_batches({}, 4, 1).empty());
}

TEST(TextDatasetBatches, SplitIsDisjointAndDeterministic) {
  const TrainValSplit s = split(100, 0.1, 7);
  EXPECT_EQ(s.val.size(), 10u);
  EXPECT_EQ(s.train.size(), 90u);
  std::vector<size_t> all = s.train;
  all.insert(all.end(), s.val.begin(), s.val.end());
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i < 100; ++i) EXPECT_EQ(all[i], i);
  EXPECT_TRUE(std::is_sorted(s.val.begin(), s.val.end()));
  EXPECT_EQ(split(100, 0.1, 7).val, s.val);
  EXPECT_NE(split(100, 0.1, 8).val, s.val);
  EXPECT_EQ(split(3, 0.01, 1).val.size(), 1u);  // at least one
  EXPECT_EQ(split(3, 0.99, 1).train.size(), 1u);
  EXPECT_THROW(split(1, 0.5, 1), Error);
  EXPECT_THROW(split(10, 1.0, 1), Error);
}

TEST_F(TextDatasetTest, SplitSubsetAndSeparateValidationFile) {
  TextDataset train = TextDataset::load(kSentiment, tokenizer(), no_cache());
  const TrainValSplit s = split(train, 0.2, 3);
  SubsetDataset val(train, s.val);
  ASSERT_EQ(val.size(), s.val.size());
  HostBatch a, b;
  a.resize(1, val.seq_len());
  b.resize(1, val.seq_len());
  val.get(2, a, 0);
  train.get(s.val[2], b, 0);
  EXPECT_EQ(a.input_ids, b.input_ids);
  EXPECT_EQ(a.labels, b.labels);

  // A validation file is read with the training labels: ids agree, an unknown label is an error.
  TextDataOptions o = no_cache();
  o.labels = train.labels();
  TextDataset v =
      TextDataset::load(write("val.jsonl", "{\"text\": \"meh\", \"label\": \"positive\"}\n"), tokenizer(), o);
  EXPECT_EQ(v.label(0), 2);
  EXPECT_EQ(v.labels(), train.labels());
  expect_error(
      write("bad.jsonl", "{\"text\": \"a\", \"label\": \"negative\"}\n\n{\"text\": \"b\", \"label\": \"angry\"}\n"),
      {"bad.jsonl:3: unknown label 'angry'", "'negative', 'neutral', 'positive'"}, o);
  o.labels = LabelSet::ids(2);
  expect_error(write("ids.csv", "text,label\na,1\nb,2\n"), {"ids.csv:3: unknown label 2", "0..1"}, o);
  expect_error(write("ids2.csv", "text,label\na,pos\n"), {"ids2.csv:2: unknown label 'pos'"}, o);
  // From a config's id2label.
  EXPECT_EQ(LabelSet::from_id2label({{0, "LABEL_0"}, {1, "LABEL_1"}}), LabelSet::ids(2));
  EXPECT_EQ(LabelSet::from_id2label({{0, "neg"}, {1, "pos"}}).names, (std::vector<std::string>{"neg", "pos"}));
}

// Integer labels as run_glue.py takes them: the sorted distinct values are the classes 0..n-1.
// 0..n-1 keep their ids (transformers' default names); any other set is named by its values, in
// numeric order, so star ratings 1..5 make five classes, not six with class 0 unused.
TEST_F(TextDatasetTest, IntegerLabelsAreNumberedAsRunGlueNumbersThem) {
  TextDataset dense = TextDataset::load(write("dense.csv", "text,label\na,2\nb,0\nc,1\nd,2\n"), tokenizer(), no_cache());
  EXPECT_EQ(dense.labels(), LabelSet::ids(3));
  EXPECT_EQ(dense.label(0), 2);

  TextDataset stars = TextDataset::load(write("stars.csv", "text,label\na,5\nb,1\nc,10\nd,2\ne,9\nf,5\n"),
                                        tokenizer(), no_cache());
  EXPECT_EQ(stars.labels().names, (std::vector<std::string>{"1", "2", "5", "9", "10"}));  // numeric, not byte order
  std::vector<int32_t> got;
  for (size_t i = 0; i < stars.size(); ++i) got.push_back(stars.label(i));
  EXPECT_EQ(got, (std::vector<int32_t>{2, 0, 4, 1, 3, 2}));
  EXPECT_EQ(stars.labels().id2label().at(0), "1");  // what config.json records; run_glue.py writes the number 1

  TextDataset signs = TextDataset::load(write("signs.jsonl", "{\"text\": \"a\", \"label\": 1}\n"
                                                             "{\"text\": \"b\", \"label\": -1}\n"),
                                        tokenizer(), no_cache());
  EXPECT_EQ(signs.labels().names, (std::vector<std::string>{"-1", "1"}));
  EXPECT_EQ(signs.label(1), 0);

  // A validation file is read through the training classes: the same values, however written;
  // a value the training file lacks is refused naming the file, line and classes.
  TextDataOptions o = no_cache();
  o.labels = stars.labels();
  TextDataset v = TextDataset::load(write("v.csv", "text,label\na,10\nb,01\n"), tokenizer(), o);
  EXPECT_EQ(v.label(0), 4);
  EXPECT_EQ(v.label(1), 0);
  expect_error(write("v3.csv", "text,label\na,1\nb,3\n"), {"v3.csv:3: unknown label '3'", "'1', '2', '5'"}, o);
  EXPECT_EQ(stars.labels().id_of_integer(9), 3);
  EXPECT_EQ(stars.labels().id_of_integer(3), -1);
  EXPECT_EQ(LabelSet::ids(3).id_of_integer(3), -1);
  EXPECT_EQ(LabelSet::from_integers({4, 0, 4}).names, (std::vector<std::string>{"0", "4"}));
}

// Boolean labels in JSON Lines are two classes, named as Python prints them (run_glue.py sorts the
// distinct labels: False, True); they were refused.
TEST_F(TextDatasetTest, BooleanLabelsAreTwoClasses) {
  TextDataset ds = TextDataset::load(write("b.jsonl", "{\"text\": \"a\", \"label\": true}\n"
                                                      "{\"text\": \"b\", \"label\": false}\n"),
                                     tokenizer(), no_cache());
  EXPECT_EQ(ds.labels().names, (std::vector<std::string>{"False", "True"}));
  EXPECT_EQ(ds.label(0), 1);
  EXPECT_EQ(ds.label(1), 0);
}

// ------------------------------------------------------------------------------ hostile input

TEST_F(TextDatasetTest, InvalidUtf8IsReplacedNotFatal) {
  // \xff and a truncated \xe2\x82 are ill-formed; they become U+FFFD, which cleaning drops.
  const std::string bad =
      "good \xff"
      "day \xe2\x82";
  // Said once per file, with the count and the first line (Note [ill-formed UTF-8] in data/csv.cpp).
  testing::internal::CaptureStderr();
  TextDataset csv = TextDataset::load(write("u.csv", "text,label\nfine,l\n" + bad + ",l\xfe\n" + bad + ",l\n"),
                                      tokenizer(), no_cache());
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("u.csv: 2 records with bytes that are not UTF-8"), std::string::npos) << said;
  EXPECT_NE(said.find("(the first at line 3)"), std::string::npos) << said;
  // An empty text trains as the special tokens alone (pandas would read NaN): said the same way.
  testing::internal::CaptureStderr();
  TextDataset::load(write("e.csv", "text,label\nfine,l\n,l\n  ,m\n"), tokenizer(), no_cache());
  const std::string empty = testing::internal::GetCapturedStderr();
  EXPECT_NE(empty.find("e.csv: 2 records with an empty text, trained on as the special tokens alone (the first at line 3)"),
            std::string::npos)
      << empty;
  TextDataset jsonl =
      TextDataset::load(write("u.jsonl", "{\"text\": \"" + bad + "\", \"label\": 1}\n"), tokenizer(), no_cache());
  const auto want =
      tokenizer().encode("good day", std::nullopt, 128, Truncation::LongestFirst, Padding::None).input_ids;
  EXPECT_EQ(ids(csv, 1), want);
  EXPECT_EQ(ids(jsonl, 0), want);
  EXPECT_EQ(csv.labels().names, (std::vector<std::string>{"l", "l\xEF\xBF\xBD"}));  // valid UTF-8 for config.json
  EXPECT_EQ(sanitize_utf8("ok"), "ok");
  EXPECT_EQ(sanitize_utf8("a\xc3"), "a\xEF\xBF\xBD");
}

TEST_F(TextDatasetTest, MissingColumnsAndFields) {
  expect_error(write("c.csv", "sentence,label\nx,1\n"), {"c.csv:1: no column 'text'", "'sentence', 'label'"});
  // A repeated name is read as pandas reads it (text, text.1), not refused.
  TextDataOptions second = no_cache();
  second.text_column = "text.1";
  const TextDataset dup = TextDataset::load(write("c2.csv", "text,text,label\nx,y,1\n"), tokenizer(), second);
  EXPECT_EQ(ids(dup, 0), tokenizer().encode("y", std::nullopt, 128, Truncation::LongestFirst, Padding::None).input_ids);
  std::vector<std::string> h{"a", "a", "a.1", "a"};
  mangle_duplicate_columns(h);
  EXPECT_EQ(h, (std::vector<std::string>{"a", "a.2", "a.1", "a.3"}));
  expect_error(write("j.jsonl", "{\"text\": \"a\", \"label\": 0}\n{\"txt\": \"b\", \"label\": 1}\n"),
               {"j.jsonl:2: no field 'text'", "'label', 'txt'"});
  expect_error(write("j2.jsonl", "{\"text\": \"a\"}\n"), {"j2.jsonl:1: no field 'label'"});
  expect_error(write("j3.jsonl", "{\"text\": 5, \"label\": 0}\n"), {"j3.jsonl:1: field 'text' must be a string"});
  expect_error(write("j4.jsonl", "{\"text\": \"a\", \"label\": 0.5}\n"), {"j4.jsonl:1: label", "0.5"});
  expect_error(write("big_id.csv", "text,label\na,0\nb,99999999999999999999\n"),
               {"big_id.csv:3: label '99999999999999999999' is not a 64-bit integer"});
  expect_error(write("r.csv", "text,label\na,1\nb,2,3\n"), {"r.csv:3: 3 fields where the header has 2"});
  // Unlabelled files need no label column.
  TextDataOptions o = no_cache();
  o.label_column = "";
  TextDataset ds = TextDataset::load(write("u.csv", "text\nx\n"), tokenizer(), o);
  EXPECT_EQ(ds.labels().kind, LabelSet::Kind::None);
  EXPECT_EQ(ds.label(0), 0);
}

TEST_F(TextDatasetTest, MalformedJsonAndQuotes) {
  expect_error(write("m.jsonl", "{\"text\": \"a\", \"label\": 0}\r\n{\"text\": \"b\", \"label\": 1\r\n"),
               {"m.jsonl:2: not valid JSON"});
  // A number too large for a double is not a parse error to nlohmann but out_of_range.
  expect_error(write("m3.jsonl", "{\"text\": \"a\", \"label\": 1e999}\n"), {"m3.jsonl:1: not valid JSON", "overflow"});
  expect_error(write("m2.jsonl", "{\"text\": \"a\", \"label\": 0}\n[1, 2]\n"), {"m2.jsonl:2: expected a JSON object"});
  expect_error(write("arr.json", "[{\"text\": \"a\", \"label\": 0}]"), {"arr.json:1: a JSON array"});
  expect_error(write("q.csv", "text,label\na,1\n\"open,2\nb,3\n"), {"q.csv:3: unterminated quoted field"});
  // Text after a closing quote joins the field, as pandas reads it: not an error.
  TextDataOptions o = no_cache();
  const TextDataset q2 = TextDataset::load(write("q2.tsv", "text\tlabel\n\"x\" y\t1\n\"z\"\t1\n"), tokenizer(), o);
  EXPECT_EQ(ids(q2, 0), tokenizer().encode("x y", std::nullopt, 128, Truncation::LongestFirst, Padding::None).input_ids);
}

TEST_F(TextDatasetTest, EmptyAndBlankFiles) {
  expect_error(write("e.jsonl", ""), {"e.jsonl: the file is empty"});
  expect_error(write("e.csv", ""), {"e.csv: the file is empty"});
  expect_error(write("b.jsonl", "\n  \n\r\n"), {"b.jsonl: no samples"});
  expect_error(write("h.csv", "text,label\n"), {"h.csv: no samples (only a header)"});
  expect_error(write("n.csv", "\n\n"), {"n.csv: no header row"});
  expect_error((m_dir / "absent.csv").string(), {"absent.csv: cannot open (No such file or directory)"});
  expect_error(m_dir.string() + "/", {": cannot tell the format"});
  TextDataOptions o = no_cache();
  o.format = TextFormat::Csv;
  expect_error(m_dir.string(), {"not a regular file"}, o);
  o.max_length = 1;
  expect_error(write("x.csv", "text,label\na,1\n"),
               {"x.csv: --max-seq-length 1 cannot hold a text's special tokens: it must lie in [2, 16777216]"}, o);
  o.max_length = 2;
  o.text_pair_column = "text";
  expect_error(write("x2.csv", "text,label\na,1\n"), {"x2.csv: --max-seq-length 2 cannot hold a text pair's"}, o);
}

// Note [files that change while read]: a data file cut short (or rewritten) by another process
// while it is read is an error naming it; mapped, the cut ended the run with SIGBUS.
// Each changes the file once, after the first chunk read.
std::string g_changing_file;
bool g_changed = false;
void cut_the_file_short() {
  if (!std::exchange(g_changed, true)) fs::resize_file(g_changing_file, 10);
}
void append_to_the_file() {
  if (!std::exchange(g_changed, true))
    std::ofstream(g_changing_file, std::ios::app) << "{\"text\": \"more\", \"label\": \"a\"}\n";
}

TEST_F(TextDatasetTest, AFileThatChangesWhileReadIsRefusedNamingIt) {
  std::string rows;
  while (rows.size() < 300'000) rows += "{\"text\": \"a sample of text\", \"label\": \"pos\"}\n";
  for (void (*change)() : {cut_the_file_short, append_to_the_file}) {
    g_changing_file = write("c.jsonl", rows);
    g_changed = false;
    try {
      anatomy::detail::read_regular_file(g_changing_file, "--train-file", change);
      ADD_FAILURE() << "a file that changed while read was taken";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("--train-file " + g_changing_file + ": the file changed while it was read"), std::string::npos) << m;
    }
  }
  // Unchanged, the same file reads whole, and loads.
  const std::string p = write("c.jsonl", rows);
  EXPECT_EQ(anatomy::detail::read_regular_file(p, "", nullptr), rows);
  EXPECT_GT(TextDataset::load(p, tokenizer(), no_cache()).size(), 5000u);
}

TEST_F(TextDatasetTest, HugeLines) {
  // 10 MB of text on one line is within the 16 MiB bound: read, tokenized and truncated.
  std::string big;
  big.reserve(10'000'100);
  while (big.size() < 10'000'000) big += "lorem ipsum ";
  TextDataOptions o = no_cache();
  o.max_length = 32;
  TextDataset ds = TextDataset::load(
      write("big.jsonl", "{\"text\": \"short\", \"label\": 0}\n{\"text\": \"" + big + "\", \"label\": 1}\n"),
      tokenizer(), o);
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_EQ(ds.length(1), 32);
  TextDataset csv =
      TextDataset::load(write("big.csv", "text,label\n\"" + big.substr(0, 1'000'000) + "\",1\n"), tokenizer(), o);
  EXPECT_EQ(csv.length(0), 32);
  // Beyond the bound: one line naming the record, nothing buffered.
  o.max_record_bytes = 1 << 20;
  expect_error(write("big2.jsonl", "{\"text\": \"a\", \"label\": 0}\n{\"text\": \"" + big + "\"}\n"),
               {"big2.jsonl:2: line longer than 1048576 bytes (the most a record may hold); split it"}, o);
  expect_error(write("big3.csv", "text,label\nx,0\n" + big + ",1\n"), {"big3.csv:3: record longer than 1048576 bytes"},
               o);
  expect_error(write("big4.csv", "text,label\n\"" + big + "\",1\n"), {"big4.csv:2: record longer than"}, o);
}
