#!/usr/bin/env python3
"""The table of `scripts/device.sh fp8curves`: one row per run directory text_<model>_<lr>_<precision>_s<seed>
under DIR (bench/real_text.py's real_text.md and the run's metrics.jsonl), with the logged training loss at
10% / 50% / the end of the run and its mean over the last 10% of the logged points.

    python3 bench/fp8_curves_table.py DIR > DIR/fp8curves.md
"""
import glob
import json
import os
import re
import sys


def main():
    root = sys.argv[1]
    print("| model | precision | seed | steady samples/s | validation accuracy | validation loss | "
          "loss at 10% / 50% / end | mean loss, last 10% |")
    print("|---|---|---:|---:|---:|---:|---|---:|")
    for d in sorted(glob.glob(os.path.join(root, "text_*"))):
        m = re.match(r"text_(.+)_([0-9e.+-]+)_(bf16|fp8-e4m3|fp8)_s(\d+)$", os.path.basename(d))
        curves = glob.glob(os.path.join(d, "*.metrics.jsonl"))
        if not m or not curves:
            continue
        model, _, precision, seed = m.groups()
        row = next(l for l in open(os.path.join(d, "real_text.md")) if l.startswith(f"| {model} |")).split("|")
        train = [r for r in map(json.loads, open(curves[0])) if "loss" in r and "eval_loss" not in r]
        n = len(train)
        last = train[-max(1, n // 10):]
        print(f"| {model} | {precision} | {seed} | {row[4].strip()} | {row[6].strip()} | {row[7].strip()} | "
              f"{train[n // 10]['loss']:.3f} / {train[n // 2]['loss']:.3f} / {train[-1]['loss']:.3f} | "
              f"{sum(r['loss'] for r in last) / len(last):.4f} |")


if __name__ == "__main__":
    main()
