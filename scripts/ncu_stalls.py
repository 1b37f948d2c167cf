#!/usr/bin/env python3
"""Where a kernel's warps wait, from Nsight Compute's source page as CSV (plain or .xz), as
scripts/device.sh ncuattn writes it (`ncu -i R --page source --csv --print-source sass`):

  python3 scripts/ncu_stalls.py ncu_attn_bwd_sass.csv.xz [--top 30] [--kernel 0]

Prints the warp-state samples of the kernel's instructions summed by stall reason, then the
samples of each stretch of code between CTA-wide barriers (BAR.SYNC ... 0x0), the barrier in
the stretch it ends, and the instructions with the most samples (their two main reasons).
"""
import argparse
import collections
import csv
import io
import lzma


def load(path):
    text = lzma.open(path, "rt").read() if path.endswith(".xz") else open(path).read()
    kernels, cur = [], None
    for row in csv.reader(io.StringIO(text)):
        if row and row[0] == "Kernel Name":
            cur = {"name": row[1], "rows": []}
            kernels.append(cur)
        elif row and row[0] == "Address" and cur is not None:
            cur["hdr"] = row
        elif cur is not None and row:
            cur["rows"].append(row)
    return kernels


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--kernel", type=int, default=0)
    args = ap.parse_args()
    k = load(args.csv)[args.kernel]
    idx = {h: i for i, h in enumerate(k["hdr"])}
    reasons = [h for h in k["hdr"] if h.startswith("stall_") and "Not Issued" not in h]
    samples = idx["Warp Stall Sampling (All Samples)"]
    rows = k["rows"]
    total = sum(num(r[samples]) for r in rows) or 1.0
    print(k["name"][:150])
    by_reason = collections.Counter()
    for r in rows:
        for h in reasons:
            by_reason[h] += num(r[idx[h]])
    print(f"{total:.0f} samples: " + ", ".join(f"{h[6:]} {100 * v / total:.1f}%" for h, v in by_reason.most_common(12)))

    print("\nstretches between CTA barriers (first address .. barrier): share of samples")
    start, acc = 0, 0.0
    base = int(rows[0][0], 16)
    for i, r in enumerate(rows):
        acc += num(r[samples])
        if "BAR.SYNC" in r[1] and r[1].rstrip().endswith("0x0") or i == len(rows) - 1:
            print(f"  {int(rows[start][0], 16) - base:06x} .. {int(r[0], 16) - base:06x}  {100 * acc / total:5.1f}%")
            start, acc = i + 1, 0.0

    print(f"\ntop {args.top} instructions (offset, samples, share, instruction, main reasons)")
    for r in sorted(rows, key=lambda r: -num(r[samples]))[: args.top]:
        main_reasons = sorted(((num(r[idx[h]]), h[6:]) for h in reasons), reverse=True)[:2]
        why = " ".join(f"{h}:{v:.0f}" for v, h in main_reasons if v > 0)
        print(f"  {int(r[0], 16) - base:06x} {num(r[samples]):6.0f} {100 * num(r[samples]) / total:4.1f}%  {r[1].strip()[:60]:60s} {why}")


if __name__ == "__main__":
    main()
