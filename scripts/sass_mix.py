#!/usr/bin/env python3
"""Static instruction mix of the kernels in `cuobjdump -sass` output (stdin) whose names match
a regular expression: per kernel, the instruction count and its most frequent opcodes.

  cuobjdump -sass BINARY | python3 scripts/sass_mix.py 'wgmma_fwd_kernel'
"""
import collections
import re
import sys


def main():
    pattern = re.compile(sys.argv[1] if len(sys.argv) > 1 else ".")
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 14
    name, ops = None, collections.Counter()

    def flush():
        if name and pattern.search(name):
            total = sum(ops.values())
            mix = ", ".join(f"{op} {n}" for op, n in ops.most_common(top))
            print(f"{total:6d}  {name[:160]}\n        {mix}")

    for line in sys.stdin:
        m = re.match(r"\s+Function : (\S+)", line)
        if m:
            flush()
            name, ops = m.group(1), collections.Counter()
            continue
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m and name:
            ops[m.group(1).split(".")[0]] += 1
    flush()


if __name__ == "__main__":
    main()
