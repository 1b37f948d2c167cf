// SHA-256 (FIPS 180-4), for checking each downloaded LFS file against the sha256 that the Hub
// names it by (its X-Linked-Etag).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace anatomy {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  // The digest as 64 lowercase hex digits. Call once.
  std::string hex();

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> m_h;
  std::array<uint8_t, 64> m_buf{};
  size_t m_buf_len = 0;
  uint64_t m_total = 0;  // bytes
};

std::string sha256_hex(const std::string& bytes);
// The sha256 of a whole file; an anatomy::Error naming it when it cannot be read.
std::string sha256_file_hex(const std::string& path);

}  // namespace anatomy
