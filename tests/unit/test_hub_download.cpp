// Downloads into the Hugging Face cache from tests/hub_server.py, a stand-in for the Hub on
// 127.0.0.1 serving a bert-tiny-like fixture model (tests/data/golden + tests/data/tokenizer).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <atomic>
#include <vector>

#include "../common/dirs.h"
#include "core/error.h"
#include "io/hub.h"
#include "io/hub_sha256.h"

using namespace anatomy;
namespace fs = std::filesystem;

namespace {

const fs::path kSource = ANATOMY_SOURCE_DIR;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The Hub stand-in as a child process, stopped (by its pid) when the object goes.
class HubServer {
 public:
  HubServer(const std::string& dir, const std::vector<std::string>& extra) {
    // Two repositories anatomy cannot load: weights in shards, or only in PyTorch's format.
    const fs::path sharded = fs::path(dir) / "sharded", bin = fs::path(dir) / "bin_only";
    fs::create_directories(sharded);
    fs::create_directories(bin);
    for (const fs::path& d : {sharded, bin}) std::ofstream(d / "config.json") << "{}";
    std::ofstream(sharded / "model.safetensors.index.json") << R"({"weight_map": {}})";
    std::ofstream(sharded / "model-00001-of-00002.safetensors") << "x";
    std::ofstream(bin / "pytorch_model.bin") << "x";
    const std::string port_file = dir + "/port";
    m_log = dir + "/requests.jsonl";
    std::vector<std::string> args = {"python3", (kSource / "tests" / "hub_server.py").string(), "--port-file", port_file,
                                     "--log", m_log, "--repo", "org/tiny=" + model_dir(dir),
                                     "--repo", "org/sharded=" + sharded.string(), "--repo", "bin_only=" + bin.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    m_pid = ::fork();
    if (m_pid == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execvp("python3", argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 400 && !fs::exists(port_file); ++i) {
      int st;
      if (::waitpid(m_pid, &st, WNOHANG) == m_pid) {
        m_pid = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (fs::exists(port_file)) endpoint = "http://127.0.0.1:" + slurp(port_file);
  }
  ~HubServer() { stop(); }
  void stop() {
    if (m_pid <= 0) return;
    ::kill(m_pid, SIGTERM);
    ::waitpid(m_pid, nullptr, 0);
    m_pid = -1;
  }
  std::string requests() const { return slurp(m_log); }

  std::string endpoint;  // empty when the server did not start

  // The fixture repository: config, weights (an LFS file) and a WordPiece tokenizer.
  static std::string model_dir(const std::string& dir) {
    const fs::path m = fs::path(dir) / "repo";
    fs::create_directories(m);
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy_file(kSource / "tests/data/golden" / f, m / f, fs::copy_options::overwrite_existing);
    fs::copy_file(kSource / "tests/data/tokenizer/vocab.txt", m / "vocab.txt", fs::copy_options::overwrite_existing);
    std::ofstream(m / "tokenizer_config.json") << R"({"do_lower_case": true})";
    std::ofstream(m / "README.md") << "not wanted by anatomy\n";
    return m.string();
  }

 private:
  pid_t m_pid = -1;
  std::string m_log;
};

class HubDownload : public testing::Test {
 protected:
  void SetUp() override {
    if (!hub_downloads_available()) GTEST_SKIP() << "built without libcurl";
  }
  void start(const std::vector<std::string>& extra = {}) {
    const std::string name = testing::UnitTest::GetInstance()->current_test_info()->name();
    m_dir = testing_dirs::fresh_dir("hub_dl_" + name);
    m_server = std::make_unique<HubServer>(m_dir, extra);
    ASSERT_FALSE(m_server->endpoint.empty()) << "tests/hub_server.py did not start (python3 missing?)";
    s.cache_dir = m_dir + "/cache";
    s.endpoint = m_server->endpoint;
  }
  fs::path repo() const { return fs::path(s.cache_dir) / "models--org--tiny"; }
  std::string fixture(const std::string& f) const { return slurp(fs::path(m_dir) / "repo" / f); }
  std::string weights_sha() const { return sha256_hex(fixture("model.safetensors")); }
  std::vector<std::string> blob_names() const {
    std::vector<std::string> out;
    if (fs::exists(repo() / "blobs"))
      for (const auto& e : fs::directory_iterator(repo() / "blobs")) out.push_back(e.path().filename().string());
    return out;
  }

  // `f` must throw one anatomy::Error line containing every needle.
  template <class F>
  static void expect_error(F&& f, std::initializer_list<std::string> needles) {
    try {
      f();
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      for (const std::string& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "'" << n << "' not in: " << m;
    }
  }

  HubSettings s;
  std::string m_dir;
  std::unique_ptr<HubServer> m_server;
};

}  // namespace

TEST_F(HubDownload, IntoCacheLayoutThenOffline) {
  start();
  const std::string snap = resolve_model("org/tiny", "", s);
  const std::string commit = slurp(repo() / "refs" / "main");
  EXPECT_EQ(fs::path(snap), repo() / "snapshots" / commit);
  // Every wanted file is a relative link to its blob, byte for byte the fixture's; README is not wanted.
  for (const char* f : {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"}) {
    const fs::path link = fs::path(snap) / f;
    ASSERT_TRUE(fs::is_symlink(link)) << f;
    EXPECT_EQ(fs::read_symlink(link).parent_path(), fs::path("../../blobs")) << f;
    EXPECT_TRUE(slurp(link) == fixture(f)) << f << " differs from the served file";
  }
  EXPECT_FALSE(fs::exists(fs::path(snap) / "README.md"));
  // The LFS file is named by its sha256, the others by their git blob sha1 (the ETag).
  EXPECT_EQ(fs::read_symlink(fs::path(snap) / "model.safetensors").filename(), weights_sha());
  EXPECT_EQ(fs::read_symlink(fs::path(snap) / "config.json").filename().string().size(), 40u);
  for (const std::string& b : blob_names()) EXPECT_EQ(b.find(".incomplete"), std::string::npos) << b;
  // The Hub has no tokenizer.json: recorded, so that the next run needs no network.
  EXPECT_TRUE(fs::exists(repo() / ".no_exist" / commit / "tokenizer.json"));

  m_server->stop();
  s.offline = true;
  EXPECT_EQ(resolve_model("org/tiny", "main", s), snap);
  s.offline = false;  // online with the server gone: the complete snapshot needs no network either
  EXPECT_EQ(resolve_model("org/tiny", "", s), snap);
}

TEST_F(HubDownload, ResumesAnIncompleteFile) {
  start();
  const std::string bytes = fixture("model.safetensors");
  const size_t have = 40000;
  ASSERT_GT(bytes.size(), have);
  fs::create_directories(repo() / "blobs");
  std::ofstream(repo() / "blobs" / (weights_sha() + ".incomplete"), std::ios::binary) << bytes.substr(0, have);
  const std::string snap = resolve_model("org/tiny", "", s);
  EXPECT_TRUE(slurp(fs::path(snap) / "model.safetensors") == bytes);
  EXPECT_NE(m_server->requests().find("\"range\": \"bytes=40000-\""), std::string::npos) << m_server->requests();
}

TEST_F(HubDownload, CutTransferKeptThenResumed) {
  start({"--cut", "model.safetensors:30000"});
  expect_error([&] { resolve_model("org/tiny", "", s); }, {"org/tiny", "model.safetensors", "run again to resume"});
  const fs::path inc = repo() / "blobs" / (weights_sha() + ".incomplete");
  ASSERT_TRUE(fs::exists(inc));
  EXPECT_EQ(fs::file_size(inc), 30000u);
  EXPECT_FALSE(fs::exists(repo() / "blobs" / weights_sha()));
  const std::string snap = resolve_model("org/tiny", "", s);
  EXPECT_TRUE(slurp(fs::path(snap) / "model.safetensors") == fixture("model.safetensors"));
  EXPECT_FALSE(fs::exists(inc));
  EXPECT_NE(m_server->requests().find("\"range\": \"bytes=30000-\""), std::string::npos) << m_server->requests();
}

TEST_F(HubDownload, Sha256MismatchRefusedAndNothingKept) {
  start({"--corrupt", "model.safetensors"});
  expect_error([&] { resolve_model("org/tiny", "", s); }, {"org/tiny", "model.safetensors", "sha256", weights_sha()});
  for (const std::string& b : blob_names()) EXPECT_EQ(b.find(weights_sha()), std::string::npos) << b;
  const std::string commit = slurp(repo() / "refs" / "main");
  EXPECT_FALSE(fs::exists(repo() / "snapshots" / commit / "model.safetensors"));
  m_server->stop();
  s.offline = true;
  expect_error([&] { resolve_model("org/tiny", "", s); }, {"lacks model.safetensors", "huggingface-cli download org/tiny"});
}

TEST_F(HubDownload, MissingRepoAndRevision) {
  start();
  expect_error([&] { resolve_model("org/absent", "", s); }, {"org/absent", "is not on", s.endpoint, "check the name"});
  expect_error([&] { resolve_model("org/tiny", "v9", s); }, {"org/tiny", "no revision 'v9'"});
  EXPECT_FALSE(fs::exists(fs::path(s.cache_dir) / "models--org--absent" / "snapshots"));
}

TEST_F(HubDownload, TokenSentAsAuthorization) {
  start({"--token", "hf_secret"});
  expect_error([&] { resolve_model("org/tiny", "", s); }, {"org/tiny", "HF_TOKEN", "401"});
  s.token = "hf_wrong";
  expect_error([&] { resolve_model("org/tiny", "", s); }, {"org/tiny", "refused the token"});
  s.token = "hf_secret";
  const std::string snap = resolve_model("org/tiny", "", s);
  EXPECT_TRUE(fs::exists(fs::path(snap) / "model.safetensors"));
  const std::string log = m_server->requests();
  EXPECT_NE(log.find("\"authorization\": \"Bearer hf_secret\""), std::string::npos) << log;
  // Never to the CDN, whose signed URLs are their own credential.
  for (size_t at = log.find("/cdn/"); at != std::string::npos; at = log.find("/cdn/", at + 1)) {
    const size_t eol = log.find('\n', at);
    EXPECT_NE(log.substr(at, eol - at).find("\"authorization\": \"\""), std::string::npos) << log;
  }
}

TEST_F(HubDownload, UnloadableWeightsRefusedByName) {
  start();
  expect_error([&] { resolve_model("org/sharded", "", s); }, {"org/sharded", "model.safetensors.index.json", "does not load"});
  expect_error([&] { resolve_model("bin_only", "", s); }, {"bin_only", "no model.safetensors", "pytorch_model.bin"});
  // Refused before any file was fetched.
  EXPECT_FALSE(fs::exists(fs::path(s.cache_dir) / "models--org--sharded" / "blobs"));
}

TEST_F(HubDownload, TwoAtOnceAgree) {
  start();
  std::string a, b;
  std::atomic<int> errors{0};
  auto run = [&](std::string& out) {
    try {
      out = resolve_model("org/tiny", "", s);
    } catch (const std::exception& e) {
      ++errors;
      ADD_FAILURE() << e.what();
    }
  };
  std::thread t1(run, std::ref(a)), t2(run, std::ref(b));
  t1.join();
  t2.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(a, b);
  EXPECT_TRUE(slurp(fs::path(a) / "model.safetensors") == fixture("model.safetensors"));
  for (const auto& e : fs::directory_iterator(a)) EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos);
}

namespace {
// The Python that has huggingface_hub ($ANATOMY_TEST_PYTHON, else python3), or "" when none has it.
std::string python_with_hub() {
  const char* p = std::getenv("ANATOMY_TEST_PYTHON");
  const std::string py = p && *p ? p : "python3";
  return std::system((py + " -c 'import huggingface_hub' >/dev/null 2>&1").c_str()) == 0 ? py : "";
}
}  // namespace

// The point of the layout: Python finds what anatomy fetched, anatomy finds what Python fetched.
TEST_F(HubDownload, SharedWithHuggingfaceHub) {
  const std::string py = python_with_hub();
  if (py.empty()) GTEST_SKIP() << "no huggingface_hub in python3 (or $ANATOMY_TEST_PYTHON)";
  start();
  const std::string snap = resolve_model("org/tiny", "", s);
  const std::string script = m_dir + "/check.py";
  std::ofstream(script) << "import sys\n"
                           "from huggingface_hub import hf_hub_download, scan_cache_dir\n"
                           "for f in ['config.json', 'model.safetensors', 'vocab.txt']:\n"
                           "    print(hf_hub_download('org/tiny', f, local_files_only=True))\n"
                           "assert not scan_cache_dir().warnings\n";
  const std::string env = "HF_HUB_CACHE='" + s.cache_dir + "' HF_HUB_OFFLINE=1 ";
  EXPECT_EQ(std::system((env + py + " " + script + " > " + m_dir + "/py.out").c_str()), 0);
  EXPECT_NE(slurp(m_dir + "/py.out").find(snap + "/model.safetensors"), std::string::npos) << slurp(m_dir + "/py.out");

  // huggingface_hub downloads from the same stand-in into another cache; anatomy reads it offline.
  const std::string cache2 = m_dir + "/cache_py";
  std::ofstream(script) << "from huggingface_hub import hf_hub_download\n"
                           "for f in ['config.json', 'model.safetensors', 'vocab.txt']:\n"
                           "    hf_hub_download('org/tiny', f)\n";
  const std::string env2 = "HF_HUB_CACHE='" + cache2 + "' HF_ENDPOINT='" + s.endpoint + "' HF_HUB_DISABLE_XET=1 ";
  ASSERT_EQ(std::system((env2 + py + " " + script).c_str()), 0);
  m_server->stop();
  HubSettings offline = s;
  offline.cache_dir = cache2;
  offline.offline = true;
  const std::string snap2 = resolve_model("org/tiny", "", offline);
  EXPECT_TRUE(slurp(fs::path(snap2) / "model.safetensors") == fixture("model.safetensors"));
  EXPECT_EQ(fs::path(snap2).filename(), fs::path(snap).filename());  // the same commit
}
