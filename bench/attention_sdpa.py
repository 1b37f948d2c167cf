#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention at the shapes of tools/bench_attention.cpp.

bert-large attention by default: B in (32, 4), T 512, 16 heads, head_dim 64, bf16, dropout 0.1 and 0,
timed with torch.cuda.Event after a warm-up (median of --reps calls), the same markdown table
as anatomy_bench_attention. FLOPs: forward 4*B*h*T^2*D, backward 2.5x forward.

q, k, v are strided views of one packed [B, T, 3*H] tensor, as BERT (and our engine) lay them
out. The key padding mask is all ones, which is no mask at all: the flash backend takes no mask
argument, so none is passed (a boolean mask would select another backend). The forward+backward
time is a forward followed by torch.autograd.grad on the three inputs; bwd = (fwd+bwd) - fwd.
The backend is forced with torch.nn.attention.sdpa_kernel (FLASH_ATTENTION by default, --backend
to change), and the CUDA kernels that one call launched are listed from the profiler, so the
table says which implementation ran.

    python3 bench/attention_sdpa.py [--batch 32 --batch 4] [--seq 512 --seq 128] [--head-dim 64 --head-dim 32]
                                    [--heads 16] [--reps 50] [--backend flash|efficient|cudnn|math]
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


def make_inputs(batch, seq, heads, head_dim, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = heads * head_dim
    qkv = (torch.rand(batch, seq, 3 * h, device="cuda", generator=g, dtype=torch.float32) * 5.0 - 2.5).to(dtype)
    dout = (torch.rand(batch, heads, seq, head_dim, device="cuda", generator=g, dtype=torch.float32) * 2.0 - 1.0).to(dtype)

    def view(i):  # [B, T, H] slice -> [B, heads, T, D] strided view (no copy)
        return qkv[:, :, i * h:(i + 1) * h].unflatten(-1, (heads, head_dim)).transpose(1, 2)

    q, k, v = (view(i).detach().requires_grad_() for i in range(3))
    return q, k, v, dout


def time_ms(fn, reps, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def kernels_of(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = sorted({e.name for e in prof.events() if str(e.device_type).endswith("CUDA")})
    return [n for n in names if any(s in n.lower() for s in ("flash", "fmha", "attention", "attn", "sdpa", "cudnn"))] or names


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, action="append", help="batch sizes (repeatable); default 32 and 4")
    ap.add_argument("--seq", type=int, action="append", help="sequence lengths (repeatable); default 512")
    ap.add_argument("--head-dim", type=int, action="append", help="head dims (repeatable); default 64")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--backend", choices=sorted(BACKENDS), default="flash")
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    batches = args.batch or [32, 4]
    shapes = [(b, t, d) for d in (args.head_dim or [64]) for t in (args.seq or [512]) for b in batches]
    heads = args.heads

    rows, kernels = [], {}
    for batch, seq, head_dim in shapes:
        for p in (0.1, 0.0):
            sets = [make_inputs(batch, seq, heads, head_dim, dtype, 1234 + s) for s in range(2)]  # two input sets
            state = {"i": 0}

            def fwd():
                q, k, v, _ = sets[state["i"] % 2]
                state["i"] += 1
                return F.scaled_dot_product_attention(q, k, v, dropout_p=p)

            def fwd_bwd():
                q, k, v, dout = sets[state["i"] % 2]
                state["i"] += 1
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
                return torch.autograd.grad(out, (q, k, v), dout)

            with sdpa_kernel(BACKENDS[args.backend]):
                with torch.no_grad():
                    fwd_ms = time_ms(fwd, args.reps, args.warmup)
                both_ms = time_ms(fwd_bwd, args.reps, args.warmup)
                kernels[(batch, seq, head_dim, p)] = kernels_of(fwd_bwd)
            rows.append((batch, seq, head_dim, p, fwd_ms, both_ms))

    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}, "
          f"no mask (= a key padding mask of all ones); median of {args.reps} calls. "
          "FLOPs: forward 4*B*h*T^2*D, backward 2.5x forward; bwd = (fwd+bwd) - fwd.")
    print(f"SDPA backend forced: {args.backend}; CUDA kernels of one forward+backward:")
    for (batch, seq, head_dim, p), names in kernels.items():
        print(f"  B={batch} T={seq} D={head_dim} p={p}: " + ", ".join(names))
    print()
    print("| impl | B | T | heads | D | dropout | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | fwd+bwd ms | "
          "fwd+bwd TFLOP/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for batch, seq, head_dim, p, fwd_ms, both_ms in rows:
        fl = 4.0 * batch * heads * seq * seq * head_dim
        bwd_ms = both_ms - fwd_ms
        print(f"| torch sdpa ({args.backend}) | {batch} | {seq} | {heads} | {head_dim} | {p:.1f} | {fwd_ms:.3f} | "
              f"{fl / fwd_ms / 1e9:.1f} | {bwd_ms:.3f} | {2.5 * fl / bwd_ms / 1e9:.1f} | {both_ms:.3f} | "
              f"{3.5 * fl / both_ms / 1e9:.1f} |")


if __name__ == "__main__":
    main()
