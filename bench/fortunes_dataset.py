#!/usr/bin/env python3
"""A text-classification dataset of real English of varied length, from text Debian ships.

    python3 bench/fortunes_dataset.py OUT_DIR [--topics 12] [--fortunes-dir /usr/share/games/fortunes]

Each quotation of the `fortunes` package (apt-get install fortunes) is one sample; the file it
comes from (its topic: people, definitions, computers, ...) is its label. The --topics largest
topic files are taken. Lines of a quotation are joined with single spaces. One in ten samples of
each topic (a fixed shuffle) goes to validation. Writes OUT_DIR/train.jsonl and
OUT_DIR/validation.jsonl ({"text": ..., "label": topic}) and prints the counts and a histogram
of lengths in words (bench/real_text.py prints the one in WordPiece tokens).
"""
import argparse
import json
import os
import random


def quotations(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        block = []
        for line in f:
            if line.rstrip("\n") == "%":
                text = " ".join(" ".join(block).split())
                if text:
                    yield text
                block = []
            else:
                block.append(line.strip())
        text = " ".join(" ".join(block).split())
        if text:
            yield text


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--topics", type=int, default=12)
    ap.add_argument("--fortunes-dir", default="/usr/share/games/fortunes")
    args = ap.parse_args()
    if not os.path.isdir(args.fortunes_dir):
        raise SystemExit(f"{args.fortunes_dir}: not found (apt-get install fortunes)")
    files = [f for f in os.listdir(args.fortunes_dir)
             if os.path.isfile(os.path.join(args.fortunes_dir, f)) and "." not in f]
    by_topic = {f: list(quotations(os.path.join(args.fortunes_dir, f))) for f in files}
    topics = sorted(by_topic, key=lambda t: (-len(by_topic[t]), t))[:args.topics]
    rng = random.Random(0)
    train, valid = [], []
    for t in sorted(topics):
        samples = by_topic[t][:]
        rng.shuffle(samples)
        n_valid = len(samples) // 10
        valid += [{"text": s, "label": t} for s in samples[:n_valid]]
        train += [{"text": s, "label": t} for s in samples[n_valid:]]
    rng.shuffle(train)
    rng.shuffle(valid)
    os.makedirs(args.out, exist_ok=True)
    for name, rows in (("train", train), ("validation", valid)):
        with open(os.path.join(args.out, f"{name}.jsonl"), "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    words = sorted(len(r["text"].split()) for r in train + valid)
    print(f"{len(train)} train + {len(valid)} validation samples, {len(topics)} topics: " +
          ", ".join(f"{t} {len(by_topic[t])}" for t in topics))
    print(f"words per sample: mean {sum(words) / len(words):.1f}, median {words[len(words) // 2]}, max {words[-1]}")
    edges = [8, 16, 32, 64, 128, 256]
    lo = 0
    for hi in edges + [None]:
        n = sum(1 for w in words if w >= lo and (hi is None or w < hi))
        print(f"  {lo:>4}-{'' if hi is None else hi - 1:<4} words: {n}")
        lo = hi if hi is not None else lo


if __name__ == "__main__":
    main()
