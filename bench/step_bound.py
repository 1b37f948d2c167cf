#!/usr/bin/env python3
"""How short the profiled step could be: each op at the device's measured ceilings.

    python3 bench/step_bound.py PROFILE_LOG [--baseline-sps S --batch B] [--clock-ratio R]

PROFILE_LOG: the output of `anatomy train ... --profile-steps N` (its per-op lines: calls, ms a
step, TFLOP/s, GB/s, and the "measured ceilings" line). An op's FLOPs and bytes are its time times
its rates; its floor is the longer of FLOPs at the matrix-product ceiling and bytes at the copy
ceiling. The sum of the floors bounds the step from below: no op can beat both ceilings, and the
ops run one after another on one stream. --baseline-sps with --batch: the step of another
trainer (samples/s), to say what ratio the floor would allow. --clock-ratio R: the matrix-product
ceiling scaled by R (the ceiling is measured in a short burst, on constant operands, at whatever
clock the device holds then; a run held at the power limit holds a lower one: R = the run's SM
clock / the ceiling's). Without it, a log that prints the SM clocks (anatomy on a GPU: "SM clock
(NVML): S MHz at the end of the profiled steps, C MHz after the ceilings") gives R = S / C.
"""
import argparse
import re
import sys

OP = re.compile(r"^\s+(\S.*?)\s{2,}(forward|backward|optimizer|data)\s+(\d+) calls\s+([\d.]+) ms\s+([\d.]+)\s+([\d.]+)\s*$")
CEIL = re.compile(r"measured ceilings: ([\d.]+) TFLOP/s .*?, ([\d.]+) GB/s")
STEP = re.compile(r"one step ([\d.]+) ms")
CLOCK = re.compile(r"SM clock \(NVML\): (\d+) MHz at the end of the profiled steps, (\d+) MHz after the ceilings")


def parse(path):
    ops, ceil, step, clocks = [], None, None, None
    with open(path) as f:
        for line in f:
            if (m := CLOCK.search(line)):
                clocks = (int(m.group(1)), int(m.group(2)))
            if (m := OP.match(line)):
                name, phase, calls, ms, tflops, gbps = m.groups()
                ops.append(dict(name=name, phase=phase, calls=int(calls), ms=float(ms),
                                flop=float(ms) * 1e-3 * float(tflops) * 1e12, byte=float(ms) * 1e-3 * float(gbps) * 1e9))
            elif (m := CEIL.search(line)):
                ceil = (float(m.group(1)) * 1e12, float(m.group(2)) * 1e9)
            elif (m := STEP.search(line)) and step is None:
                step = float(m.group(1))
    if not ops or not ceil:
        sys.exit(f"step_bound.py: {path}: no per-op lines or no 'measured ceilings' line (a --profile-steps log?)")
    return ops, ceil, step, clocks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log")
    ap.add_argument("--baseline-sps", type=float, help="the other trainer's steady samples/s")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--clock-ratio", type=float, help="default: the log's SM clocks (steps / ceilings), else 1")
    ap.add_argument("--top", type=int, default=12, help="ops listed one by one (the rest summed)")
    a = ap.parse_args()
    ops, (flops, bw), step, clocks = parse(a.log)
    ratio, why = a.clock_ratio, "given"
    if ratio is None:
        ratio, why = (clocks[0] / clocks[1], f"the log's SM clocks, {clocks[0]} / {clocks[1]} MHz") if clocks else (1.0, "")
    flops *= ratio
    for o in ops:
        o["floor"] = max(o["flop"] / flops, o["byte"] / bw) * 1e3
        o["bound"] = "matrix" if o["flop"] / flops >= o["byte"] / bw else "bytes"
    ops.sort(key=lambda o: o["ms"] - o["floor"], reverse=True)
    total = sum(o["ms"] for o in ops)
    floor = sum(o["floor"] for o in ops)
    scaled = f", scaled by {ratio:.3f}: {why}" if ratio != 1 else ""
    print(f"Ceilings: {flops / 1e12:.0f} TFLOP/s (matrix product{scaled}),"
          f" {bw / 1e9:.0f} GB/s (copy). Ops sorted by the time they spend above their floor.\n")
    print("| op | phase | calls | ms a step | floor ms | bound by | above the floor ms |")
    print("|---|---|---:|---:|---:|---|---:|")
    for o in ops[:a.top]:
        print(f"| {o['name']} | {o['phase']} | {o['calls']} | {o['ms']:.3f} | {o['floor']:.3f} | {o['bound']} |"
              f" {o['ms'] - o['floor']:.3f} |")
    rest = ops[a.top:]
    if rest:
        print(f"| {len(rest)} more | | | {sum(o['ms'] for o in rest):.3f} | {sum(o['floor'] for o in rest):.3f} | |"
              f" {sum(o['ms'] - o['floor'] for o in rest):.3f} |")
    print(f"| **all ops** | | | **{total:.2f}** | **{floor:.2f}** | | **{total - floor:.2f}** |")
    print()
    if step:
        print(f"- the profiled step: {step:.2f} ms, its ops {total:.2f} ms; at the floors the ops take {floor:.2f} ms"
              f" ({100 * floor / total:.0f}% of now)")
    if a.baseline_sps:
        base = a.batch / a.baseline_sps * 1e3
        print(f"- the baseline's step: {base:.1f} ms ({a.baseline_sps:.1f} samples/s at batch {a.batch}); at the floors"
              f" the ratio could reach {base / floor:.2f}x (now {base / (step or total):.2f}x by the profiled step)")


if __name__ == "__main__":
    main()
