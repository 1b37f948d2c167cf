// Hub names resolved from a local Hugging Face cache laid out by hand as huggingface_hub lays it
// out (Note [hub cache layout], src/io/hub.h); no server. Downloads: test_hub_download.cpp.
#include <gtest/gtest.h>

#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "../common/dirs.h"
#include "core/error.h"
#include "io/hub.h"
#include "io/hub_sha256.h"

using namespace anatomy;
namespace fs = std::filesystem;

namespace {

const std::string kCommit = "0123456789abcdef0123456789abcdef01234567";

void spit(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

// Nothing listens on port 1: a test that reaches for the network fails there.
HubSettings settings(const std::string& cache) {
  HubSettings s;
  s.cache_dir = cache;
  s.endpoint = "http://127.0.0.1:1";
  return s;
}

// models--org--tiny with refs/main -> snapshots/<commit>/<file> -> ../../blobs/<sha>.
fs::path make_cached(const std::string& cache, const std::vector<std::string>& files) {
  const fs::path repo = fs::path(cache) / "models--org--tiny";
  spit(repo / "refs" / "main", kCommit);
  for (const std::string& f : files) {
    const std::string bytes = "contents of " + f;
    const std::string sha = sha256_hex(bytes);
    spit(repo / "blobs" / sha, bytes);
    fs::create_directories(repo / "snapshots" / kCommit);
    fs::create_symlink(fs::path("../../blobs") / sha, repo / "snapshots" / kCommit / f);
  }
  return repo / "snapshots" / kCommit;
}

// `f` must throw one anatomy::Error line containing every needle.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    for (const std::string& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "'" << n << "' not in: " << m;
  }
}

}  // namespace

TEST(HubSha256, KnownDigests) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // Two blocks, and a length whose padding spills into a second block.
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(sha256_hex(million), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Fed in uneven pieces, the digest is the same.
  Sha256 s;
  for (size_t i = 0; i < million.size();) {
    const size_t n = std::min<size_t>(1 + i % 97, million.size() - i);
    s.update(million.data() + i, n);
    i += n;
  }
  EXPECT_EQ(s.hex(), sha256_hex(million));
}

TEST(HubNames, ModelIdsAndRepoDirs) {
  for (const char* ok : {"bert-base-uncased", "google-bert/bert-base-uncased", "org/name.v2", "a_b/c-d"})
    EXPECT_TRUE(is_hub_model_id(ok)) << ok;
  for (const char* bad : {"", "a/b/c", "/abs", "./rel", "../up", "org/", "/name", "a--b/c", "a b", "org/..", "~/x"})
    EXPECT_FALSE(is_hub_model_id(bad)) << bad;
  HubSettings s;
  s.cache_dir = "/c";
  EXPECT_EQ(hub_repo_dir(s, "google-bert/bert-base-uncased"), "/c/models--google-bert--bert-base-uncased");
  EXPECT_EQ(hub_repo_dir(s, "bert-base-uncased"), "/c/models--bert-base-uncased");
}

TEST(HubResolve, ExistingDirectoryUnchanged) {
  const std::string dir = testing_dirs::fresh_dir("hub_local_dir");
  EXPECT_EQ(resolve_model(dir, ""), dir);
  EXPECT_EQ(resolve_model(dir, "", settings("/nonexistent")), dir);
}

TEST(HubResolve, FromCacheWithoutNetwork) {
  const std::string cache = testing_dirs::fresh_dir("hub_cache_only");
  const fs::path snap = make_cached(cache, {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"});
  // Online but with an endpoint that refuses connections: a complete snapshot needs no network.
  const std::string got = resolve_model("org/tiny", "", settings(cache));
  EXPECT_EQ(fs::path(got), snap);
  std::ifstream in(fs::path(got) / "vocab.txt");
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "contents of vocab.txt");
  // A revision given as a commit hash needs no ref.
  EXPECT_EQ(fs::path(resolve_model("org/tiny", kCommit, settings(cache))), snap);
}

TEST(HubResolve, OtherRevisionRef) {
  const std::string cache = testing_dirs::fresh_dir("hub_cache_rev");
  const fs::path snap = make_cached(cache, {"config.json", "model.safetensors", "tokenizer.json"});
  spit(fs::path(cache) / "models--org--tiny" / "refs" / "v1.0", kCommit);
  EXPECT_EQ(fs::path(resolve_model("org/tiny", "v1.0", settings(cache))), snap);
}

TEST(HubResolve, OfflineAndNotCachedNamesTheFetchCommand) {
  HubSettings s = settings(testing_dirs::fresh_dir("hub_cache_empty"));
  s.offline = true;
  expect_error([&] { resolve_model("org/absent", "", s); },
               {"org/absent", "HF_HUB_OFFLINE", "`huggingface-cli download org/absent`", s.cache_dir});
  expect_error([&] { resolve_model("org/absent", "v2", s); }, {"`huggingface-cli download org/absent --revision v2`"});
}

TEST(HubResolve, OfflineWithPartialSnapshotNamesWhatIsMissing) {
  const std::string cache = testing_dirs::fresh_dir("hub_cache_partial");
  make_cached(cache, {"config.json"});
  HubSettings s = settings(cache);
  s.offline = true;
  expect_error([&] { resolve_model("org/tiny", "", s); }, {"lacks model.safetensors", "huggingface-cli download org/tiny"});
}

TEST(HubResolve, OfflineWithoutTokenizerUsesWhatIsThere) {
  const std::string cache = testing_dirs::fresh_dir("hub_cache_notok");
  const fs::path snap = make_cached(cache, {"config.json", "model.safetensors"});
  HubSettings s = settings(cache);
  s.offline = true;
  EXPECT_EQ(fs::path(resolve_model("org/tiny", "", s)), snap);
}

TEST(HubResolve, ShardedWeightsRefused) {
  const std::string cache = testing_dirs::fresh_dir("hub_cache_sharded");
  make_cached(cache, {"config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors"});
  expect_error([&] { resolve_model("org/tiny", "", settings(cache)); }, {"org/tiny", "model.safetensors.index.json"});
}

TEST(HubResolve, BadNamesAndRevisions) {
  const HubSettings s = settings(testing_dirs::fresh_dir("hub_cache_bad"));
  expect_error([&] { resolve_model("./no/such/dir", "", s); }, {"./no/such/dir", "no such directory"});
  expect_error([&] { resolve_model("a/b/c", "", s); }, {"a/b/c", "not a Hugging Face model name"});
  expect_error([&] { resolve_model("org/tiny", "../../etc", s); }, {"--revision", "../../etc"});
  expect_error([&] { resolve_model("", "", s); }, {"--model_name_or_path"});
}

TEST(HubResolve, UnreachableEndpointNamesTheFetchCommand) {
  if (!hub_downloads_available()) GTEST_SKIP() << "built without libcurl";
  const HubSettings s = settings(testing_dirs::fresh_dir("hub_cache_unreachable"));
  expect_error([&] { resolve_model("org/tiny", "", s); }, {"org/tiny", "http://127.0.0.1:1", "huggingface-cli download org/tiny"});
}

TEST(HubResolve, WithoutLibcurlNamesTheFetchCommand) {
  if (hub_downloads_available()) GTEST_SKIP() << "built with libcurl";
  const HubSettings s = settings(testing_dirs::fresh_dir("hub_cache_nocurl"));
  expect_error([&] { resolve_model("org/tiny", "", s); }, {"org/tiny", "without libcurl", "huggingface-cli download org/tiny"});
}

namespace {
// Sets environment variables for one scope and puts the old values back.
class EnvGuard {
 public:
  void set(const char* name, const char* value) {
    const char* old = std::getenv(name);
    m_saved.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~EnvGuard() {
    for (auto it = m_saved.rbegin(); it != m_saved.rend(); ++it) {
      if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else ::unsetenv(it->first.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> m_saved;
};
}  // namespace

TEST(HubSettings, ReadAsHuggingfaceHubReadsThem) {
  const std::string home = testing_dirs::fresh_dir("hub_env_home");
  spit(fs::path(home) / "token", "hf_stored\n");
  EnvGuard env;
  for (const char* v : {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH",
                        "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "XDG_CACHE_HOME"})
    env.set(v, nullptr);
  env.set("HOME", "/home/someone");
  HubSettings s = hub_settings_from_env();
  EXPECT_EQ(s.cache_dir, "/home/someone/.cache/huggingface/hub");
  EXPECT_EQ(s.endpoint, "https://huggingface.co");
  EXPECT_FALSE(s.offline);

  env.set("XDG_CACHE_HOME", "/xdg");
  EXPECT_EQ(hub_settings_from_env().cache_dir, "/xdg/huggingface/hub");
  env.set("HF_HOME", home.c_str());
  s = hub_settings_from_env();
  EXPECT_EQ(s.cache_dir, home + "/hub");
  EXPECT_EQ(s.token, "hf_stored");  // $HF_HOME/token, whitespace trimmed
  env.set("HF_TOKEN", "hf_env");
  env.set("HF_HUB_CACHE", "~/hubcache");
  env.set("HF_ENDPOINT", "http://mirror.example/");
  env.set("HF_HUB_OFFLINE", "yes");
  s = hub_settings_from_env();
  EXPECT_EQ(s.token, "hf_env");
  EXPECT_EQ(s.cache_dir, "/home/someone/hubcache");
  EXPECT_EQ(s.endpoint, "http://mirror.example");
  EXPECT_TRUE(s.offline);
  EXPECT_EQ(s.offline_variable, "HF_HUB_OFFLINE");
  env.set("HF_HUB_OFFLINE", "0");
  EXPECT_FALSE(hub_settings_from_env().offline);
  env.set("TRANSFORMERS_OFFLINE", "1");  // the older variable: errors name the one the user set
  s = hub_settings_from_env();
  EXPECT_TRUE(s.offline);
  EXPECT_EQ(s.offline_variable, "TRANSFORMERS_OFFLINE");
  s.cache_dir = testing_dirs::fresh_dir("hub_cache_transformers_offline");
  expect_error([&] { resolve_model("org/absent", "", s); }, {"TRANSFORMERS_OFFLINE is set", "unset TRANSFORMERS_OFFLINE"});
}
