#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "core/error.h"
#include "io/atomic_file.h"

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace anatomy {
namespace {

using nlohmann::json;

// Names and parser messages come from the file: keep error messages on one printable line.
std::string printable(std::string_view s, size_t max_len = 200) {
  std::string out;
  for (char c : s) {
    if (out.size() >= max_len) {
      out += "...";
      break;
    }
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

std::string quote_name(std::string_view name) {
  std::string out(1, '\'');  // appended, not "'" + s: GCC 12 warns falsely (-Wrestrict) on that
  out += printable(name);
  out += '\'';
  return out;
}

bool parse_dtype(std::string_view s, DType& out) {
  static constexpr std::pair<std::string_view, DType> kTable[] = {
      {"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16}, {"F64", DType::F64},
      {"I64", DType::I64}, {"I32", DType::I32}, {"U8", DType::U8}};
  for (auto [name, t] : kTable)
    if (s == name) {
      out = t;
      return true;
    }
  return false;
}

// A JSON value that is a non-negative integer representable as int64 (nlohmann stores
// literals that do not fit u64 as doubles; those are refused here too).
bool as_index(const json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
  } else if (v.is_number_integer()) {
    int64_t s = v.get<int64_t>();
    if (s < 0) return false;
    out = static_cast<uint64_t>(s);
  } else {
    return false;
  }
  return out <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
}

// Parses the header, refusing duplicate keys at any depth (nlohmann would keep the last).
json parse_header(const std::string& path, const std::string& text) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  json::parser_callback_t cb = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (ev == json::parse_event_t::key && !keys.empty()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      ANATOMY_CHECK(keys.back().insert(k).second, path, ": header has the key ", quote_name(k), " twice");
    }
    return true;
  };
  try {
    return json::parse(text, cb);
  } catch (const json::parse_error& e) {
    std::string msg = e.what();
    if (auto p = msg.find("] "); p != std::string::npos) msg = msg.substr(p + 2);
    fail(path, ": header is not valid JSON at byte ", e.byte, ": ", printable(msg, 300));
  } catch (const json::exception& e) {
    fail(path, ": header is not valid JSON: ", printable(e.what(), 300));
  }
}

SafetensorsTensorInfo parse_tensor(const std::string& path, const std::string& name, const json& v,
                                   uint64_t data_size) {
  const std::string where = path + ": tensor " + quote_name(name);
  ANATOMY_CHECK(v.is_object(), where, ": entry must be an object with dtype, shape, data_offsets");
  SafetensorsTensorInfo t;
  t.name = name;

  auto dt = v.find("dtype");
  ANATOMY_CHECK(dt != v.end() && dt->is_string(), where, ": 'dtype' must be a string");
  const std::string& dts = dt->get_ref<const std::string&>();
  ANATOMY_CHECK(parse_dtype(dts, t.dtype), where, ": unsupported dtype ", quote_name(dts),
                " (supported: F32, F16, BF16, F64, I64, I32, U8)");

  auto sh = v.find("shape");
  ANATOMY_CHECK(sh != v.end() && sh->is_array(), where, ": 'shape' must be an array of non-negative integers");
  uint64_t numel = 1;
  bool overflow = false;
  for (const json& d : *sh) {
    uint64_t x;
    ANATOMY_CHECK(as_index(d, x), where, ": 'shape' must be an array of non-negative integers, got ",
                  printable(sh->dump(), 100));
    t.shape.push_back(static_cast<int64_t>(x));
    overflow |= __builtin_mul_overflow(numel, x, &numel);
  }
  uint64_t nbytes = 0;
  overflow |= __builtin_mul_overflow(numel, uint64_t(dtype_size(t.dtype)), &nbytes);
  ANATOMY_CHECK(!overflow, where, ": shape ", shape_str(t.shape), " is too large");

  auto off = v.find("data_offsets");
  ANATOMY_CHECK(off != v.end() && off->is_array() && off->size() == 2 && as_index((*off)[0], t.begin) &&
                    as_index((*off)[1], t.end),
                where, ": 'data_offsets' must be [begin, end] with non-negative integers");
  ANATOMY_CHECK(t.begin <= t.end, where, ": data_offsets [", t.begin, ", ", t.end, "] end before they begin");
  ANATOMY_CHECK(t.end <= data_size, where, ": data_offsets [", t.begin, ", ", t.end,
                "] run past the end of the data buffer (", data_size, " bytes; file truncated?)");
  ANATOMY_CHECK(t.end - t.begin == nbytes, where, ": data_offsets span ", t.end - t.begin, " bytes but ",
                dtype_name(t.dtype), " ", shape_str(t.shape), " needs ", nbytes);
  return t;
}

// ---- dtype conversion ----------------------------------------------------------------------

constexpr bool is_float(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64;
}

template <class T>
T load_raw(const void* p, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(p) + i * sizeof(T), sizeof(T));
  return v;
}
template <class T>
void store_raw(void* p, size_t i, T v) {
  std::memcpy(static_cast<char*>(p) + i * sizeof(T), &v, sizeof(T));
}

// Floats travel as double (exact for all four); integers as int64 (exact for all three).
template <DType F>
auto load(const void* p, size_t i) {
  if constexpr (F == DType::F32) return static_cast<double>(load_raw<float>(p, i));
  else if constexpr (F == DType::F64) return load_raw<double>(p, i);
  else if constexpr (F == DType::F16) return static_cast<double>(f16_to_f32(load_raw<uint16_t>(p, i)));
  else if constexpr (F == DType::BF16) return static_cast<double>(bf16_to_f32(load_raw<uint16_t>(p, i)));
  else if constexpr (F == DType::I64) return load_raw<int64_t>(p, i);
  else if constexpr (F == DType::I32) return static_cast<int64_t>(load_raw<int32_t>(p, i));
  else return static_cast<int64_t>(load_raw<uint8_t>(p, i));
}

// F64 -> F16/BF16 rounds through F32; a double rounding that can differ from a direct rounding
// in the last bit only for values within 2^-29 relative of a half-way point.
template <DType T, class V>
void store(void* p, size_t i, V v) {
  if constexpr (T == DType::F32) store_raw<float>(p, i, static_cast<float>(v));
  else if constexpr (T == DType::F64) store_raw<double>(p, i, v);
  else if constexpr (T == DType::F16) store_raw<uint16_t>(p, i, f32_to_f16(static_cast<float>(v)));
  else if constexpr (T == DType::BF16) store_raw<uint16_t>(p, i, f32_to_bf16(static_cast<float>(v)));
  else {
    using Out = std::conditional_t<T == DType::I64, int64_t, std::conditional_t<T == DType::I32, int32_t, uint8_t>>;
    ANATOMY_CHECK(v >= std::numeric_limits<Out>::min() && v <= std::numeric_limits<Out>::max(), "value ", v,
                  " does not fit ", dtype_name(T));
    store_raw<Out>(p, i, static_cast<Out>(v));
  }
}

template <DType F, DType T>
void convert_loop(const void* src, void* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) store<T>(dst, i, load<F>(src, i));
}

template <DType F>
void convert_from(const void* src, void* dst, DType to, size_t n) {
  if constexpr (is_float(F)) {
    switch (to) {
      case DType::F32: return convert_loop<F, DType::F32>(src, dst, n);
      case DType::F64: return convert_loop<F, DType::F64>(src, dst, n);
      case DType::F16: return convert_loop<F, DType::F16>(src, dst, n);
      case DType::BF16: return convert_loop<F, DType::BF16>(src, dst, n);
      default: break;
    }
  } else {
    switch (to) {
      case DType::I64: return convert_loop<F, DType::I64>(src, dst, n);
      case DType::I32: return convert_loop<F, DType::I32>(src, dst, n);
      case DType::U8: return convert_loop<F, DType::U8>(src, dst, n);
      default: break;
    }
  }
  fail("cannot convert ", dtype_name(F), " to ", dtype_name(to));
}

}  // namespace

std::string shape_str(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

size_t SafetensorsTensorInfo::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

bool can_convert(DType from, DType to) { return from == to || is_float(from) == is_float(to); }

void convert_dtype(const void* src, DType from, void* dst, DType to, size_t n) {
  if (from == to) {
    std::memcpy(dst, src, n * dtype_size(from));
    return;
  }
  switch (from) {
    case DType::F32: return convert_from<DType::F32>(src, dst, to, n);
    case DType::F64: return convert_from<DType::F64>(src, dst, to, n);
    case DType::F16: return convert_from<DType::F16>(src, dst, to, n);
    case DType::BF16: return convert_from<DType::BF16>(src, dst, to, n);
    case DType::I64: return convert_from<DType::I64>(src, dst, to, n);
    case DType::I32: return convert_from<DType::I32>(src, dst, to, n);
    case DType::U8: return convert_from<DType::U8>(src, dst, to, n);
  }
}

// ---- reader ----------------------------------------------------------------------------------

SafetensorsReader SafetensorsReader::open(const std::string& path) {
  SafetensorsReader r;
  r.m_path = path;
  // O_NONBLOCK: a FIFO named as weights would block the open forever; fstat then refuses it.
  r.m_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  ANATOMY_CHECK(r.m_fd >= 0, path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  ANATOMY_CHECK(::fstat(r.m_fd, &st) == 0, path, ": cannot stat: ", std::strerror(errno));
  ANATOMY_CHECK(S_ISREG(st.st_mode), path, ": not a regular file (a FIFO, directory or device cannot be read as one)");
  const auto file_size = static_cast<uint64_t>(st.st_size);
  ANATOMY_CHECK(file_size >= 8, path, ": file is ", file_size,
                " bytes, too short for a safetensors header length (8 bytes)");

  uint64_t n = 0;
  r.m_data_start = 0;  // pread_exact reads relative to m_data_start
  r.pread_exact(&n, 8, 0);
  ANATOMY_CHECK(n <= file_size - 8, path, ": header length ", n, " runs past the end of the file (", file_size,
                " bytes; truncated or not a safetensors file?)");
  ANATOMY_CHECK(n <= kSafetensorsMaxHeaderBytes, path, ": header length ", n, " exceeds the ",
                kSafetensorsMaxHeaderBytes >> 20, " MiB limit");
  std::string text(static_cast<size_t>(n), '\0');
  r.pread_exact(text.data(), text.size(), 8);
  r.m_data_start = 8 + n;
  r.m_data_size = file_size - 8 - n;

  json header = parse_header(path, text);
  ANATOMY_CHECK(header.is_object(), path, ": header must be a JSON object, got ", header.type_name());

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      ANATOMY_CHECK(value.is_object(), path, ": '__metadata__' must be an object of strings");
      for (const auto& [mk, mv] : value.items()) {
        ANATOMY_CHECK(mv.is_string(), path, ": '__metadata__' value for ", quote_name(mk), " must be a string");
        r.m_metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    r.m_tensors.push_back(parse_tensor(path, key, value, r.m_data_size));
  }

  // Overlap: order by begin; every non-empty tensor must start at or after the furthest end so far.
  std::vector<const SafetensorsTensorInfo*> by_offset;
  for (const auto& t : r.m_tensors)
    if (t.end > t.begin) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  const SafetensorsTensorInfo* furthest = nullptr;
  for (const auto* t : by_offset) {
    ANATOMY_CHECK(!furthest || t->begin >= furthest->end, path, ": tensors ", quote_name(furthest ? furthest->name : ""),
                  " and ", quote_name(t->name), " overlap in the data buffer");
    if (!furthest || t->end > furthest->end) furthest = t;
  }
  std::sort(r.m_tensors.begin(), r.m_tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return r;
}

SafetensorsReader::~SafetensorsReader() {
  if (m_fd >= 0) ::close(m_fd);
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& o) noexcept
    : m_path(std::move(o.m_path)),
      m_fd(std::exchange(o.m_fd, -1)),
      m_data_start(o.m_data_start),
      m_data_size(o.m_data_size),
      m_tensors(std::move(o.m_tensors)),
      m_metadata(std::move(o.m_metadata)) {}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& o) noexcept {
  if (this != &o) {
    if (m_fd >= 0) ::close(m_fd);
    m_path = std::move(o.m_path);
    m_fd = std::exchange(o.m_fd, -1);
    m_data_start = o.m_data_start;
    m_data_size = o.m_data_size;
    m_tensors = std::move(o.m_tensors);
    m_metadata = std::move(o.m_metadata);
  }
  return *this;
}

const SafetensorsTensorInfo* SafetensorsReader::find(std::string_view name) const {
  auto it = std::lower_bound(m_tensors.begin(), m_tensors.end(), name,
                             [](const SafetensorsTensorInfo& t, std::string_view n) { return t.name < n; });
  return it != m_tensors.end() && it->name == name ? &*it : nullptr;
}

const SafetensorsTensorInfo& SafetensorsReader::info(std::string_view name) const {
  const SafetensorsTensorInfo* t = find(name);
  ANATOMY_CHECK(t, m_path, ": no tensor named ", quote_name(name));
  return *t;
}

void SafetensorsReader::pread_exact(void* dst, size_t n, uint64_t offset) const {
  char* p = static_cast<char*>(dst);
  uint64_t pos = m_data_start + offset;
  while (n > 0) {
    ssize_t got = ::pread(m_fd, p, n, static_cast<off_t>(pos));
    if (got < 0 && errno == EINTR) continue;
    ANATOMY_CHECK(got >= 0, m_path, ": read failed at byte ", pos, ": ", std::strerror(errno));
    ANATOMY_CHECK(got > 0, m_path, ": unexpected end of file at byte ", pos, " (file truncated while open?)");
    p += got;
    pos += static_cast<uint64_t>(got);
    n -= static_cast<size_t>(got);
  }
}

void SafetensorsReader::read(std::string_view name, DType to, void* dst, std::span<const int64_t> expected,
                             std::string_view expected_from) const {
  const SafetensorsTensorInfo& t = info(name);
  if (!std::equal(t.shape.begin(), t.shape.end(), expected.begin(), expected.end())) {
    fail(m_path, ": tensor ", quote_name(t.name), " has shape ", shape_str(t.shape), ", expected ", shape_str(expected),
         expected_from.empty() ? "" : " from ", expected_from);
  }
  ANATOMY_CHECK(can_convert(t.dtype, to), m_path, ": tensor ", quote_name(t.name), " is ", dtype_name(t.dtype),
                " and cannot be converted to ", dtype_name(to));
  const size_t numel = t.numel();
  if (t.dtype == to) {
    pread_exact(dst, t.bytes(), t.begin);
    return;
  }
  // Convert in chunks so a large tensor never needs a second full-size buffer.
  const size_t in_size = dtype_size(t.dtype), out_size = dtype_size(to);
  const size_t chunk = std::max<size_t>(1, (8u << 20) / in_size);
  std::vector<uint8_t> buf(std::min(numel, chunk) * in_size);
  for (size_t done = 0; done < numel;) {
    size_t k = std::min(chunk, numel - done);
    pread_exact(buf.data(), k * in_size, t.begin + done * in_size);
    try {
      convert_dtype(buf.data(), t.dtype, static_cast<char*>(dst) + done * out_size, to, k);
    } catch (const Error& e) {
      fail(m_path, ": tensor ", quote_name(t.name), ": ", e.what());
    }
    done += k;
  }
}

void SafetensorsReader::read(std::string_view name, const Tensor& dst, std::string_view expected_from) const {
  ANATOMY_CHECK(dst.device == Device::CPU && dst.defined(), "internal error: ", m_path, ": reading tensor ",
                quote_name(name), " needs a defined host tensor");
  std::vector<int64_t> expected(dst.shape.d.begin(), dst.shape.d.begin() + dst.shape.rank);
  read(name, dst.dtype, dst.data, expected, expected_from);
}

std::vector<uint8_t> SafetensorsReader::read_bytes(std::string_view name) const {
  const SafetensorsTensorInfo& t = info(name);
  std::vector<uint8_t> out(t.bytes());
  pread_exact(out.data(), out.size(), t.begin);
  return out;
}

// ---- writer ----------------------------------------------------------------------------------

SafetensorsEntry safetensors_entry(std::string name, const Tensor& t) {
  ANATOMY_CHECK(t.device == Device::CPU, "internal error: safetensors entry ", quote_name(name), " is not in host memory");
  return {std::move(name), t.dtype, std::vector<int64_t>(t.shape.d.begin(), t.shape.d.begin() + t.shape.rank),
          t.data};
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<const SafetensorsEntry*> sorted;
  for (const auto& e : entries) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });

  // HF writes "__metadata__" first, then the tensors; ordered_json keeps that order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& m = header["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
  }
  std::vector<size_t> sizes;
  uint64_t offset = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const SafetensorsEntry& e = *sorted[i];
    ANATOMY_CHECK(e.name != "__metadata__", path, ": '__metadata__' is reserved and cannot name a tensor");
    ANATOMY_CHECK(i == 0 || sorted[i - 1]->name != e.name, path, ": tensor ", quote_name(e.name), " given twice");
    size_t numel = 1;
    for (int64_t d : e.shape) {
      ANATOMY_CHECK(d >= 0, path, ": tensor ", quote_name(e.name), " has a negative dimension in ", shape_str(e.shape));
      numel *= static_cast<size_t>(d);
    }
    size_t nbytes = numel * dtype_size(e.dtype);
    ANATOMY_CHECK(e.data || nbytes == 0, path, ": tensor ", quote_name(e.name), " has no data");
    header[e.name] = {{"dtype", std::string(dtype_name(e.dtype))},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + nbytes}}};
    sizes.push_back(nbytes);
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": cannot encode the header (names must be valid UTF-8): ", printable(e.what(), 300));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();

  AtomicFile f(path);
  f.write(&n, 8);
  f.write(text);
  for (size_t i = 0; i < sorted.size(); ++i) f.write(sorted[i]->data, sizes[i]);
  f.commit();
}

}  // namespace anatomy
