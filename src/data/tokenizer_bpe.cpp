// The BPE model of tokenizer.json (no dropout): a word's characters merged pair by pair, the pair
// of lowest merge rank first, the leftmost among equals, until no listed pair remains.
#include <limits>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "data/tokenizer_parts.h"
#include "data/unicode.h"

namespace anatomy::tok {
namespace {

using nlohmann::json;

struct Bpe final : Model {
  std::unordered_map<std::string, int32_t> vocab;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // key(a, b) -> (rank, merged id)
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b); }
  int32_t unk = -1;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::string prefix, suffix;  // continuing_subword_prefix, end_of_word_suffix

  int32_t find(const std::string& s) const {
    const auto it = vocab.find(s);
    return it == vocab.end() ? -1 : it->second;
  }

  // Note [BPE merge order]
  // The reference's queue, kept as it is: candidate merges ordered by (rank, position); a popped
  // one is stale when its left symbol was merged away or has no right neighbour, or when the pair
  // now there merges to a different token (a pair that merges to the same token is taken even if
  // its own rank differs, as the reference does). Each merge queues the new pairs on either side.
  void merge_all(std::vector<int32_t>& sym) const {
    const size_t n = sym.size();
    std::vector<ptrdiff_t> prev(n), next(n);
    std::vector<bool> gone(n, false);
    for (size_t i = 0; i < n; ++i) prev[i] = static_cast<ptrdiff_t>(i) - 1, next[i] = i + 1 < n ? static_cast<ptrdiff_t>(i) + 1 : -1;
    struct Cand {
      int32_t rank;
      size_t pos;
      int32_t id;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> queue;
    auto consider = [&](size_t pos, size_t right) {
      const auto it = merges.find(key(sym[pos], sym[right]));
      if (it != merges.end()) queue.push({it->second.first, pos, it->second.second});
    };
    for (size_t i = 0; i + 1 < n; ++i) consider(i, i + 1);
    while (!queue.empty()) {
      const Cand top = queue.top();
      queue.pop();
      if (gone[top.pos] || next[top.pos] < 0) continue;
      const auto right = static_cast<size_t>(next[top.pos]);
      const auto it = merges.find(key(sym[top.pos], sym[right]));
      if (it == merges.end() || it->second.second != top.id) continue;
      sym[top.pos] = top.id;
      gone[right] = true;
      next[top.pos] = next[right];
      if (next[right] >= 0) prev[static_cast<size_t>(next[right])] = static_cast<ptrdiff_t>(top.pos);
      if (prev[top.pos] >= 0) consider(static_cast<size_t>(prev[top.pos]), top.pos);
      if (next[top.pos] >= 0) consider(top.pos, static_cast<size_t>(next[top.pos]));
    }
    size_t k = 0;
    for (size_t i = 0; i < n; ++i)
      if (!gone[i]) sym[k++] = sym[i];
    sym.resize(k);
  }

  void tokenize(std::u32string_view word, std::vector<int32_t>& ids) const override {
    if (word.empty()) return;
    if (ignore_merges) {
      const int32_t whole = find(unicode::encode_utf8(word));
      if (whole >= 0) {
        ids.push_back(whole);
        return;
      }
    }
    std::vector<int32_t> sym;
    bool pending_unk = false;  // an unknown run not yet emitted (fused)
    for (size_t i = 0; i < word.size(); ++i) {
      std::string s;
      if (i > 0) s += prefix;
      unicode::append_utf8(s, word[i]);
      if (i + 1 == word.size()) s += suffix;
      const int32_t id = find(s);
      if (id >= 0) {
        if (pending_unk) sym.push_back(unk), pending_unk = false;
        sym.push_back(id);
        continue;
      }
      if (byte_fallback) {
        std::vector<int32_t> bytes;
        for (unsigned char b : s) {
          char name[8];
          std::snprintf(name, sizeof name, "<0x%02X>", b);
          const int32_t bid = find(name);
          if (bid < 0) break;
          bytes.push_back(bid);
        }
        if (bytes.size() == s.size()) {
          sym.insert(sym.end(), bytes.begin(), bytes.end());
          continue;
        }
      }
      if (unk >= 0) {
        if (pending_unk && !fuse_unk) sym.push_back(unk);
        pending_unk = true;
      }
    }
    if (pending_unk) sym.push_back(unk);
    merge_all(sym);
    ids.insert(ids.end(), sym.begin(), sym.end());
  }

  std::vector<std::pair<std::string, int32_t>> vocabulary() const override { return {vocab.begin(), vocab.end()}; }
  int32_t unk_id() const override { return unk; }
};

std::string optional_string(const json& m, const char* key) {
  return m.contains(key) && m[key].is_string() ? m[key].get<std::string>() : std::string();
}

}  // namespace

std::unique_ptr<Model> make_bpe(const json& m, const std::string& what) {
  auto b = std::make_unique<Bpe>();
  auto bad = [&](const auto&... x) { fail("tokenizer file '", what, "': ", x...); };
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
    bad("BPE dropout is not supported (it makes tokenization random)");
  if (!m.contains("vocab") || !m["vocab"].is_object()) bad("BPE model has no \"vocab\" object");
  for (const auto& [tok, id] : m["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max())
      bad("vocab entry \"", tok, "\" has no valid id");
    b->vocab[tok] = static_cast<int32_t>(id.get<int64_t>());
  }
  b->prefix = optional_string(m, "continuing_subword_prefix");
  b->suffix = optional_string(m, "end_of_word_suffix");
  b->fuse_unk = m.value("fuse_unk", false);
  b->byte_fallback = m.value("byte_fallback", false);
  b->ignore_merges = m.value("ignore_merges", false);
  const std::string unk = optional_string(m, "unk_token");
  if (!unk.empty()) {
    b->unk = b->find(unk);
    if (b->unk < 0) bad("unk_token \"", unk, "\" is not in the vocab");
  }
  int32_t rank = 0;
  for (const json& e : m.value("merges", json::array())) {
    std::string a, c;
    if (e.is_string()) {  // "a b" (files before tokenizers 0.20)
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) bad("merge \"", s, "\" is not two tokens");
      a = s.substr(0, sp), c = s.substr(sp + 1);
    } else {
      if (!e.is_array() || e.size() != 2) bad("merge ", e.dump(), " is not two tokens");
      a = e[0].get<std::string>(), c = e[1].get<std::string>();
    }
    const int32_t ia = b->find(a), ic = b->find(c);
    const std::string joined = a + (b->prefix.empty() || !c.starts_with(b->prefix) ? c : c.substr(b->prefix.size()));
    const int32_t ij = b->find(joined);
    if (ia < 0 || ic < 0 || ij < 0) bad("merge \"", a, " ", c, "\" names a token not in the vocab");
    b->merges.insert_or_assign(Bpe::key(ia, ic), std::pair{rank++, ij});  // a repeated pair takes its last rank
  }
  return b;
}

}  // namespace anatomy::tok
