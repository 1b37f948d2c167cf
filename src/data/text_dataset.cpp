#include "data/text_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unordered_map>

#include "core/error.h"
#include "core/rng.h"
#include "data/tokenizer.h"
#include "data/tokenizer_json.h"
#include "data/unicode.h"
#include "io/atomic_file.h"
#include "io/read_file.h"

namespace anatomy {

// ---------------------------------------------------------------------------------- labels

// More classes than this is almost surely not a label column (a wrong column?).
static constexpr int64_t kMaxLabelId = int64_t{1} << 16;

LabelSet LabelSet::ids(int64_t num_labels) {
  ANATOMY_CHECK(num_labels >= 1 && num_labels <= kMaxLabelId, "number of labels ", num_labels, " out of range");
  LabelSet s;
  s.kind = Kind::Ids;
  s.num_labels = num_labels;
  return s;
}

LabelSet LabelSet::from_names(std::vector<std::string> names) {
  ANATOMY_CHECK(!names.empty(), "a label set needs at least one label");
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  ANATOMY_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), "label names must be unique");
  LabelSet s;
  s.kind = Kind::Names;
  s.num_labels = static_cast<int64_t>(names.size());
  s.names = std::move(names);
  return s;
}

LabelSet LabelSet::from_integers(std::vector<int64_t> values) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  ANATOMY_CHECK(!values.empty(), "a label set needs at least one label");
  const int64_t n = static_cast<int64_t>(values.size());
  if (values.front() == 0 && values.back() == n - 1) return ids(n);
  ANATOMY_CHECK(n <= kMaxLabelId, "number of labels ", n, " out of range");
  std::vector<std::string> names;
  for (int64_t v : values) names.push_back(std::to_string(v));
  return from_names(std::move(names));
}

int64_t LabelSet::id_of_integer(int64_t v) const {
  if (kind == Kind::Ids) return v >= 0 && v < num_labels ? v : -1;
  const auto it = std::find(names.begin(), names.end(), std::to_string(v));
  return it == names.end() ? -1 : it - names.begin();
}

LabelSet LabelSet::from_id2label(const std::map<int, std::string>& id2label) {
  std::vector<std::string> names;
  bool defaults = true;
  for (const auto& [id, name] : id2label) {
    ANATOMY_CHECK(id == static_cast<int>(names.size()), "id2label must number its labels 0, 1, ... (found id ", id,
                  " after ", names.size(), " labels)");
    defaults = defaults && name == str_cat("LABEL_", id);
    names.push_back(name);
  }
  return defaults ? ids(static_cast<int64_t>(names.size())) : from_names(std::move(names));
}

std::map<int, std::string> LabelSet::id2label() const {
  std::map<int, std::string> m;
  for (int64_t i = 0; i < (kind == Kind::None ? 0 : num_labels); ++i)
    m[static_cast<int>(i)] = kind == Kind::Names ? names[i] : str_cat("LABEL_", i);
  return m;
}

std::map<std::string, int> LabelSet::label2id() const {
  std::map<std::string, int> m;
  for (const auto& [id, name] : id2label()) m[name] = id;
  return m;
}

// ---------------------------------------------------------------------------------- Hash64

namespace {
constexpr uint64_t P1 = 0x9E3779B185EBCA87ULL, P2 = 0xC2B2AE3D27D4EB4FULL, P3 = 0x165667B19E3779F9ULL,
                   P4 = 0x85EBCA77C2B2AE63ULL, P5 = 0x27D4EB2F165667C5ULL;
inline uint64_t round64(uint64_t acc, uint64_t w) { return std::rotl(acc + w * P2, 31) * P1; }
inline uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // little-endian hosts only (x86-64, aarch64), as the cache itself
}
}  // namespace

Hash64::Hash64(uint64_t seed) : m_lane{seed + P1 + P2, seed + P2, seed, seed - P1}, m_buf{} {}

Hash64& Hash64::update(const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  m_total += n;
  if (m_buffered) {
    const size_t take = std::min(n, 32 - m_buffered);
    std::memcpy(m_buf + m_buffered, p, take);
    m_buffered += take;
    p += take;
    n -= take;
    if (m_buffered < 32) return *this;
    for (int l = 0; l < 4; ++l) m_lane[l] = round64(m_lane[l], load64(m_buf + 8 * l));
    m_buffered = 0;
  }
  for (; n >= 32; p += 32, n -= 32)
    for (int l = 0; l < 4; ++l) m_lane[l] = round64(m_lane[l], load64(p + 8 * l));
  std::memcpy(m_buf, p, n);
  m_buffered = n;
  return *this;
}

Hash64& Hash64::field(std::string_view s) {
  field(static_cast<uint64_t>(s.size()));
  return update(s);
}

uint64_t Hash64::digest() const {
  uint64_t h = std::rotl(m_lane[0], 1) + std::rotl(m_lane[1], 7) + std::rotl(m_lane[2], 12) + std::rotl(m_lane[3], 18);
  for (uint64_t lane : m_lane) h = (h ^ round64(0, lane)) * P1 + P4;
  h += m_total;
  size_t i = 0;
  for (; i + 8 <= m_buffered; i += 8) h = std::rotl(h ^ round64(0, load64(m_buf + i)), 27) * P1 + P4;
  for (; i < m_buffered; ++i) h = std::rotl(h ^ (m_buf[i] * P5), 11) * P1;
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  return h ^ (h >> 32);
}

uint64_t hash64(std::string_view bytes, uint64_t seed) { return Hash64(seed).update(bytes).digest(); }

// ---------------------------------------------------------------------------------- files

namespace {

// A read-only mapping of a whole file; empty files map to nothing.
struct Mapping {
  void* addr = nullptr;
  size_t bytes = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (addr) ::munmap(addr, bytes);
  }
  std::string_view view() const { return {static_cast<const char*>(addr), bytes}; }
  void reset() {
    if (addr) ::munmap(addr, bytes);
    addr = nullptr;
    bytes = 0;
  }
  // false (errno set) when the file cannot be opened or mapped.
  bool open(const std::string& path, bool& regular) {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever; the
    // fstat below then refuses it like any other file that is not regular.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return false;
    struct stat st {};
    bool ok = ::fstat(fd, &st) == 0;
    regular = ok && S_ISREG(st.st_mode);
    if (ok && regular && st.st_size > 0) {
      void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
      ok = p != MAP_FAILED;
      if (ok) {
        addr = p;
        bytes = static_cast<size_t>(st.st_size);
      }
    }
    const int saved = errno;
    ::close(fd);
    errno = saved;
    return ok;
  }
};

// Note [stale token caches]: a cache is named by the hash of the text and options it was made
// from, so each edit of a data file leaves the caches of its earlier versions behind, never to be
// read again. Writing a new cache removes those of the same data file's name beside it that are
// older than the file itself (made before its last change); caches of other options (another
// tokenizer, length) made since stay.
void remove_stale_caches(const std::string& data_path, const std::string& new_cache) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto data_time = fs::last_write_time(data_path, ec);
  if (ec) return;
  const fs::path dir = fs::path(new_cache).parent_path();
  const std::string stem = fs::path(data_path).filename().string() + ".", suffix = ".anatomy-cache";
  for (const auto& e : fs::directory_iterator(dir.empty() ? fs::path(".") : dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool ours = name.size() == stem.size() + 16 + suffix.size() && name.rfind(stem, 0) == 0 &&
                      name.ends_with(suffix) &&
                      name.find_first_not_of("0123456789abcdef", stem.size()) == stem.size() + 16;
    if (!ours || e.path() == fs::path(new_cache)) continue;
    std::error_code ignore;
    if (fs::last_write_time(e.path(), ignore) < data_time && !ignore) fs::remove(e.path(), ignore);
  }
}

constexpr char kMagic[8] = {'A', 'N', 'A', 'T', 'T', 'X', 'T', '3'};

struct CacheHeader {
  char magic[8];
  uint64_t key;
  uint64_t n;       // samples
  uint64_t tokens;  // total tokens
  uint64_t names_offset, names_bytes;
  int64_t max_length;
  uint32_t label_kind;  // LabelSet::Kind
  uint32_t num_labels;
  uint64_t checksum;  // Hash64 of every byte after the header (Note [token cache checksum])
};
static_assert(sizeof(CacheHeader) == 72);

// Note [token cache checksum]: the cache's name carries the hash of the text and options it was
// made from, but a file damaged after it was written (a bad disk, a copy cut short, an edit) would
// otherwise be mapped and trusted: token ids out of the vocabulary fail deep in the embedding with
// an error naming neither file, every later run the same way. So the header records a Hash64 of
// every byte after it, the loader also checks ids, types, labels and offsets against their
// ranges, and a cache that fails any check is reported in one line naming it and rebuilt from
// the text (atomically, so a run killed meanwhile leaves the damaged one or a good one).
constexpr uint64_t kChecksumSeed = 0x746f6b2d63616368ULL;
constexpr const char* kMissing = "does not exist";

constexpr uint64_t align8(uint64_t x) { return (x + 7) & ~uint64_t{7}; }

// Byte offsets of the sections for n samples and `tokens` tokens.
struct Layout {
  uint64_t offsets, labels, ids, types, names;
  Layout(uint64_t n, uint64_t tokens) {
    offsets = sizeof(CacheHeader);
    labels = offsets + 8 * (n + 1);
    ids = align8(labels + 4 * n);
    types = align8(ids + 4 * tokens);
    names = align8(types + tokens);
  }
};

uint64_t tokenizer_fingerprint(const Tokenizer& any) {
  Hash64 h(0x746f6b656e697a65ULL);
  if (any.json()) return h.field("tokenizer.json").field(any.json()->file_bytes()).digest();
  const WordPieceTokenizer& tok = *any.wordpiece();
  for (size_t i = 0; i < tok.vocab_size(); ++i) h.field(tok.id_to_token(static_cast<int32_t>(i)));
  const BertNormalizerConfig& n = tok.normalizer();
  h.field(uint64_t{n.clean_text}).field(uint64_t{n.handle_chinese_chars}).field(uint64_t{n.lowercase});
  h.field(n.strip_accents ? uint64_t{*n.strip_accents} : uint64_t{2});
  h.field(static_cast<uint64_t>(tok.semantics())).field(tok.max_input_chars_per_word());
  for (int32_t id : {tok.cls_id(), tok.sep_id(), tok.pad_id(), tok.unk_id()}) h.field(static_cast<uint64_t>(id));
  return h.digest();
}

std::string hex16(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[i] = digits[v & 15];
  return s;
}

std::string shown(std::string_view s) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 60; ++i) out += static_cast<unsigned char>(s[i]) < 0x20 ? '?' : s[i];
  return out + (s.size() > 60 ? "...'" : "'");
}

std::string known_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 10; ++i) out += (i ? ", " : "") + shown(names[i]);
  if (names.size() > 10) out += str_cat(", ... (", names.size(), " in all)");
  return out;
}

// A distinct label text as it appeared first.
struct RawLabel {
  std::string text;
  bool integer = false;
  size_t first_line = 0;
};

// The value of an integer label, or an error naming where it was.
int64_t integer_label(const std::string& path, const RawLabel& r) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(r.text.data(), r.text.data() + r.text.size(), v);
  ANATOMY_CHECK(ec == std::errc() && ptr == r.text.data() + r.text.size(), path, ":", r.first_line, ": label ",
                shown(r.text), " is not a 64-bit integer");
  return v;
}

// Ids for the distinct labels (codes) of a file, and the LabelSet they imply.
std::vector<int32_t> resolve_labels(const std::string& path, const std::vector<RawLabel>& raw,
                                    const std::optional<LabelSet>& given, LabelSet& out) {
  std::vector<int32_t> id(raw.size());
  const bool derive = !given || given->kind == LabelSet::Kind::None;
  if (!derive && given->kind == LabelSet::Kind::Names) {
    std::unordered_map<std::string, int32_t> index;
    for (size_t i = 0; i < given->names.size(); ++i) index.emplace(given->names[i], static_cast<int32_t>(i));
    for (size_t c = 0; c < raw.size(); ++c) {
      auto it = index.find(raw[c].text);
      // An integer written otherwise ("007" for the class "7") is the same class.
      const int64_t by_value = it == index.end() && raw[c].integer ? given->id_of_integer(integer_label(path, raw[c])) : -1;
      ANATOMY_CHECK(it != index.end() || by_value >= 0, path, ":", raw[c].first_line, ": unknown label ",
                    shown(raw[c].text), " (known labels: ", known_list(given->names), ")");
      id[c] = static_cast<int32_t>(it != index.end() ? it->second : by_value);
    }
    out = *given;
    return id;
  }
  if (!derive) {  // Ids
    for (size_t c = 0; c < raw.size(); ++c) {
      ANATOMY_CHECK(raw[c].integer, path, ":", raw[c].first_line, ": unknown label ", shown(raw[c].text),
                    " (the labels are integer ids 0..", given->num_labels - 1, ")");
      const int64_t v = integer_label(path, raw[c]);
      ANATOMY_CHECK(given->id_of_integer(v) >= 0, path, ":", raw[c].first_line, ": unknown label ", v,
                    " (the labels are integer ids 0..", given->num_labels - 1, ")");
      id[c] = static_cast<int32_t>(v);
    }
    out = *given;
    return id;
  }
  const bool all_integer = std::all_of(raw.begin(), raw.end(), [](const RawLabel& r) { return r.integer; });
  // A column mixing integers and names has no one meaning (is "1" a class id or a name?): refused
  // at the first line whose label is of the other kind than the file's first label.
  for (const RawLabel& r : raw)
    ANATOMY_CHECK(raw.empty() || r.integer == raw[0].integer, path, ":", r.first_line, ": label ", shown(r.text), " is ",
                  r.integer ? "an integer" : "a name", " but line ", raw[0].first_line, "'s label ", shown(raw[0].text),
                  " is ", raw[0].integer ? "an integer" : "a name", "; a label column holds class ids or class names, not both");
  if (all_integer) {  // run_glue.py's rule: the sorted distinct values are the classes 0..n-1
    std::vector<int64_t> value(raw.size());
    for (size_t c = 0; c < raw.size(); ++c) value[c] = integer_label(path, raw[c]);
    out = LabelSet::from_integers(value);
    for (size_t c = 0; c < raw.size(); ++c) id[c] = static_cast<int32_t>(out.id_of_integer(value[c]));
    return id;
  }
  std::vector<std::string> names;
  for (const RawLabel& r : raw) names.push_back(r.text);
  std::sort(names.begin(), names.end());
  for (size_t c = 0; c < raw.size(); ++c)
    id[c] = static_cast<int32_t>(std::lower_bound(names.begin(), names.end(), raw[c].text) - names.begin());
  out = LabelSet::from_names(std::move(names));
  return id;
}

}  // namespace

// ---------------------------------------------------------------------------------- dataset

struct TextDataset::Storage {
  Mapping map;  // a cache file, or nothing when the vectors hold the samples
  std::vector<uint64_t> offsets;
  std::vector<int32_t> labels, ids;
  std::vector<uint8_t> types;

  // Maps a cache file and checks it against the key, its checksum and its own sizes. Returns
  // empty on success; otherwise why it was not used ("" is never returned for a failure: a
  // missing file says so), with nothing kept, and the cache is rebuilt.
  std::string map_cache(const std::string& path, uint64_t key, int64_t max_length, LabelSet& label_set,
                        const Tokenizer& tok) {
    bool regular = false;
    if (!map.open(path, regular)) return reject(errno == ENOENT ? kMissing : "cannot be read");
    if (!regular) return reject("is not a regular file");
    if (map.bytes < sizeof(CacheHeader)) return reject("is shorter than its header");
    const char* base = static_cast<const char*>(map.addr);
    CacheHeader h;
    std::memcpy(&h, base, sizeof h);
    if (std::memcmp(h.magic, kMagic, 8) != 0) return reject("is not a token cache of this version");
    if (h.key != key || h.max_length != max_length) return reject("was made from other text or options");
    if (hash64({base + sizeof h, map.bytes - sizeof h}, kChecksumSeed) != h.checksum)
      return reject("fails its checksum (damaged)");
    if (h.n == 0 || h.n > map.bytes || h.tokens > map.bytes || h.label_kind > 2) return reject("has impossible sizes");
    const Layout lay(h.n, h.tokens);
    if (lay.names > map.bytes || h.names_offset != lay.names || h.names_bytes != map.bytes - lay.names)
      return reject("has impossible sizes");
    const uint64_t* off = reinterpret_cast<const uint64_t*>(base + lay.offsets);
    if (off[0] != 0 || off[h.n] != h.tokens) return reject("has impossible sample offsets");
    for (uint64_t i = 0; i < h.n; ++i)
      if (off[i + 1] < off[i] || off[i + 1] - off[i] > static_cast<uint64_t>(max_length))
        return reject("has impossible sample offsets");
    const int32_t* lab = reinterpret_cast<const int32_t*>(base + lay.labels);
    const int64_t hi = h.label_kind == 0 ? 1 : h.num_labels;
    for (uint64_t i = 0; i < h.n; ++i)
      if (lab[i] < 0 || lab[i] >= hi) return reject("holds a label out of range");
    const int32_t* id = reinterpret_cast<const int32_t*>(base + lay.ids);
    const uint8_t* type = reinterpret_cast<const uint8_t*>(base + lay.types);
    const int64_t vocab = static_cast<int64_t>(tok.vocab_size());
    for (uint64_t i = 0; i < h.tokens; ++i)
      if (id[i] < 0 || id[i] >= vocab || type[i] > 1) return reject("holds a token id outside the vocabulary");
    LabelSet s;
    s.kind = static_cast<LabelSet::Kind>(h.label_kind);
    s.num_labels = h.num_labels;
    for (uint64_t p = lay.names; p < map.bytes;) {
      uint32_t len = 0;
      if (map.bytes - p < 4) return reject("has a damaged label table");
      std::memcpy(&len, base + p, 4);
      if (map.bytes - p - 4 < len) return reject("has a damaged label table");
      s.names.emplace_back(base + p + 4, len);
      p += 4 + uint64_t{len};
    }
    if (s.kind == LabelSet::Kind::Names && s.names.size() != h.num_labels) return reject("has a damaged label table");
    label_set = std::move(s);
    return "";
  }
  std::string reject(const char* why) {
    map.reset();
    return why;
  }

  void write_cache(const std::string& path, uint64_t key, int64_t max_length, const LabelSet& ls) const {
    const uint64_t n = labels.size(), tokens = ids.size();
    const Layout lay(n, tokens);
    std::string names;
    for (const std::string& s : ls.names) {
      const uint32_t len = static_cast<uint32_t>(s.size());
      names.append(reinterpret_cast<const char*>(&len), 4).append(s);
    }
    CacheHeader h{};
    // Every byte after the header, in file order, first into the checksum and then into the file.
    auto body = [&](auto&& put) {
      put(offsets.data(), 8 * offsets.size(), lay.offsets);
      put(labels.data(), 4 * n, lay.labels);
      put(ids.data(), 4 * tokens, lay.ids);
      put(types.data(), tokens, lay.types);
      put(names.data(), names.size(), lay.names);
    };
    static const char zeros[8] = {};
    Hash64 sum(kChecksumSeed);
    uint64_t at = sizeof h;
    body([&](const void* p, size_t bytes, uint64_t where) {
      sum.update(zeros, where - at).update(p, bytes);
      at = where + bytes;
    });
    h.checksum = sum.digest();
    std::memcpy(h.magic, kMagic, 8);
    h.key = key;
    h.n = n;
    h.tokens = tokens;
    h.names_offset = lay.names;
    h.names_bytes = names.size();
    h.max_length = max_length;
    h.label_kind = static_cast<uint32_t>(ls.kind);
    h.num_labels = static_cast<uint32_t>(ls.num_labels);
    AtomicFile f(path);
    f.write(&h, sizeof h);
    at = sizeof h;
    body([&](const void* p, size_t bytes, uint64_t where) {
      ANATOMY_ASSERT(where >= at && where - at < 8);
      f.write(zeros, where - at);
      f.write(p, bytes);
      at = where + bytes;
    });
    f.commit();
  }
};

TextDataset::~TextDataset() = default;
TextDataset::TextDataset(TextDataset&&) noexcept = default;
TextDataset& TextDataset::operator=(TextDataset&&) noexcept = default;

void TextDataset::bind() {
  Storage& s = *m_storage;
  if (s.map.addr) {
    const char* base = static_cast<const char*>(s.map.addr);
    CacheHeader h;
    std::memcpy(&h, base, sizeof h);
    const Layout lay(h.n, h.tokens);
    m_n = h.n;
    m_offsets = reinterpret_cast<const uint64_t*>(base + lay.offsets);
    m_labels = reinterpret_cast<const int32_t*>(base + lay.labels);
    m_ids = reinterpret_cast<const int32_t*>(base + lay.ids);
    m_types = reinterpret_cast<const uint8_t*>(base + lay.types);
  } else {
    m_n = s.labels.size();
    m_offsets = s.offsets.data();
    m_labels = s.labels.data();
    m_ids = s.ids.data();
    m_types = s.types.data();
  }
}

void use_run_glue_columns(TextDataOptions& o, const std::string& path) {
  std::string said;
  const RecordColumns c = default_text_columns(path, o.source_flag, o.format, o.delimiter,
                                               {o.text_column, o.text_pair_column, o.label_column}, said);
  o.text_column = c.text;
  o.text_pair_column = c.text_pair;
  if (!said.empty()) std::fprintf(stderr, "anatomy: %s\n", said.c_str());
}

void use_run_mlm_column(TextDataOptions& o, const std::string& path) {
  const std::vector<std::string> names = text_file_columns(path, o.format, o.delimiter);
  // An unnamed first column (a pandas index: ",sentence,...") is no text: loading says what is missing.
  if (names.empty() || names[0].empty() || std::find(names.begin(), names.end(), o.text_column) != names.end()) return;
  std::fprintf(stderr, "anatomy: %s%s%s has no '%s' column: reading '%s' as the text, as run_mlm.py would (--text-column names another)\n",
               o.source_flag.c_str(), o.source_flag.empty() ? "" : " ", path.c_str(), o.text_column.c_str(), names[0].c_str());
  o.text_column = names[0];
}

TextDataset TextDataset::load(const std::string& path, const Tokenizer& tok, const TextDataOptions& opt) {
  const bool pair = !opt.text_pair_column.empty();
  // Room for the tokenizer's special tokens ([CLS] a [SEP] b [SEP], <s> a </s></s> b </s>, ...).
  const std::optional<std::string_view> empty_pair = pair ? std::optional<std::string_view>("") : std::nullopt;
  const auto min_length = std::max<int64_t>(
      1, static_cast<int64_t>(tok.encode("", empty_pair, 0, Truncation::None, Padding::None).input_ids.size()));
  ANATOMY_CHECK(opt.max_length >= min_length && opt.max_length <= kMaxTextTokens, path, ": --max-seq-length ",
                opt.max_length, " cannot hold ", pair ? "a text pair's" : "a text's", " special tokens: it must lie in [",
                min_length, ", ", kMaxTextTokens, "]");
  const TextFormat format = opt.format == TextFormat::Auto ? format_from_path(path) : opt.format;

  // Read, not mapped: a file cut short while it is tokenized is an error, not SIGBUS.
  const std::string data = read_regular_file(path, opt.source_flag);
  ANATOMY_CHECK(!data.empty(), path, ": the file is empty");

  TextDataset ds;
  ds.m_path = path;
  ds.m_max_length = opt.max_length;
  ds.m_pad_id = tok.pad_id() >= 0 ? tok.pad_id() : 0;
  ds.m_storage = std::make_unique<Storage>();

  Hash64 key(0x616e61746f6d7931ULL);
  key.field("anatomy text cache v2").field(data).field(tokenizer_fingerprint(tok));
  key.field(static_cast<uint64_t>(format)).field(static_cast<uint64_t>(static_cast<unsigned char>(opt.delimiter)));
  key.field(opt.text_column).field(opt.text_pair_column).field(opt.label_column);
  key.field(static_cast<uint64_t>(opt.max_length)).field(static_cast<uint64_t>(opt.skip_blank_texts));
  if (opt.labels) {
    key.field(static_cast<uint64_t>(opt.labels->kind) + 1).field(static_cast<uint64_t>(opt.labels->num_labels));
    for (const std::string& s : opt.labels->names) key.field(s);
  }
  const uint64_t k = key.digest();

  if (opt.cache == CacheMode::ReadWrite) {
    namespace fs = std::filesystem;
    const std::string name = fs::path(path).filename().string() + "." + hex16(k) + ".anatomy-cache";
    if (opt.cache_dir.empty()) {
      ds.m_cache_path = path + "." + hex16(k) + ".anatomy-cache";
    } else {
      std::error_code ec;
      fs::create_directories(opt.cache_dir, ec);  // a failure shows up when writing
      ds.m_cache_path = (fs::path(opt.cache_dir) / name).string();
    }
    const std::string problem = ds.m_storage->map_cache(ds.m_cache_path, k, opt.max_length, ds.m_label_set, tok);
    if (problem.empty()) {
      ds.m_status = CacheStatus::Reused;
      ds.bind();
      return ds;
    }
    if (problem != kMissing) ds.m_cache_problem = problem;
  }

  // Tokenize every record; labels are kept as codes of distinct texts until all are seen.
  Storage& s = *ds.m_storage;
  s.offsets.push_back(0);
  std::vector<RawLabel> raw;
  std::unordered_map<std::string, uint32_t> code_of;
  std::vector<uint32_t> codes;
  RecordColumns cols{opt.text_column, opt.text_pair_column, opt.label_column};
  read_text_records(data, path, format, opt.delimiter, cols, opt.max_record_bytes, [&](const TextRecord& r) {
    if (opt.skip_blank_texts && unicode::is_blank_text(r.text)) return;
    const Encoding e = tok.encode(r.text, pair ? std::optional<std::string_view>(r.text_pair) : std::nullopt,
                                  static_cast<size_t>(opt.max_length), Truncation::LongestFirst, Padding::None);
    s.ids.insert(s.ids.end(), e.input_ids.begin(), e.input_ids.end());
    for (int32_t t : e.token_type_ids) s.types.push_back(static_cast<uint8_t>(t));
    s.offsets.push_back(s.ids.size());
    if (opt.label_column.empty()) return;
    auto [it, added] = code_of.try_emplace(std::string(r.label), static_cast<uint32_t>(raw.size()));
    if (added) raw.push_back({std::string(r.label), r.label_is_integer, r.line});
    codes.push_back(it->second);
  });
  const size_t n = s.offsets.size() - 1;
  if (opt.label_column.empty()) {
    ds.m_label_set = LabelSet{};
    s.labels.assign(n, 0);
  } else {
    const std::vector<int32_t> id = resolve_labels(path, raw, opt.labels, ds.m_label_set);
    s.labels.resize(n);
    for (size_t i = 0; i < n; ++i) s.labels[i] = id[codes[i]];
  }

  ds.m_status = CacheStatus::InMemory;
  const std::string cache_tried = ds.m_cache_path;
  if (opt.cache == CacheMode::ReadWrite) {
    // An unwritable place (a read-only data directory) only costs the cache, not the run.
    try {
      s.write_cache(ds.m_cache_path, k, opt.max_length, ds.m_label_set);
      auto mapped = std::make_unique<Storage>();
      LabelSet check;
      if (mapped->map_cache(ds.m_cache_path, k, opt.max_length, check, tok).empty() && check == ds.m_label_set) {
        ds.m_storage = std::move(mapped);
        ds.m_status = CacheStatus::Created;
        remove_stale_caches(path, ds.m_cache_path);
      }
    } catch (const Error&) {
    }
  }
  if (!ds.m_cache_problem.empty())  // Note [token cache checksum]: said once, never silently
    std::fprintf(stderr, "anatomy: token cache %s %s; %s from %s\n", cache_tried.c_str(), ds.m_cache_problem.c_str(),
                 ds.m_status == CacheStatus::Created ? "rebuilt it" : "tokenized again in memory", path.c_str());
  if (ds.m_status == CacheStatus::InMemory) ds.m_cache_path.clear();
  ds.bind();
  return ds;
}

void TextDataset::get(size_t i, HostBatch& out, int64_t row) const {
  ANATOMY_CHECK(i < m_n, m_path, ": sample ", i, " out of range (", m_n, " samples)");
  ANATOMY_CHECK(row >= 0 && row < out.batch, "internal error: batch row ", row, " out of range");
  const int64_t T = out.seq, len = length(i);
  ANATOMY_CHECK(len <= T, "internal error: sample ", i, " of ", m_path, " has ", len,
                " tokens, more than the batch length ", T);
  int32_t* ids = out.input_ids.data() + row * T;
  int32_t* types = out.token_type_ids.data() + row * T;
  int32_t* mask = out.attention_mask.data() + row * T;
  const int32_t* src = m_ids + m_offsets[i];
  const uint8_t* ty = m_types + m_offsets[i];
  for (int64_t t = 0; t < T; ++t) {
    const bool tok = t < len;
    ids[t] = tok ? src[t] : m_pad_id;
    types[t] = tok ? ty[t] : 0;
    mask[t] = tok ? 1 : 0;
  }
  out.labels[row] = m_labels[i];
}

std::vector<int64_t> TextDataset::lengths() const {
  std::vector<int64_t> out(m_n);
  for (size_t i = 0; i < m_n; ++i) out[i] = length(i);
  return out;
}

int64_t TextDataset::longest_in(const std::vector<size_t>& indices) const {
  int64_t longest = 0;
  for (size_t i : indices) {
    ANATOMY_CHECK(i < m_n, m_path, ": sample ", i, " out of range (", m_n, " samples)");
    longest = std::max(longest, length(i));
  }
  return longest;
}

// ---------------------------------------------------------------------------------- sampling

std::vector<std::vector<size_t>> bucketed_batches(const std::vector<int64_t>& lengths, int64_t batch, uint64_t seed,
                                                  size_t batches_per_chunk) {
  ANATOMY_CHECK(batch >= 1 && batches_per_chunk >= 1, "bucketed_batches: batch and chunk must be positive");
  const size_t n = lengths.size(), B = static_cast<size_t>(batch);
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  Rng rng(mix64(seed ^ 0x6275636b65747321ULL));
  for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng.next() % i]);
  const size_t chunk = B * batches_per_chunk;
  for (size_t c = 0; c < n; c += chunk) {
    auto first = order.begin() + c, last = order.begin() + std::min(n, c + chunk);
    std::stable_sort(first, last, [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
  }
  std::vector<std::vector<size_t>> batches;
  for (size_t b = 0; b < n; b += B) batches.emplace_back(order.begin() + b, order.begin() + std::min(n, b + B));
  for (size_t i = batches.size(); i > 1; --i) std::swap(batches[i - 1], batches[rng.next() % i]);
  return batches;
}

TrainValSplit split(size_t n, double fraction, uint64_t seed) {
  ANATOMY_CHECK(std::isfinite(fraction) && fraction > 0 && fraction < 1, "validation fraction ", fraction,
                " must be in (0, 1)");
  ANATOMY_CHECK(n >= 2, "cannot split ", n, " sample", n == 1 ? "" : "s", " into training and validation sets");
  const size_t k = std::clamp<size_t>(static_cast<size_t>(std::llround(static_cast<double>(n) * fraction)), 1, n - 1);
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  Rng rng(mix64(seed ^ 0x73706c6974746572ULL));
  for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng.next() % i]);
  TrainValSplit s{std::vector<size_t>(order.begin() + k, order.end()),
                  std::vector<size_t>(order.begin(), order.begin() + k)};
  std::sort(s.train.begin(), s.train.end());
  std::sort(s.val.begin(), s.val.end());
  return s;
}

SubsetDataset::SubsetDataset(const Dataset& base, std::vector<size_t> indices)
    : m_base(base), m_indices(std::move(indices)) {
  for (size_t i : m_indices)
    ANATOMY_CHECK(i < base.size(), "subset index ", i, " out of range (", base.size(), " samples)");
}

}  // namespace anatomy
