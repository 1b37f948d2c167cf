#!/usr/bin/env python3
"""Sum ncu's per-kernel durations (--metrics gpu__time_duration.sum --csv --print-units base) by kernel.

    python3 scripts/kernel_times.py KERNELS.csv

Prints the window's kernel count, its total GPU time, the training steps it spans (two AdamW
kernels a step: the decayed and the undecayed segments) and the time per step, then one row per
kernel name (its first 70 characters), largest total first. ncu runs the kernels one at a time,
so the sum is the GPU's busy time without overlap.
"""
import collections
import csv
import sys


def main():
    rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
    if not rows:
        sys.exit(f"{sys.argv[1]}: no ncu rows")
    head, rows = rows[0], rows[1:]
    name, value = head.index("Kernel Name"), head.index("Metric Value")
    total, count = collections.defaultdict(float), collections.Counter()
    for r in rows:
        try:
            ns = float(r[value].replace(",", ""))
        except ValueError:
            continue
        k = r[name][:70]
        total[k] += ns
        count[k] += 1
    n, busy = sum(count.values()), sum(total.values())
    steps = sum(c for k, c in count.items() if "adamw" in k.lower()) / 2
    per_step = f"; {steps:g} steps, {busy / steps / 1e3:.0f} us a step" if steps else ""
    print(f"{n} kernels, {busy / 1e3:.0f} us of GPU time{per_step}\n")
    print("| kernel | calls | us total | us each |\n|---|---:|---:|---:|")
    for k, ns in sorted(total.items(), key=lambda kv: -kv[1])[:30]:
        print(f"| `{k}` | {count[k]} | {ns / 1e3:.1f} | {ns / count[k] / 1e3:.2f} |")


if __name__ == "__main__":
    main()
