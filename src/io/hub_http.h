// The few HTTP requests the Hub download needs, over libcurl. Built without libcurl, every
// request throws an anatomy::Error saying so (hub_http_available() is false).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace anatomy {

struct HttpResponse {
  long status = 0;
  std::map<std::string, std::string> headers;  // of the last response; names in lowercase
  std::string body;                            // empty for HEAD and for downloads to a file
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// A transport failure (no connection, a cut transfer): no HTTP status to judge.
class HttpTransportError : public std::exception {
 public:
  explicit HttpTransportError(std::string m) : m_msg(std::move(m)) {}
  const char* what() const noexcept override { return m_msg.c_str(); }

 private:
  std::string m_msg;
};

bool hub_http_available();

// "835 B", "96.2 kB", "438.0 MB": sizes as the download lines and the progress bar show them.
std::string human_size(uint64_t bytes);

class HubHttp {
 public:
  // `token` goes as "Authorization: Bearer" to URLs under `endpoint` only: LFS files come from a
  // CDN with signed URLs that a second credential would break (and must not see the token).
  HubHttp(std::string endpoint, std::string token, bool progress);
  ~HubHttp();
  HubHttp(const HubHttp&) = delete;
  HubHttp& operator=(const HubHttp&) = delete;

  // A HEAD that does not follow redirects (the Hub's LFS metadata is on the redirect itself).
  HttpResponse head(const std::string& url);
  // A GET into memory, following redirects; for the small JSON API answers.
  HttpResponse get(const std::string& url);
  // A GET appended to the file at `path`, which already holds `offset` bytes: asks for the rest
  // with a Range header. A 200 (the server ignored the Range) truncates the file first. Follows
  // redirects; `label` and `total` feed the progress bar. Errors answers leave `path` as it was.
  HttpResponse download(const std::string& url, const std::string& path, uint64_t offset,
                        const std::string& label, uint64_t total);

 private:
  struct Impl;
  std::unique_ptr<Impl> m_impl;
};

}  // namespace anatomy
