"""How the half-precision GELU (Note [GELU in half precision], src/ops/cuda/gelu.cuh) rounds.

Over every finite bf16 value |x| < 1e4, emulates in fp32 steps the kernels' Abramowitz & Stegun
erf, in the kernels' form (x * (0.5 erf + 0.5); the gradient factor x phi + Phi), and the erff
formula (erf correctly rounded to fp32), and counts the inputs whose GELU and GELU gradient factor
round differently to bf16 and to fp16 (fp16 over the same bf16 inputs). An emulation, not the
GPU: numpy rounds each step (the kernels fuse multiply-adds) and uses exact reciprocal and exp2
where the kernels use rcp.approx and ex2.approx. Needs numpy (.venv after scripts/setup.sh).
"""
import math

import numpy as np

f = np.float32


def as_erf(z):
    """erf(z) and exp(-z^2) as the kernel makes them (fp32 steps)."""
    t = (f(1) / (f(0.3275911) * np.abs(z) + f(1))).astype(f)
    p = t * f(1.061405429) + f(-1.453152027)
    for c in (1.421413741, -0.284496736, 0.254829592):
        p = (p * t + f(c)).astype(f)
    p = (p * t).astype(f)
    e = np.exp2(-(z * z) * f(1.4426950408889634)).astype(f)
    return np.copysign(f(1) - p * e, z).astype(f), e


def bf16(v):
    b = np.asarray(v, dtype=f).copy().view(np.uint32)
    b = ((b + ((b >> 16) & 1) + 0x7FFF) >> 16) << 16
    return b.view(f)


def main():
    x = (np.arange(65536, dtype=np.uint32) << 16).astype(np.uint32).view(f)
    x = x[np.isfinite(x) & (np.abs(x) < 1e4)]
    z = (x * f(0.70710678118654752440)).astype(f)
    erf, e = as_erf(z)
    ref_erf = np.vectorize(math.erf)(z.astype(np.float64)).astype(f)
    cdf = (f(0.5) * erf + f(0.5)).astype(f)
    ours = {"gelu": (x * cdf).astype(f),
            "gelu'": (x * (f(0.3989422804014327) * e).astype(f) + cdf).astype(f)}
    ref = {"gelu": (f(0.5) * x * (f(1) + ref_erf)).astype(f),
           "gelu'": (f(0.5) * (f(1) + ref_erf) + x * (f(0.3989422804014327) * np.exp(f(-0.5) * x * x)).astype(f)).astype(f)}
    for name in ours:
        for kind, rnd in (("bf16", bf16), ("fp16", lambda v: np.asarray(v, dtype=f).astype(np.float16))):
            a, b = rnd(ours[name]), rnd(ref[name])
            live = np.isfinite(b)
            diff = np.where((a != b) & live)[0]
            print(f"{name:6} {kind}: {len(diff)} of {live.sum()} inputs round differently from the erff formula"
                  + (f" (x = {', '.join(f'{v:g}' for v in x[diff][:4])}{', ...' if len(diff) > 4 else ''})" if len(diff) else ""))


if __name__ == "__main__":
    main()
