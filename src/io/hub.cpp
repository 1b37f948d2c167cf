#include "io/hub.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/hub_detail.h"
#include "io/hub_http.h"

namespace anatomy {
namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string expand_home(std::string p) {
  if (p.rfind("~/", 0) == 0 || p == "~") p = env("HOME") + p.substr(1);
  return p;
}

// huggingface_hub's reading of a boolean variable.
bool env_true(const char* name) {
  std::string v = env(name);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::toupper(c); });
  return v == "1" || v == "ON" || v == "YES" || v == "TRUE";
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  const size_t b = s.find_first_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b);
}

std::string read_small_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return {};
  std::string s(std::istreambuf_iterator<char>(in), {});
  return trim(s);
}

bool valid_id_part(const std::string& p) {
  if (p.empty() || p.size() > 96 || p.front() == '.' || p.front() == '-' || p.back() == '.' ||
      p.find("--") != std::string::npos || p.find("..") != std::string::npos)
    return false;
  return std::all_of(p.begin(), p.end(), [](unsigned char c) { return std::isalnum(c) || c == '-' || c == '_' || c == '.'; });
}

// A revision is a branch, tag or commit; it becomes a path under refs/ and part of a URL.
void check_revision(const std::string& rev) {
  const bool ok = !rev.empty() && rev.size() <= 200 && rev.front() != '/' && rev.back() != '/' &&
                  rev.find("..") == std::string::npos &&
                  std::all_of(rev.begin(), rev.end(), [](unsigned char c) {
                    return std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '/';
                  });
  ANATOMY_CHECK(ok, "--revision '", rev, "' is not a branch, tag or commit name");
}

}  // namespace

HubSettings hub_settings_from_env() {
  HubSettings s;
  const std::string xdg = env("XDG_CACHE_HOME");
  const std::string home = !env("HF_HOME").empty() ? expand_home(env("HF_HOME"))
                           : !xdg.empty()          ? expand_home(xdg) + "/huggingface"
                                                   : env("HOME") + "/.cache/huggingface";
  if (!env("HF_HUB_CACHE").empty())
    s.cache_dir = expand_home(env("HF_HUB_CACHE"));
  else if (!env("HUGGINGFACE_HUB_CACHE").empty())  // the older name, still honoured by huggingface_hub
    s.cache_dir = expand_home(env("HUGGINGFACE_HUB_CACHE"));
  else
    s.cache_dir = home + "/hub";
  if (!env("HF_ENDPOINT").empty()) s.endpoint = env("HF_ENDPOINT");
  while (s.endpoint.size() > 1 && s.endpoint.back() == '/') s.endpoint.pop_back();
  s.token = trim(env("HF_TOKEN"));
  if (s.token.empty()) s.token = trim(env("HUGGING_FACE_HUB_TOKEN"));
  if (s.token.empty()) {
    const std::string token_path = !env("HF_TOKEN_PATH").empty() ? expand_home(env("HF_TOKEN_PATH")) : home + "/token";
    s.token = read_small_file(token_path);
  }
  s.offline = env_true("HF_HUB_OFFLINE") || env_true("TRANSFORMERS_OFFLINE");
  if (!env_true("HF_HUB_OFFLINE") && s.offline) s.offline_variable = "TRANSFORMERS_OFFLINE";
  s.progress = ::isatty(STDERR_FILENO) == 1;
  return s;
}

bool hub_downloads_available() { return hub_http_available(); }

bool is_hub_model_id(const std::string& s) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos) return valid_id_part(s);
  return s.find('/', slash + 1) == std::string::npos && valid_id_part(s.substr(0, slash)) &&
         valid_id_part(s.substr(slash + 1));
}

std::string hub_repo_dir(const HubSettings& settings, const std::string& repo_id) {
  std::string flat = "models--" + repo_id;
  const size_t slash = flat.find('/');
  if (slash != std::string::npos) flat.replace(slash, 1, "--");
  return (fs::path(settings.cache_dir) / flat).string();
}

const std::vector<std::string>& hub_wanted_files() {
  static const std::vector<std::string> files = {
      "config.json", "model.safetensors",
      // tokenizers: fast (tokenizer.json), WordPiece, BPE (vocab.json + merges.txt), SentencePiece
      "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt",
      "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model"};
  return files;
}

namespace hub_detail {

std::string fetch_command(const std::string& repo, const std::string& revision) {
  std::string c = "`huggingface-cli download " + repo;
  if (revision != "main") c += " --revision " + revision;
  return c + "`";
}

bool is_commit_hash(const std::string& s) {
  return s.size() == 40 && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isxdigit(c) && !std::isupper(c); });
}

std::string cached_commit(const std::string& repo_dir, const std::string& revision) {
  if (is_commit_hash(revision)) return revision;
  const std::string c = read_small_file(fs::path(repo_dir) / "refs" / revision);
  return is_commit_hash(c) ? c : std::string();
}

std::string snapshot_missing(const std::string& repo, const std::string& dir) {
  const fs::path d(dir);
  // fs::exists follows the symlink: a link to a blob that is gone counts as missing.
  if (!fs::exists(d / "config.json")) return "config.json";
  if (!fs::exists(d / "model.safetensors")) {
    ANATOMY_CHECK(!fs::exists(d / "model.safetensors.index.json"), "model '", repo,
                  "' has sharded weights (model.safetensors.index.json), which anatomy does not load yet");
    return "model.safetensors";
  }
  // A tokenizer anatomy reads, or the Hub's word that the repository has none.
  for (const char* f : {"tokenizer.json", "vocab.txt"})
    if (fs::exists(d / f)) return "";
  const fs::path no_exist = d.parent_path().parent_path() / ".no_exist" / d.filename();
  if (fs::exists(no_exist / "tokenizer.json") && fs::exists(no_exist / "vocab.txt")) return "";
  return "tokenizer.json";
}

}  // namespace hub_detail

std::string resolve_model(const std::string& name_or_path, const std::string& revision) {
  if (fs::is_directory(name_or_path)) return name_or_path;
  return resolve_model(name_or_path, revision, hub_settings_from_env());
}

std::string resolve_model(const std::string& name, const std::string& revision, const HubSettings& s) {
  using namespace hub_detail;
  ANATOMY_CHECK(!name.empty(), "--model_name_or_path is empty");
  if (fs::is_directory(name)) return name;
  ANATOMY_CHECK(!fs::exists(name), "--model_name_or_path ", name, ": not a directory (a model directory or a Hub name is expected)");
  ANATOMY_CHECK(is_hub_model_id(name), "--model_name_or_path ", name,
                ": no such directory, and not a Hugging Face model name (org/name)");
  const std::string rev = revision.empty() ? "main" : revision;
  check_revision(rev);

  const std::string repo_dir = hub_repo_dir(s, name);
  const std::string commit = cached_commit(repo_dir, rev);
  std::string missing = "config.json";
  std::string snapshot;
  if (!commit.empty()) {
    snapshot = (fs::path(repo_dir) / "snapshots" / commit).string();
    missing = snapshot_missing(name, snapshot);
    // Note [cache first]: a usable snapshot is used as it is, without asking the Hub whether the
    // branch moved (transformers asks; a training run should not depend on the network).
    if (missing.empty()) return snapshot;
  }
  if (s.offline) {
    // Offline, a snapshot with weights and config but no tokenizer is still what there is.
    if (missing == "tokenizer.json") return snapshot;
    fail("model '", name, "' (revision ", rev, ") is not in the Hugging Face cache ", s.cache_dir,
         missing == "config.json" ? std::string() : " (its snapshot lacks " + missing + ")",
         " and ", s.offline_variable, " is set: fetch it with ", fetch_command(name, rev), " or unset ",
         s.offline_variable);
  }
  ANATOMY_CHECK(hub_downloads_available(), "model '", name, "' (revision ", rev, ") is not in the Hugging Face cache ",
                s.cache_dir, " and this anatomy was built without libcurl, so it cannot download: fetch it with ",
                fetch_command(name, rev));
  return download(s, name, rev);
}

}  // namespace anatomy
