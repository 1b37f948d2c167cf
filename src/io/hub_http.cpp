#include "io/hub_http.h"

#include <cstdio>

#include "core/error.h"

#ifdef ANATOMY_WITH_CURL
#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <mutex>
#endif

namespace anatomy {

std::string human_size(uint64_t n) {
  if (n < 1000) return std::to_string(n) + " B";
  const char* units[] = {"kB", "MB", "GB", "TB"};
  double v = double(n) / 1000;
  int u = 0;
  for (; v >= 1000 && u < 3; ++u) v /= 1000;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

#ifndef ANATOMY_WITH_CURL

bool hub_http_available() { return false; }

struct HubHttp::Impl {};
HubHttp::HubHttp(std::string, std::string, bool) {}
HubHttp::~HubHttp() = default;
static HttpResponse no_curl() {
  throw HttpTransportError("this anatomy was built without libcurl (Debian: libcurl4-openssl-dev), so it cannot download");
}
HttpResponse HubHttp::head(const std::string&) { return no_curl(); }
HttpResponse HubHttp::get(const std::string&) { return no_curl(); }
HttpResponse HubHttp::download(const std::string&, const std::string&, uint64_t, const std::string&, uint64_t) {
  return no_curl();
}

#else

bool hub_http_available() { return true; }

namespace {

using Clock = std::chrono::steady_clock;

// What the callbacks of one request write into.
struct Transfer {
  CURL* curl = nullptr;
  HttpResponse* resp = nullptr;
  FILE* file = nullptr;  // downloads: the .incomplete file, opened for appending
  uint64_t offset = 0;   // bytes the file held before this request
  bool file_checked = false;
  bool to_file = false;  // this answer's body belongs in the file (200 or 206)
  // Bodies kept in memory: the model-info JSON (a large repository lists thousands of files), or
  // the error page a download got instead of the file.
  size_t body_limit = 64u << 20;
  std::string error;     // why a callback stopped the transfer
  // progress bar
  bool progress = false;
  std::string label;
  uint64_t total = 0;
  Clock::time_point start = Clock::now(), last_draw{};
};

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string line(data, size * n);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  if (line.rfind("HTTP/", 0) == 0) {  // a new response (after a redirect): forget the last one
    t->resp->headers.clear();
    return size * n;
  }
  const size_t colon = line.find(':');
  if (colon == std::string::npos) return size * n;
  std::string name = line.substr(0, colon), value = line.substr(colon + 1);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  const size_t b = value.find_first_not_of(" \t");
  t->resp->headers[name] = b == std::string::npos ? std::string() : value.substr(b);
  return size * n;
}

// The body goes to the file only for 200/206; anything else (an error page) is kept in memory.
// Note [resume]: a 206 must start where the file ends; a 200 restarts the file from byte 0.
size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  if (t->file && !t->file_checked) {
    t->file_checked = true;
    long status = 0;
    curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
    if (status == 206) {
      const std::string range = t->resp->header("content-range");
      const std::string want = "bytes " + std::to_string(t->offset) + "-";
      if (range.rfind(want, 0) != 0) {
        t->error = "the server answered a Range request for byte " + std::to_string(t->offset) +
                   " with '" + range + "'";
        return 0;
      }
      t->to_file = true;
    } else if (status == 200) {
      if (t->offset > 0 && ::ftruncate(::fileno(t->file), 0) != 0) {
        t->error = "cannot truncate the partial download";
        return 0;
      }
      t->offset = 0;
      t->to_file = true;
    }
  }
  if (t->to_file) return std::fwrite(data, 1, size * n, t->file);
  t->resp->body.append(data, size * n);
  if (t->resp->body.size() <= t->body_limit) return size * n;
  t->error = "an answer larger than " + human_size(t->body_limit);
  return 0;
}

void draw(Transfer& t, uint64_t now, bool last) {
  const double secs = std::chrono::duration<double>(Clock::now() - t.start).count();
  const uint64_t done = t.offset + now;
  const double frac = t.total ? std::min(1.0, double(done) / double(t.total)) : 0.0;
  const int width = 24, filled = int(frac * width);
  const std::string rate = human_size(secs > 0 ? uint64_t(double(now) / secs) : 0) + "/s";
  std::fprintf(stderr, "\r%-28.28s %3d%% [%s%s] %10s / %-10s %12s", t.label.c_str(), int(frac * 100),
               std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), human_size(done).c_str(),
               human_size(t.total).c_str(), rate.c_str());
  if (last) std::fputc('\n', stderr);
  std::fflush(stderr);
}

int on_progress(void* user, curl_off_t, curl_off_t now, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  const auto tick = Clock::now();
  if (t->progress && t->to_file && tick - t->last_draw > std::chrono::milliseconds(100)) {
    t->last_draw = tick;
    draw(*t, uint64_t(now), false);
  }
  return 0;
}

}  // namespace

struct HubHttp::Impl {
  std::string endpoint, token;
  bool progress = false;
  CURL* curl = nullptr;

  // Sets up `curl` for one request to `url`; the caller adds the method specifics.
  curl_slist* prepare(const std::string& url, Transfer& t, curl_slist* headers) {
    curl_easy_reset(curl);
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_USERAGENT, "anatomy (huggingface_hub-compatible)");
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &t);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 15L);
    // A stalled transfer (under 1 byte/s for a minute) fails; the partial file is resumed later.
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    if (!token.empty() && url.rfind(endpoint + "/", 0) == 0)
      headers = curl_slist_append(headers, ("Authorization: Bearer " + token).c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    t.curl = curl;
    return headers;
  }

  HttpResponse finish(const std::string& url, Transfer& t, curl_slist* headers, HttpResponse& resp) {
    const CURLcode rc = curl_easy_perform(curl);
    curl_slist_free_all(headers);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &resp.status);
    if (t.progress && t.to_file) {
      curl_off_t now = 0;
      curl_easy_getinfo(curl, CURLINFO_SIZE_DOWNLOAD_T, &now);
      draw(t, uint64_t(now), true);
    }
    if (!t.error.empty()) throw HttpTransportError(url + ": " + t.error);
    if (rc != CURLE_OK) throw HttpTransportError(url + ": " + curl_easy_strerror(rc));
    return std::move(resp);
  }
};

HubHttp::HubHttp(std::string endpoint, std::string token, bool progress) : m_impl(std::make_unique<Impl>()) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  m_impl->endpoint = std::move(endpoint);
  m_impl->token = std::move(token);
  m_impl->progress = progress;
  m_impl->curl = curl_easy_init();
  ANATOMY_CHECK(m_impl->curl, "libcurl: cannot start a session");
}

HubHttp::~HubHttp() {
  if (m_impl && m_impl->curl) curl_easy_cleanup(m_impl->curl);
}

HttpResponse HubHttp::head(const std::string& url) {
  Transfer t;
  HttpResponse resp;
  t.resp = &resp;
  curl_slist* h = m_impl->prepare(url, t, nullptr);
  curl_easy_setopt(m_impl->curl, CURLOPT_NOBODY, 1L);
  return m_impl->finish(url, t, h, resp);
}

HttpResponse HubHttp::get(const std::string& url) {
  Transfer t;
  HttpResponse resp;
  t.resp = &resp;
  curl_slist* h = m_impl->prepare(url, t, nullptr);
  curl_easy_setopt(m_impl->curl, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(m_impl->curl, CURLOPT_MAXREDIRS, 5L);
  return m_impl->finish(url, t, h, resp);
}

HttpResponse HubHttp::download(const std::string& url, const std::string& path, uint64_t offset,
                               const std::string& label, uint64_t total) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "ab"), &std::fclose);
  ANATOMY_CHECK(f, path, ": cannot write");
  Transfer t;
  HttpResponse resp;
  t.resp = &resp;
  t.file = f.get();
  t.body_limit = 1u << 20;
  t.offset = offset;
  t.progress = m_impl->progress;
  t.label = label;
  t.total = total;
  curl_slist* h = nullptr;
  if (offset > 0) h = curl_slist_append(h, ("Range: bytes=" + std::to_string(offset) + "-").c_str());
  h = m_impl->prepare(url, t, h);
  curl_easy_setopt(m_impl->curl, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(m_impl->curl, CURLOPT_MAXREDIRS, 5L);
  HttpResponse out = m_impl->finish(url, t, h, resp);
  ANATOMY_CHECK(std::fflush(f.get()) == 0 && ::fsync(::fileno(f.get())) == 0, path, ": cannot write (disk full?)");
  return out;
}

#endif

}  // namespace anatomy
