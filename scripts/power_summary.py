#!/usr/bin/env python3
"""Summarizes nvidia-smi samples taken while one side of a benchmark ran (scripts/device.sh power).

    python3 scripts/power_summary.py NAME=FILE.csv ...   -> a Markdown table

Each CSV line (no header, no units): timestamp, SM clock MHz, max SM clock MHz, power W, power
limit W, temperature C, clock event reasons (a hex bit mask). Only the busy samples count: power
at least half the limit (the side's steady training, not its start-up or its exit). Bits of the
mask (NVML's clocks event reasons): 0x4 software power cap, 0x8 hardware slowdown, 0x20 software
thermal slowdown, 0x40 hardware thermal slowdown, 0x80 hardware power brake.
"""
import statistics
import sys

BITS = {0x4: "power cap", 0x8: "hw slowdown", 0x20: "sw thermal", 0x40: "hw thermal", 0x80: "power brake"}


def rows(path):
    out = []
    with open(path) as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) < 7:
                continue
            try:
                clock, max_clock, power, limit, temp = (float(p) for p in parts[1:6])
                mask = int(parts[6], 16)
            except ValueError:
                continue
            out.append((clock, max_clock, power, limit, temp, mask))
    return out


def summary(name, samples):
    busy = [s for s in samples if s[2] >= 0.5 * s[3]]
    if not busy:
        return f"| {name} | {len(samples)} | 0 | - | - | - | - | - | - |"
    clocks = [s[0] for s in busy]
    power = [s[2] for s in busy]
    reasons = []
    for bit, label in BITS.items():
        share = sum(1 for s in busy if s[5] & bit) / len(busy)
        if share > 0:
            reasons.append(f"{label} {100 * share:.0f}%")
    return (f"| {name} | {len(samples)} | {len(busy)} | {statistics.median(clocks):.0f} | {min(clocks):.0f}"
            f" | {busy[0][1]:.0f} | {statistics.median(power):.0f} | {busy[0][3]:.0f}"
            f" | {statistics.median(s[4] for s in busy):.0f} | {', '.join(reasons) or 'none'} |")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print("| side | samples | busy samples | SM clock median MHz | lowest | max SM clock | power median W | "
          "limit W | temperature C | clock event reasons (share of busy samples) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for arg in sys.argv[1:]:
        name, _, path = arg.partition("=")
        print(summary(name, rows(path)))


if __name__ == "__main__":
    main()
