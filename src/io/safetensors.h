// Hugging Face safetensors: read (validated against hostile input) and write (atomically).
//
// Layout: u64 little-endian N | N bytes of JSON header | data buffer.
//   header = {"<name>": {"dtype": "F32", "shape": [d0, ...], "data_offsets": [begin, end]}, ...,
//             "__metadata__": {"<key>": "<string>", ...}}   (metadata optional)
//   offsets are relative to the start of the data buffer, end - begin = numel * dtype_size.
// Every problem with a file is an anatomy::Error whose one-line message starts with its path.
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace anatomy {

// Headers larger than this are refused unread (the reference implementation uses 100 MB too).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100ull << 20;

// "[64, 32]"
std::string shape_str(std::span<const int64_t> shape);

struct SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data buffer, [begin, end)
  uint64_t end = 0;

  size_t numel() const;
  size_t bytes() const { return static_cast<size_t>(end - begin); }
};

class SafetensorsReader {
 public:
  // Opens and validates the whole header; tensor data is read on demand with pread.
  static SafetensorsReader open(const std::string& path);

  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&& o) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& o) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return m_path; }
  // Sorted by name.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return m_tensors; }
  const std::map<std::string, std::string>& metadata() const { return m_metadata; }
  const SafetensorsTensorInfo* find(std::string_view name) const;  // nullptr when absent
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  // Throws "<path>: no tensor named '<name>'".
  const SafetensorsTensorInfo& info(std::string_view name) const;

  // Reads tensor `name` into host memory `dst` (numel elements of `to`), converting dtype
  // (see can_convert) and checking that its shape equals `expected`. `expected_from` names
  // where the expectation came from, e.g. "config.json", for the error message.
  void read(std::string_view name, DType to, void* dst, std::span<const int64_t> expected,
            std::string_view expected_from = {}) const;
  // Same, into a host tensor: its dtype is the target, its shape the expectation.
  void read(std::string_view name, const Tensor& dst, std::string_view expected_from = {}) const;
  // The stored bytes, unconverted.
  std::vector<uint8_t> read_bytes(std::string_view name) const;

 private:
  SafetensorsReader() = default;
  void pread_exact(void* dst, size_t n, uint64_t data_offset) const;

  std::string m_path;
  int m_fd = -1;
  uint64_t m_data_start = 0;  // 8 + N
  uint64_t m_data_size = 0;
  std::vector<SafetensorsTensorInfo> m_tensors;
  std::map<std::string, std::string> m_metadata;
};

// Conversions read() supports: any dtype to itself; among F32/F16/BF16/F64 (rounding to
// nearest even); among I64/I32/U8 (values must fit).
bool can_convert(DType from, DType to);
// Converts n elements; throws on an integer that does not fit the target.
void convert_dtype(const void* src, DType from, void* dst, DType to, size_t n);

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // host, numel * dtype_size bytes
};
SafetensorsEntry safetensors_entry(std::string name, const Tensor& host_tensor);

// Writes entries (any order; stored sorted by name, contiguous) with a header padded by
// spaces to a multiple of 8 bytes, via temp file + fsync + rename.
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace anatomy
