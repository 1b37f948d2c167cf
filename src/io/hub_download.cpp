// Filling the Hugging Face cache the way huggingface_hub does (Note [hub cache layout], hub.h).
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/hub_detail.h"
#include "io/hub_http.h"
#include "io/hub_sha256.h"

namespace anatomy::hub_detail {
namespace fs = std::filesystem;

namespace {

// Percent-encoding for a URL path; '/' kept when it separates a file's folders.
std::string url_quote(const std::string& s, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += char(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// ETag values come quoted and sometimes weak (W/"..."): the cache names blobs by the bare value.
std::string bare_etag(std::string e) {
  if (e.rfind("W/", 0) == 0) e = e.substr(2);
  if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
  return e;
}

bool is_sha256(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isxdigit(c); });
}

// flock(2) on <cache>/.locks/models--org--name/<etag>.lock, as Python's filelock takes it, so
// that anatomy and huggingface_hub never write the same blob at once.
class BlobLock {
 public:
  explicit BlobLock(const fs::path& path) {
    fs::create_directories(path.parent_path());
    m_fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    ANATOMY_CHECK(m_fd >= 0, path.string(), ": cannot create the download lock");
    ANATOMY_CHECK(::flock(m_fd, LOCK_EX) == 0, path.string(), ": cannot take the download lock");
  }
  ~BlobLock() { ::close(m_fd); }
  BlobLock(const BlobLock&) = delete;
  BlobLock& operator=(const BlobLock&) = delete;

 private:
  int m_fd = -1;
};

struct Job {
  const HubSettings& s;
  const std::string& repo;
  const std::string& revision;
  HubHttp& http;
  fs::path repo_dir;
};

// One line for an HTTP answer that is not the file: what it means for the user and what to do.
[[noreturn]] void fail_answer(const Job& j, const HttpResponse& r, const std::string& file, const std::string& url) {
  const std::string code = r.header("x-error-code");
  const std::string model = "model '" + j.repo + "'";
  if (code == "RepoNotFound" || (r.status == 404 && code.empty() && file.empty()))
    fail(model, " is not on ", j.s.endpoint, " (HTTP ", r.status, "): check the name; a private model needs ",
         j.s.token.empty() ? "a token (set HF_TOKEN or run `huggingface-cli login`)" : "a token with access to it");
  if (code == "RevisionNotFound") fail(model, " has no revision '", j.revision, "' on ", j.s.endpoint);
  if (code == "EntryNotFound" || r.status == 404)
    fail(model, " has no file ", file, " at revision ", j.revision, " on ", j.s.endpoint);
  if (code == "GatedRepo" || r.status == 403)
    fail(model, " is gated: accept its conditions at ", j.s.endpoint, "/", j.repo, " and ",
         j.s.token.empty() ? "set HF_TOKEN (or run `huggingface-cli login`)" : "use a token of that account",
         " (HTTP ", r.status, ")");
  if (r.status == 401)
    fail(model, j.s.token.empty() ? " needs a token: set HF_TOKEN or run `huggingface-cli login`"
                                  : ": the Hub refused the token (HF_TOKEN or the stored one)",
         " (HTTP 401 from ", url, ")");
  fail(model, ": ", url, " answered HTTP ", r.status, "; fetch it with ", fetch_command(j.repo, j.revision));
}

template <class F>
HttpResponse over_network(const Job& j, const std::string& what, F&& request) {
  try {
    return request();
  } catch (const HttpTransportError& e) {
    fail("model '", j.repo, "': ", what, " failed (", e.what(), "); fetch it with ",
         fetch_command(j.repo, j.revision), " where there is network, or pass a local directory");
  }
}

// The commit `revision` names and the repository's file list (the Hub's model-info API).
std::pair<std::string, std::set<std::string>> model_info(const Job& j) {
  const std::string url = j.s.endpoint + "/api/models/" + url_quote(j.repo, true) + "/revision/" + url_quote(j.revision, false);
  const HttpResponse r = over_network(j, "asking " + j.s.endpoint, [&] { return j.http.get(url); });
  if (r.status != 200) fail_answer(j, r, "", url);
  const auto info = nlohmann::json::parse(r.body, nullptr, false);
  ANATOMY_CHECK(info.is_object() && info.contains("sha") && info["sha"].is_string() &&
                    is_commit_hash(info["sha"].get<std::string>()) && info.contains("siblings") && info["siblings"].is_array(),
                "model '", j.repo, "': ", url, " did not answer with the Hub's model info (sha, siblings)");
  std::set<std::string> files;
  for (const auto& sib : info["siblings"])
    if (sib.is_object() && sib.contains("rfilename") && sib["rfilename"].is_string()) files.insert(sib["rfilename"].get<std::string>());
  return {info["sha"].get<std::string>(), files};
}

// "https://host:port" of a URL.
std::string origin(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return {};
  return url.substr(0, url.find('/', scheme + 3));
}

// Where the file's bytes come from and what the cache calls them (huggingface_hub's metadata
// request: a HEAD on the resolve URL, following redirects that stay on the same host, e.g. of a
// renamed repository; an LFS file answers with a redirect to a CDN host, and that answer carries
// the file's sha256 and size).
struct FileMeta {
  std::string download_url, etag;
  uint64_t size = 0;
  bool lfs = false;
};

FileMeta file_meta(const Job& j, const std::string& commit, const std::string& file) {
  std::string url = j.s.endpoint + "/" + url_quote(j.repo, true) + "/resolve/" + commit + "/" + url_quote(file, true);
  HttpResponse r;
  std::string target;
  for (int hops = 0;; ++hops) {
    r = over_network(j, "asking for " + file, [&] { return j.http.head(url); });
    const std::string loc = r.header("location");
    target = loc.rfind("/", 0) == 0 ? origin(url) + loc : loc;
    if (r.status >= 300 && r.status < 400 && !loc.empty() && origin(target) == origin(url) && hops < 10) {
      url = target;
      continue;
    }
    break;
  }
  FileMeta m;
  const std::string linked = bare_etag(r.header("x-linked-etag"));
  m.etag = linked.empty() ? bare_etag(r.header("etag")) : linked;
  const std::string size = r.header("x-linked-size").empty() ? r.header("content-length") : r.header("x-linked-size");
  if (r.status >= 300 && r.status < 400 && !target.empty())
    m.download_url = target;
  else if (r.status == 200)
    m.download_url = url;
  else
    fail_answer(j, r, file, url);
  ANATOMY_CHECK(!m.etag.empty() && m.etag.find('/') == std::string::npos && m.etag.find("..") == std::string::npos,
                "model '", j.repo, "': ", url, " sent no usable ETag for ", file);
  ANATOMY_CHECK(!size.empty() && std::all_of(size.begin(), size.end(), ::isdigit), "model '", j.repo, "': ", url,
                " sent no file size for ", file);
  m.size = std::stoull(size);
  m.lfs = !linked.empty() && is_sha256(m.etag);
  return m;
}

// blobs/<etag>.incomplete, resumed where an earlier run stopped, checked, then renamed to
// blobs/<etag>. Nothing is named blobs/<etag> unless its size (and an LFS file's sha256) match.
void fetch_blob(const Job& j, const std::string& file, const FileMeta& m, const fs::path& blob) {
  const std::string inc = blob.string() + ".incomplete";
  uint64_t have = fs::exists(inc) ? fs::file_size(inc) : 0;
  if (have > m.size) {
    fs::remove(inc);
    have = 0;
  }
  if (!j.s.progress)
    std::fprintf(stderr, "hub: downloading %s %s (%s%s)\n", j.repo.c_str(), file.c_str(), human_size(m.size).c_str(),
                 have ? str_cat(", resuming at byte ", have).c_str() : "");
  if (have < m.size || m.size == 0) {
    const HttpResponse r = over_network(j, "downloading " + file + " (run again to resume it)",
                                        [&] { return j.http.download(m.download_url, inc, have, file, m.size); });
    if (r.status != 200 && r.status != 206) fail_answer(j, r, file, m.download_url);
  }
  const uint64_t got = fs::file_size(inc);
  if (got > m.size) fs::remove(inc);
  ANATOMY_CHECK(got == m.size, "model '", j.repo, "': ", file, " arrived with ", got, " bytes of ", m.size,
                got < m.size ? "; run again to resume it" : "; removed it");
  if (m.lfs) {
    const std::string actual = sha256_file_hex(inc);
    if (actual != m.etag) {
      fs::remove(inc);
      fail("model '", j.repo, "': downloaded ", file, " has sha256 ", actual, ", not the ", m.etag,
           " the Hub names; removed it (run again, or fetch it with ", fetch_command(j.repo, j.revision), ")");
    }
  }
  fs::rename(inc, blob);
  fsync_parent_dir(blob.string());
}

// snapshots/<commit>/<file> -> ../../blobs/<etag> (relative, so the cache can move), made under a
// temporary name and renamed into place.
void link_snapshot(const fs::path& link, const fs::path& blob) {
  fs::create_directories(link.parent_path());
  const fs::path target = fs::relative(blob, link.parent_path());
  // Unique per process and call: two runs resolving the same model at once each rename their own.
  static std::atomic<unsigned> counter{0};
  const fs::path tmp = str_cat(link.string(), ".tmp-", ::getpid(), "-", counter++);
  fs::create_symlink(target, tmp);
  fs::rename(tmp, link);
}

void fetch_file(const Job& j, const std::string& commit, const std::string& file) {
  const fs::path link = j.repo_dir / "snapshots" / commit / file;
  if (fs::exists(link)) return;
  const FileMeta m = file_meta(j, commit, file);
  const fs::path blob = j.repo_dir / "blobs" / m.etag;
  fs::create_directories(blob.parent_path());
  {
    BlobLock lock(fs::path(j.s.cache_dir) / ".locks" / j.repo_dir.filename() / (m.etag + ".lock"));
    if (!fs::exists(blob)) fetch_blob(j, file, m, blob);
  }
  link_snapshot(link, blob);
}

// The files of `files` anatomy takes; refuses a repository without config or loadable weights.
std::vector<std::string> choose_files(const Job& j, const std::set<std::string>& files) {
  const std::string model = "model '" + j.repo + "'";
  ANATOMY_CHECK(files.count("config.json"), model, " has no config.json at revision ", j.revision, ": not a transformers model");
  if (!files.count("model.safetensors")) {
    ANATOMY_CHECK(!files.count("model.safetensors.index.json"), model,
                  " has sharded weights (model.safetensors.index.json), which anatomy does not load yet");
    fail(model, " has no model.safetensors at revision ", j.revision,
         files.count("pytorch_model.bin") ? " (only pytorch_model.bin, which anatomy does not read)" : "");
  }
  std::vector<std::string> out;
  for (const std::string& f : hub_wanted_files())
    if (files.count(f)) out.push_back(f);
  return out;
}

}  // namespace

std::string download(const HubSettings& s, const std::string& repo, const std::string& revision) {
  HubHttp http(s.endpoint, s.token, s.progress);
  Job j{s, repo, revision, http, fs::path(hub_repo_dir(s, repo))};
  auto [commit, files] = model_info(j);
  const std::vector<std::string> wanted = choose_files(j, files);
  std::fprintf(stderr, "hub: %s (revision %s, commit %.7s) from %s into %s\n", repo.c_str(), revision.c_str(),
               commit.c_str(), s.endpoint.c_str(), j.repo_dir.string().c_str());
  fs::create_directories(j.repo_dir);
  if (revision != commit) {
    fs::create_directories((j.repo_dir / "refs" / revision).parent_path());
    write_file_atomic((j.repo_dir / "refs" / revision).string(), commit);
  }
  for (const std::string& f : wanted) fetch_file(j, commit, f);
  // The Hub's word that these tokenizer files do not exist, so that the next run needs no network.
  const fs::path no_exist = j.repo_dir / ".no_exist" / commit;
  for (const char* f : {"tokenizer.json", "vocab.txt"}) {
    if (files.count(f) || fs::exists(no_exist / f)) continue;
    fs::create_directories(no_exist);
    write_file_atomic((no_exist / f).string(), "");
  }
  const std::string snapshot = (j.repo_dir / "snapshots" / commit).string();
  snapshot_missing(repo, snapshot);
  return snapshot;
}

}  // namespace anatomy::hub_detail
