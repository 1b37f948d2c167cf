#include "data/masked_lm.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "core/rng.h"
#include "data/tokenizer.h"
#include "data/unicode.h"
#include "io/read_file.h"

namespace anatomy {

MaskingOptions masking_for(const Tokenizer& tok, const std::string& dir, double probability, uint64_t seed) {
  MaskingOptions o;
  o.probability = probability;
  o.seed = seed;
  o.vocab_size = static_cast<int64_t>(tok.vocab_size());
  for (const char* name : {"[MASK]", "<mask>"})
    if (o.mask_id < 0) o.mask_id = tok.token_to_id(name);
  ANATOMY_CHECK(o.mask_id >= 0, "--task mlm: the tokenizer in ", dir, " has no mask token ([MASK] or <mask>)");
  for (int32_t id : {tok.cls_id(), tok.sep_id(), tok.pad_id(), o.mask_id})
    if (id >= 0) o.special.push_back(id);
  return o;
}

MaskingOptions validation_masking(MaskingOptions o) {
  o.seed = mix64(o.seed + 1);
  return o;
}

int64_t mask_tokens(int32_t* ids, const int32_t* attention, int32_t* labels, int64_t T, uint64_t sample,
                    const MaskingOptions& o, int64_t epoch) {
  const uint64_t stream = o.seed ^ mix64(sample + 0x6d6c6dULL);
  Rng rng(mix64(epoch == 0 ? stream : stream ^ mix64(static_cast<uint64_t>(epoch) * 0x9e3779b97f4a7c15ULL)));
  int64_t scored = 0;
  for (int64_t t = 0; t < T; ++t) {
    labels[t] = -100;
    if (!attention[t] || std::find(o.special.begin(), o.special.end(), ids[t]) != o.special.end()) continue;
    if (rng.uniform() >= o.probability) continue;
    labels[t] = ids[t];
    ++scored;
    const double u = rng.uniform();
    if (u < 0.8)
      ids[t] = o.mask_id;
    else if (u < 0.9)
      ids[t] = static_cast<int32_t>(rng.randint(0, o.vocab_size));
  }
  return scored;
}

MaskedLMDataset::MaskedLMDataset(std::shared_ptr<const Dataset> base, MaskingOptions o)
    : m_base(std::move(base)), m_opt(std::move(o)) {}

void MaskedLMDataset::get(size_t i, HostBatch& out, int64_t row) const {
  m_base->get(i, out, row);
  const size_t n = static_cast<size_t>(out.batch * out.seq);
  if (out.token_labels.size() != n) out.token_labels.assign(n, -100);
  const int64_t T = out.seq;
  mask_tokens(out.input_ids.data() + row * T, out.attention_mask.data() + row * T, out.token_labels.data() + row * T, T,
              i, m_opt, out.epoch);
  out.labels[static_cast<size_t>(row)] = 0;
}

bool is_lines_file(const std::string& path) {
  if (path.size() < 4) return false;
  std::string ext = path.substr(path.size() - 4);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".txt";
}

// The length of the line break at `p` (0: none): \n, \r\n or \r, Python's universal newlines.
static size_t line_break_at(std::string_view s, size_t p) {
  if (s[p] == '\r') return p + 1 < s.size() && s[p + 1] == '\n' ? 2 : 1;
  return s[p] == '\n' ? 1 : 0;
}

void for_each_line(std::string_view text, const std::function<void(std::string_view)>& fn) {
  size_t start = 0;
  for (size_t p = 0; p < text.size();) {
    const size_t brk = line_break_at(text, p);
    if (brk == 0) {
      ++p;
      continue;
    }
    fn(text.substr(start, p - start));
    p += brk;
    start = p;
  }
  if (start < text.size()) fn(text.substr(start));
}

LinesDataset::LinesDataset(const std::string& path, const Tokenizer& tok, int64_t max_length, bool keep_blank_lines)
    : m_max_length(max_length), m_pad(tok.pad_id()) {
  const std::string text = read_regular_file(path);
  for_each_line(text, [&](std::string_view line) {
    if (!keep_blank_lines && unicode::is_blank_text(line)) return;  // run_mlm.py: not line.isspace()
    const Encoding e = tok.encode(line, std::nullopt, static_cast<size_t>(max_length), Truncation::LongestFirst,
                                  Padding::None);
    m_ids.insert(m_ids.end(), e.input_ids.begin(), e.input_ids.end());
    m_offsets.push_back(m_ids.size());
  });
  ANATOMY_CHECK(size() > 0, path, ": no text (every line is empty)");
}

void LinesDataset::get(size_t i, HostBatch& out, int64_t row) const {
  const int64_t T = out.seq, len = static_cast<int64_t>(m_offsets[i + 1] - m_offsets[i]);
  ANATOMY_CHECK(len <= T, "internal error: line sample ", i, " has ", len, " tokens, more than the batch length ", T);
  for (int64_t t = 0; t < T; ++t) {
    const bool tok = t < len;
    out.input_ids[row * T + t] = tok ? m_ids[m_offsets[i] + static_cast<size_t>(t)] : m_pad;
    out.token_type_ids[row * T + t] = 0;
    out.attention_mask[row * T + t] = tok ? 1 : 0;
  }
  out.labels[static_cast<size_t>(row)] = 0;
}

GroupedTextsDataset::GroupedTextsDataset(size_t texts, const std::function<std::span<const int32_t>(size_t)>& text,
                                         int64_t block, const std::string& source, bool may_be_empty)
    : m_block(block) {
  const size_t B = static_cast<size_t>(block);
  std::vector<int32_t> group;
  for (size_t first = 0; first < texts; first += kTextsPerGroup) {
    group.clear();
    for (size_t i = first; i < std::min(texts, first + kTextsPerGroup); ++i) {
      const std::span<const int32_t> ids = text(i);
      group.insert(group.end(), ids.begin(), ids.end());
    }
    m_ids.insert(m_ids.end(), group.begin(), group.begin() + static_cast<std::ptrdiff_t>(group.size() / B * B));
  }
  ANATOMY_CHECK(size() > 0 || may_be_empty, source, ": its texts hold fewer tokens than one block of --max-seq-length ", block,
                " (run_mlm.py's grouping); lower --max-seq-length, or --line-by-line for a sample per text");
}

void GroupedTextsDataset::get(size_t i, HostBatch& out, int64_t row) const {
  const int64_t T = out.seq;
  ANATOMY_CHECK(T >= m_block, "internal error: a block of ", m_block, " tokens in a batch of length ", T);
  for (int64_t t = 0; t < T; ++t) {
    const bool real = t < m_block;
    out.input_ids[row * T + t] = real ? m_ids[i * static_cast<size_t>(m_block) + static_cast<size_t>(t)] : 0;
    out.token_type_ids[row * T + t] = 0;
    out.attention_mask[row * T + t] = real ? 1 : 0;
  }
  out.labels[static_cast<size_t>(row)] = 0;
}

std::vector<int64_t> LinesDataset::lengths() const {
  std::vector<int64_t> out(size());
  for (size_t i = 0; i < size(); ++i) out[i] = static_cast<int64_t>(m_offsets[i + 1] - m_offsets[i]);
  return out;
}

}  // namespace anatomy
